package devicelist

import (
	"errors"
	"strings"
	"testing"
)

// Other servers' device keys are kept as sent: only what protects this
// server is checked.
func TestCheckRemoteDeviceKeys(t *testing.T) {
	const user, device = "@bob:remote.test", "B1"
	good := []struct{ in, want string }{
		// As test tools send them: placeholder values, no signatures.
		{`{"user_id":"@bob:remote.test","device_id":"B1","keys":{"ed25519:B1":"x"}}`,
			`{"device_id":"B1","keys":{"ed25519:B1":"x"},"user_id":"@bob:remote.test"}`},
		// Missing or null user_id and device_id are filled in; unsigned dropped.
		{`{"keys":{},"user_id":null,"unsigned":{"device_display_name":"p"}}`,
			`{"device_id":"B1","keys":{},"user_id":"@bob:remote.test"}`},
	}
	for _, c := range good {
		got, err := checkRemoteDeviceKeys(user, device, []byte(c.in))
		if err != nil || string(got) != c.want {
			t.Errorf("%s: %s, %v; want %s", c.in, got, err, c.want)
		}
	}
	bad := []string{
		`[]`, `"keys"`, `{`, ``,
		`{"user_id":"@bob:remote.test","device_id":"B2"}`,
		`{"user_id":"@bob:remote.test","device_id":7}`,
		`{"user_id":"@bob:remote.test","device_id":"B1","pad":"` + strings.Repeat("a", maxRemoteDeviceKeyBytes) + `"}`,
	}
	for _, in := range bad {
		if _, err := checkRemoteDeviceKeys(user, device, []byte(in)); err == nil {
			t.Errorf("%.60s: accepted", in)
		}
	}
	if _, err := checkRemoteDeviceKeys(user, device, []byte(`{"user_id":"@eve:remote.test"}`)); !errors.Is(err, errKeysOfOtherUser) {
		t.Errorf("another user's keys: %v, want errKeysOfOtherUser", err)
	}
}
