package federationapi_test

import (
	"net/http"
	"sync"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

// toolDevice is a device of a peer's user as test tools describe it: keys
// of any shape (placeholders, no signatures, no user_id), and a name.
type toolDevice struct {
	keys map[string]any
	name string
}

// toolUser is a peer user's device list, which the peer answers
// /user/devices from; down makes it answer 400 instead.
type toolUser struct {
	mu      sync.Mutex
	stream  int64
	devices map[string]toolDevice
	down    bool
}

func (u *toolUser) answer(userID string) (int, any) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.down {
		return http.StatusBadRequest, map[string]any{"errcode": "M_UNKNOWN", "error": "down"}
	}
	devices := []any{}
	for id, d := range u.devices {
		dev := map[string]any{"device_id": id, "keys": d.keys}
		if d.name != "" {
			dev["device_display_name"] = d.name
		}
		devices = append(devices, dev)
	}
	return http.StatusOK, map[string]any{"user_id": userID, "stream_id": u.stream, "devices": devices}
}

func (u *toolUser) set(stream int64, devices map[string]toolDevice, down bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.stream, u.devices, u.down = stream, devices, down
}

func deviceListEDU(content map[string]any) map[string]any {
	return map[string]any{"edu_type": "m.device_list_update", "content": content}
}

// queriedDevices is what /keys/query answers for a user's devices.
func queriedDevices(t *testing.T, n *testutil.Node, u *testutil.User, userID string) map[string]any {
	t.Helper()
	r := query(t, n, u, map[string][]string{userID: {}}, 10000)
	d := devicesOf(t, r, userID)
	if d == nil {
		t.Fatalf("no device_keys for %s: %v", userID, r)
	}
	return d
}

func displayNameOf(v any) any {
	m, _ := v.(map[string]any)
	u, _ := m["unsigned"].(map[string]any)
	return u["device_display_name"]
}

// A peer made from gomatrixserverlib sends device-list updates and
// answers /user/devices the way the ecosystem's test tools do: keys
// {"device_keys": {}} or keys without user_id, placeholders, no
// signatures, key IDs that are not the device ID. The daemon keeps and
// serves them as sent, in either validation mode: an update is visible to
// /keys/query as soon as /send returned; a missing prev_id resyncs the
// user; a remote that cannot be reached leaves the cached list as it was;
// a deleted device disappears; a user with no cached list is fetched on
// query; leaving and rejoining the room resyncs. Keys naming another user
// or device than the update are refused.
func TestToolShapedRemoteDeviceLists(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		for _, strict := range []bool{true, false} {
			mode := map[bool]string{true: "strict", false: "lax"}[strict]
			t.Run(mode, func(t *testing.T) {
				d := db
				if !strict {
					d = emptyDatabaseLikeFed(t, db)
				}
				n := testutil.StartNode(t, d, func(c *config.Config) { c.Keys.StrictValidation = strict })
				alice := n.Register(t, "alice", "")
				p := newGmslPeer(t, gomatrixserverlib.RoomVersionV10)
				creator := &toolUser{}
				creator.set(1, map[string]toolDevice{"random_device_id": {keys: map[string]any{"device_keys": map[string]any{}}}}, false)
				p.answerDevices(func(userID string) (int, any) {
					if userID == p.creator {
						return creator.answer(userID)
					}
					// sytest's "no remote cache" user: two devices.
					return http.StatusOK, map[string]any{"user_id": userID, "stream_id": 1, "devices": []any{
						map[string]any{"device_id": "random_device_id1", "keys": map[string]any{"device_keys": map[string]any{}}},
						map[string]any{"device_id": "random_device_id2", "keys": map[string]any{"device_keys": map[string]any{}}},
					}}
				})
				joinPeerRoom(t, n, alice, p)

				// sytest: "Server correctly handles incoming m.device_list_update".
				p.sendEDUs(t, n, deviceListEDU(map[string]any{"user_id": p.creator, "device_id": "random_device_id", "stream_id": 1,
					"keys": map[string]any{"device_keys": map[string]any{}}}))
				got := queriedDevices(t, n, alice, p.creator)
				want := map[string]any{"user_id": p.creator, "device_id": "random_device_id", "device_keys": map[string]any{}}
				if len(got) != 1 || testutil.Canonical(t, got["random_device_id"]) != testutil.Canonical(t, want) {
					t.Fatalf("after the first update: %v", got)
				}
				fetches := p.served("user_devices")
				creator.set(2, map[string]toolDevice{"random_device_id": {keys: map[string]any{"device_keys": map[string]any{}}, name: "test display name"}}, false)
				p.sendEDUs(t, n, deviceListEDU(map[string]any{"user_id": p.creator, "device_id": "random_device_id",
					"device_display_name": "test display name", "prev_id": []int64{1}, "stream_id": 2,
					"keys": map[string]any{"device_keys": map[string]any{}}}))
				got = queriedDevices(t, n, alice, p.creator)
				if displayNameOf(got["random_device_id"]) != "test display name" {
					t.Fatalf("after the second update: %v", got)
				}
				if p.served("user_devices") != fetches {
					t.Fatal("an update in sequence caused a resync")
				}

				// Another device with test tools' keys: no user_id, a key ID
				// that is not the device ID, placeholder values, no signatures.
				toolKeys := map[string]any{"device_id": "TOOLDEV", "algorithms": []string{"fast", "and broken"},
					"keys": map[string]any{"ed25519:test": "ed_key", "c": "sharp"}}
				p.sendEDUs(t, n, deviceListEDU(map[string]any{"user_id": p.creator, "device_id": "TOOLDEV", "prev_id": []int64{2}, "stream_id": 3,
					"keys": toolKeys}))
				got = queriedDevices(t, n, alice, p.creator)
				toolWant := map[string]any{"user_id": p.creator, "device_id": "TOOLDEV", "algorithms": toolKeys["algorithms"], "keys": toolKeys["keys"]}
				if len(got) != 2 || testutil.Canonical(t, got["TOOLDEV"]) != testutil.Canonical(t, toolWant) {
					t.Fatalf("after a device with placeholder keys: %v", got)
				}
				creator.set(3, map[string]toolDevice{
					"random_device_id": {keys: map[string]any{"device_keys": map[string]any{}}, name: "test display name"},
					"TOOLDEV":          {keys: toolKeys},
				}, false)

				// sytest: "If a device list update goes missing, the server
				// resyncs on the next one". Stream 4 is never sent.
				newKeys := map[string]any{"user_id": p.creator, "device_id": "random_device_id", "algorithms": []string{"m.olm.v1.curve25519-aes-sha2"},
					"keys":       map[string]any{"curve25519:JJQDHPZKYD": "MAtX5CLJXvHJ4wjvMBwc53+NnMceHiFch5r4mxOnOCA", "ed25519:JJQDHPZKYD": "LOu9tc6Sg7+mCEu3elrps3IiiotpefyaNnScTpSRQbU"},
					"signatures": map[string]any{}}
				creator.set(5, map[string]toolDevice{"random_device_id": {keys: newKeys, name: "New device name"}, "TOOLDEV": {keys: toolKeys}}, false)
				fetches = p.served("user_devices")
				p.sendEDUs(t, n, deviceListEDU(map[string]any{"user_id": p.creator, "device_id": "random_device_id",
					"device_display_name": "New device name", "prev_id": []int64{4}, "stream_id": 5,
					"keys": map[string]any{"device_keys": map[string]any{}}}))
				got = queriedDevices(t, n, alice, p.creator)
				if testutil.Canonical(t, got["random_device_id"]) != testutil.Canonical(t, newKeys) || displayNameOf(got["random_device_id"]) != "New device name" {
					t.Fatalf("after a missing update: %v", got)
				}
				if p.served("user_devices") != fetches+1 {
					t.Fatalf("%d fetches after a missing update, want 1", p.served("user_devices")-fetches)
				}

				// Keys naming another device or user than the update: refused,
				// and the user resynced (the list stays the server's).
				for _, keys := range []map[string]any{{"device_id": "OTHER"}, {"user_id": "@mallory:" + p.Name}, {"user_id": 5}} {
					p.sendEDUs(t, n, deviceListEDU(map[string]any{"user_id": p.creator, "device_id": "BADDEV", "prev_id": []int64{5}, "stream_id": 6, "keys": keys}))
					if got := queriedDevices(t, n, alice, p.creator); got["BADDEV"] != nil || got["OTHER"] != nil || len(got) != 2 {
						t.Fatalf("keys %v accepted: %v", keys, got)
					}
				}

				// sytest: "Device list doesn't change if remote server is down".
				before := testutil.Canonical(t, queriedDevices(t, n, alice, p.creator))
				creator.set(0, nil, true)
				p.sendEDUs(t, n, deviceListEDU(map[string]any{"user_id": p.creator, "device_id": "random_device_id", "prev_id": []int64{41}, "stream_id": 42,
					"keys": map[string]any{"device_keys": map[string]any{}}}))
				if after := testutil.Canonical(t, queriedDevices(t, n, alice, p.creator)); after != before {
					t.Fatalf("the cached list changed while its server was down:\n%s\n%s", before, after)
				}

				// Deletion: the server is back, the device goes.
				creator.set(42, map[string]toolDevice{"random_device_id": {keys: newKeys, name: "New device name"}, "TOOLDEV": {keys: toolKeys}}, false)
				// A query of the stale user fetches the list again.
				if got := queriedDevices(t, n, alice, p.creator); len(got) != 2 || !notStale(n, p.creator) {
					t.Fatalf("once the server is back: %v", got)
				}
				creator.set(43, map[string]toolDevice{"random_device_id": {keys: newKeys, name: "New device name"}}, false)
				p.sendEDUs(t, n, deviceListEDU(map[string]any{"user_id": p.creator, "device_id": "TOOLDEV", "prev_id": []int64{42}, "stream_id": 43, "deleted": true}))
				if got := queriedDevices(t, n, alice, p.creator); len(got) != 1 || got["random_device_id"] == nil {
					t.Fatalf("after a deletion: %v", got)
				}

				// sytest: "Server correctly resyncs when client query keys and
				// there is no remote cache".
				if got := queriedDevices(t, n, alice, p.user("nocache")); len(got) != 2 || got["random_device_id1"] == nil || got["random_device_id2"] == nil {
					t.Fatalf("a user with no cache: %v", got)
				}

				// sytest: "Server correctly resyncs when server leaves and
				// rejoins a room": a device added meanwhile is seen.
				n.Must(t, "POST", rpath(p.roomID, "/leave"), alice.Token, map[string]any{})
				eventually(t, "the cache to be dropped", func() bool {
					lists, err := n.Store.RemoteDeviceLists(t.Context(), []string{p.creator})
					return err == nil && lists[p.creator] == nil
				})
				creator.set(44, map[string]toolDevice{
					"random_device_id":  {keys: newKeys, name: "New device name"},
					"random_device_id2": {keys: map[string]any{"device_keys": map[string]any{}}},
				}, false)
				joinPeerRoom(t, n, alice, p)
				if got := queriedDevices(t, n, alice, p.creator); len(got) != 2 || got["random_device_id2"] == nil {
					t.Fatalf("after leaving and rejoining: %v", got)
				}
			})
		}
	})
}

// emptyDatabaseLikeFed returns another empty database of db's kind.
func emptyDatabaseLikeFed(t *testing.T, db testutil.Database) testutil.Database {
	if db.Name == "postgres" {
		return testutil.Postgres(t)
	}
	return testutil.SQLite(t)
}
