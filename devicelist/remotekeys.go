package devicelist

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/matrix-org/gomatrixserverlib"
)

// maxRemoteDeviceKeyBytes bounds the keys of one device another server
// sends (a real device's keys, with a few cross-signing signatures, are
// well under 2 KiB).
const maxRemoteDeviceKeyBytes = 16 << 10

// errKeysOfOtherUser says remote keys name another user than the one
// they were sent for.
var errKeysOfOtherUser = errors.New("keys of another user")

// checkRemoteDeviceKeys checks the keys of a remote user's device, as its
// server sent them (in an m.device_list_update or a /user/devices answer),
// for what protects this server only: a JSON object within
// maxRemoteDeviceKeyBytes, for the user and device the envelope names. A
// missing (or null) user_id or device_id is filled in from the envelope;
// another user or device, or one that is not a string, is refused. Nothing
// else is checked, neither the key names and values nor the signatures:
// clients check every key they use themselves, and a server that
// refused what another server's clients uploaded would only hide those
// devices from its users. It returns the keys as canonical JSON without
// "unsigned", the form they are stored and served in.
func checkRemoteDeviceKeys(userID, deviceID string, raw json.RawMessage) ([]byte, error) {
	t := bytes.TrimSpace(raw)
	if len(t) > maxRemoteDeviceKeyBytes {
		return nil, fmt.Errorf("keys of %d bytes, more than the %d accepted", len(t), maxRemoteDeviceKeyBytes)
	}
	if len(t) == 0 || t[0] != '{' {
		return nil, errors.New("keys are not a JSON object")
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(t, &obj); err != nil {
		return nil, fmt.Errorf("keys are not a JSON object: %w", err)
	}
	for _, f := range []struct{ name, want string }{{"user_id", userID}, {"device_id", deviceID}} {
		v, ok := obj[f.name]
		if !ok || string(bytes.TrimSpace(v)) == "null" {
			js, err := json.Marshal(f.want)
			if err != nil {
				return nil, err
			}
			obj[f.name] = js
			continue
		}
		var got string
		if err := json.Unmarshal(v, &got); err != nil {
			return nil, fmt.Errorf("keys.%s is not a string", f.name)
		}
		if got != f.want && f.name == "user_id" {
			return nil, fmt.Errorf("%w: keys of %q, not %q", errKeysOfOtherUser, got, f.want)
		}
		if got != f.want {
			return nil, fmt.Errorf("keys are for device %q, not %q", got, f.want)
		}
	}
	delete(obj, "unsigned")
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	return gomatrixserverlib.CanonicalJSON(b)
}
