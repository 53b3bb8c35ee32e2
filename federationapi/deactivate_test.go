package federationapi_test

import (
	"net/http"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

// A deactivated user's devices are deleted on the other servers sharing a
// room too, through the same updates as any deletion.
func TestDeactivationReachesRemoteServers(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		p := newPair(t, db)
		second := p.a.Login(t, p.alice, "ALICE2")
		p.a.Upload(t, second, map[string]any{"device_keys": second.DeviceKeys(t)})
		eventually(t, "B to see the second device", func() bool {
			return sameSet(deviceIDs(t, p.b, p.bob, p.alice.UserID), "ALICE1", "ALICE2")
		})
		fetches := p.a.Requests.Count("GET", devicesPath)
		since := syncToken(t, p.b, p.bob)

		path := "/_matrix/client/v3/account/deactivate"
		r := p.a.Do(t, "POST", path, p.alice.Token, map[string]any{})
		session, _ := r.Body["session"].(string)
		if r.Status != http.StatusUnauthorized || session == "" {
			t.Fatalf("challenge: %d %s", r.Status, r.Raw)
		}
		p.a.Must(t, "POST", path, p.alice.Token, map[string]any{"auth": map[string]any{
			"type": "m.login.password", "identifier": map[string]any{"type": "m.id.user", "user": p.alice.UserID},
			"password": p.alice.Password, "session": session}})

		eventually(t, "B to see alice's devices deleted", func() bool {
			return sameSet(deviceIDs(t, p.b, p.bob, p.alice.UserID))
		})
		if !changedSince(t, p.b, p.bob, since)[p.alice.UserID] {
			t.Error("bob's /keys/changes on B does not list alice")
		}
		if n := p.a.Requests.Count("GET", devicesPath); n != fetches {
			t.Errorf("B fetched alice's list %d times instead of following the updates", n-fetches)
		}
	})
}
