package federationapi_test

import (
	"context"
	"encoding/json"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

// Device lists driven by rooms, between two daemons whose clients upload
// keys as the ecosystem's test tools do (keys.strict_validation: false):
// the scenarios of Complement's TestDeviceListUpdates and of sytest's
// device-list tests, with device_lists.changed and left as the spec and
// Synapse give them, and /keys/query current after each step.

// laxPair is two lax daemons: a on the database under test, b on SQLite.
func laxPair(t *testing.T, db testutil.Database) (a, b *testutil.Node) {
	lax := func(c *config.Config) { c.Keys.StrictValidation = false }
	return testutil.StartNode(t, db, lax), testutil.StartNode(t, testutil.SQLite(t), lax)
}

// toolKeys uploads device keys as Complement does (real key values, no
// signatures) and returns them.
func toolKeys(t *testing.T, n *testutil.Node, u *testutil.User) map[string]any {
	t.Helper()
	keys := map[string]any{
		"user_id": u.UserID, "device_id": u.DeviceID,
		"algorithms": []any{"m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"},
		"keys":       map[string]any{"ed25519:" + u.DeviceID: testutil.RandomKey(), "curve25519:" + u.DeviceID: testutil.RandomKey()},
	}
	n.Upload(t, u, map[string]any{"device_keys": keys})
	return keys
}

// mustQueryKeys checks that /keys/query answers exactly want for u's
// device.
func mustQueryKeys(t *testing.T, n *testutil.Node, observer *testutil.User, u *testutil.User, want map[string]any) {
	t.Helper()
	got := devicesOf(t, query(t, n, observer, map[string][]string{u.UserID: {}}, 10000), u.UserID)[u.DeviceID]
	if got == nil || testutil.Canonical(t, got) != testutil.Canonical(t, want) {
		t.Fatalf("/keys/query of %s: %v, want %v", u.UserID, got, want)
	}
}

// deviceLists is the device_lists of one /sync answer.
type deviceLists struct{ changed, left []string }

func (d deviceLists) has(section, userID string) bool {
	l := d.changed
	if section == "left" {
		l = d.left
	}
	return slices.Contains(l, userID)
}

// syncOnce runs one /sync (waiting up to timeoutMS for news).
func syncOnce(t *testing.T, n *testutil.Node, u *testutil.User, since string, timeoutMS int) (deviceLists, string) {
	t.Helper()
	r := n.Must(t, "GET", "/_matrix/client/v3/sync?timeout="+itoa(timeoutMS)+"&since="+url.QueryEscape(since), u.Token, nil)
	var d deviceLists
	if dl, ok := r["device_lists"].(map[string]any); ok {
		for _, c := range asList(dl["changed"]) {
			d.changed = append(d.changed, c.(string))
		}
		for _, c := range asList(dl["left"]) {
			d.left = append(d.left, c.(string))
		}
	}
	for _, c := range d.changed {
		if slices.Contains(d.left, c) {
			t.Fatalf("%s in both changed and left: %+v", c, d)
		}
	}
	return d, r["next_batch"].(string)
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// syncUntil syncs (as clients do, waiting for news) until userID is in
// the section, and returns the token after that answer.
func syncUntil(t *testing.T, n *testutil.Node, u *testutil.User, since, section, userID string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		d, next := syncOnce(t, n, u, since, 1000)
		since = next
		if d.has(section, userID) {
			return since
		}
	}
	t.Fatalf("%s never saw %s in device_lists.%s", u.UserID, userID, section)
	return ""
}

func createPublicRoom(t *testing.T, n *testutil.Node, u *testutil.User) string {
	t.Helper()
	return n.Must(t, "POST", clientV3+"/createRoom", u.Token, map[string]any{"preset": "public_chat"})["room_id"].(string)
}

func joinVia(t *testing.T, n *testutil.Node, u *testutil.User, roomID string, via *testutil.Node) {
	t.Helper()
	n.Must(t, "POST", clientV3+"/join/"+url.PathEscape(roomID)+"?server_name="+url.QueryEscape(via.ServerName), u.Token, map[string]any{})
}

func leaveRoom(t *testing.T, n *testutil.Node, u *testutil.User, roomID string) {
	t.Helper()
	n.Must(t, "POST", rpath(roomID, "/leave"), u.Token, map[string]any{})
}

// queuesEmpty waits until neither daemon has anything left to send.
func queuesEmpty(t *testing.T, nodes ...*testutil.Node) {
	t.Helper()
	eventually(t, "the outbound queues to empty", func() bool {
		for _, n := range nodes {
			if pending, err := n.Store.PendingDestinations(context.Background()); err != nil || len(pending) != 0 {
				return false
			}
		}
		return true
	})
}

// The ten join, leave and rejoin combinations of Complement's
// TestDeviceListUpdates, alice on A observing bob on A (local) or on B
// (remote).
func TestDeviceListRoomCombinations(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a, b := laxPair(t, db)
		users := 0
		newUsers := func(remote bool) (alice, bob *testutil.User, bobNode *testutil.Node) {
			users++
			bobNode = a
			if remote {
				bobNode = b
			}
			alice = a.Register(t, "alice"+itoa(users), "")
			bob = bobNode.Register(t, "bob"+itoa(users), "")
			return alice, bob, bobNode
		}
		// roomNode is where a room with alice and bob is made: the other
		// user joins it through its server.
		roomOf := func(n *testutil.Node, u *testutil.User) string { return createPublicRoom(t, n, u) }

		for _, remote := range []bool{false, true} {
			where := map[bool]string{false: "local", true: "remote"}[remote]

			t.Run(where+" user joins a room", func(t *testing.T) {
				alice, bob, bn := newUsers(remote)
				bobKeys := toolKeys(t, bn, bob)
				roomID := roomOf(a, alice)
				_, since := syncOnce(t, a, alice, "", 0)
				bobSince := syncUntilQuiet(t, bn, bob, "")
				// A /sync of alice waiting for news when bob joins wakes
				// for it (well before its timeout).
				waiting := make(chan testutil.Response, 1)
				go func() {
					waiting <- a.Do(t, "GET", clientV3+"/sync?timeout=20000&since="+url.QueryEscape(since), alice.Token, nil)
				}()
				eventually(t, "alice's /sync to wait", func() bool { return a.Parts.Sync.WaitingSyncs() > 0 })
				start := time.Now()
				joinVia(t, bn, bob, roomID, a)
				r := <-waiting
				if dl, _ := r.Body["device_lists"].(map[string]any); r.Status != 200 || !slices.Contains(asList(dl["changed"]), any(bob.UserID)) || time.Since(start) > 15*time.Second {
					t.Fatalf("alice's waiting /sync after %v: %d %s", time.Since(start), r.Status, r.Raw)
				}
				// Each sees the other at their next /sync: the join is on
				// both servers when bob's /join returned.
				d, since := syncOnce(t, a, alice, since, 0)
				if !d.has("changed", bob.UserID) || d.has("left", bob.UserID) {
					t.Fatalf("alice's sync after bob's join: %+v", d)
				}
				if d, _ := syncOnce(t, bn, bob, bobSince, 0); !d.has("changed", alice.UserID) || !d.has("changed", bob.UserID) || len(d.left) != 0 {
					t.Fatalf("bob's sync after his join: %+v", d)
				}
				mustQueryKeys(t, a, alice, bob, bobKeys)
				// Nothing of the join (the announcement of bob's devices) still on
				// its way: the next change alice sees is the upload's.
				queuesEmpty(t, a, b)
				since = syncUntilQuiet(t, a, alice, since)
				bobKeys = toolKeys(t, bn, bob)
				syncUntil(t, a, alice, since, "changed", bob.UserID)
				mustQueryKeys(t, a, alice, bob, bobKeys)
			})

			t.Run("joining a room with a "+where+" user", func(t *testing.T) {
				alice, bob, bn := newUsers(remote)
				bobKeys := toolKeys(t, bn, bob)
				roomID := roomOf(bn, bob)
				_, since := syncOnce(t, a, alice, "", 0)
				bobSince := syncUntilQuiet(t, bn, bob, "")
				joinVia(t, a, alice, roomID, bn)
				d, since := syncOnce(t, a, alice, since, 0)
				if !d.has("changed", bob.UserID) || !d.has("changed", alice.UserID) || len(d.left) != 0 {
					t.Fatalf("alice's sync after her join: %+v", d)
				}
				if d, _ := syncOnce(t, bn, bob, bobSince, 0); !d.has("changed", alice.UserID) || len(d.left) != 0 {
					t.Fatalf("bob's sync after alice's join: %+v", d)
				}
				mustQueryKeys(t, a, alice, bob, bobKeys)
				// Nothing of the join (the announcement of bob's devices) still on
				// its way: the next change alice sees is the upload's.
				queuesEmpty(t, a, b)
				since = syncUntilQuiet(t, a, alice, since)
				bobKeys = toolKeys(t, bn, bob)
				syncUntil(t, a, alice, since, "changed", bob.UserID)
				mustQueryKeys(t, a, alice, bob, bobKeys)
			})

			t.Run(where+" user leaves a room", func(t *testing.T) {
				alice, bob, bn := newUsers(remote)
				bobKeys := toolKeys(t, bn, bob)
				roomID := roomOf(a, alice)
				joinVia(t, bn, bob, roomID, a)
				_, since := syncOnce(t, a, alice, "", 0)
				mustQueryKeys(t, a, alice, bob, bobKeys)
				// Nothing of the join (the announcement of bob's devices) still on
				// its way: the next change alice sees is the upload's.
				queuesEmpty(t, a, b)
				since = syncUntilQuiet(t, a, alice, since)
				leaveRoom(t, bn, bob, roomID)
				since = syncUntil(t, a, alice, since, "left", bob.UserID)
				// Their server no longer tells A of bob's changes: A must
				// not answer a cached list, nor tell alice.
				bobKeys = toolKeys(t, bn, bob)
				mustQueryKeys(t, a, alice, bob, bobKeys)
				queuesEmpty(t, a, b)
				if d, _ := syncOnce(t, a, alice, since, 0); d.has("changed", bob.UserID) || d.has("left", bob.UserID) {
					t.Fatalf("alice told of bob after he left: %+v", d)
				}
			})

			t.Run("leaving a room with a "+where+" user", func(t *testing.T) {
				alice, bob, bn := newUsers(remote)
				bobKeys := toolKeys(t, bn, bob)
				roomID := roomOf(bn, bob)
				joinVia(t, a, alice, roomID, bn)
				_, since := syncOnce(t, a, alice, "", 0)
				mustQueryKeys(t, a, alice, bob, bobKeys)
				// Nothing of the join (the announcement of bob's devices) still on
				// its way: the next change alice sees is the upload's.
				queuesEmpty(t, a, b)
				since = syncUntilQuiet(t, a, alice, since)
				leaveRoom(t, a, alice, roomID)
				d, since := syncOnce(t, a, alice, since, 0)
				if !d.has("left", bob.UserID) || d.has("changed", bob.UserID) {
					t.Fatalf("alice's sync after she left: %+v", d)
				}
				bobKeys = toolKeys(t, bn, bob)
				mustQueryKeys(t, a, alice, bob, bobKeys)
				queuesEmpty(t, a, b)
				if d, _ := syncOnce(t, a, alice, since, 0); d.has("changed", bob.UserID) || d.has("left", bob.UserID) {
					t.Fatalf("alice told of bob after she left: %+v", d)
				}
				// sytest: "If user leaves room, remote user changes device
				// and rejoins we see update in /sync and /keys/changes".
				bobKeys = toolKeys(t, bn, bob)
				from := since
				joinVia(t, a, alice, roomID, bn)
				d, to := syncOnce(t, a, alice, since, 0)
				if !d.has("changed", bob.UserID) || d.has("left", bob.UserID) {
					t.Fatalf("alice's sync after she rejoined: %+v", d)
				}
				if !changesBetween(t, a, alice, from, to)[bob.UserID] {
					t.Fatal("/keys/changes after the rejoin does not list bob")
				}
				mustQueryKeys(t, a, alice, bob, bobKeys)
			})

			t.Run(where+" user rejoins a room", func(t *testing.T) {
				alice, bob, bn := newUsers(remote)
				bobKeys := toolKeys(t, bn, bob)
				roomID := roomOf(a, alice)
				joinVia(t, bn, bob, roomID, a)
				_, since := syncOnce(t, a, alice, "", 0)
				mustQueryKeys(t, a, alice, bob, bobKeys)
				// Nothing of the join (the announcement of bob's devices) still on
				// its way: the next change alice sees is the upload's.
				queuesEmpty(t, a, b)
				since = syncUntilQuiet(t, a, alice, since)
				from := since
				leaveRoom(t, bn, bob, roomID)
				since = syncUntil(t, a, alice, since, "left", bob.UserID)
				// sytest: "If remote user leaves room, changes device and
				// rejoins we see update in sync" (and in /keys/changes).
				bobKeys = toolKeys(t, bn, bob)
				queuesEmpty(t, a, b)
				joinVia(t, bn, bob, roomID, a)
				d, to := syncOnce(t, a, alice, since, 0)
				if !d.has("changed", bob.UserID) || d.has("left", bob.UserID) {
					t.Fatalf("alice's sync after bob rejoined: %+v", d)
				}
				if !changesBetween(t, a, alice, from, to)[bob.UserID] {
					t.Fatal("/keys/changes across the rejoin does not list bob")
				}
				mustQueryKeys(t, a, alice, bob, bobKeys)
			})
		}
	})
}

// syncUntilQuiet syncs until an answer has no device-list changes, so
// that what follows is told apart from what came before (the role of
// Complement's barrier: a first query of a remote user may itself be a
// change).
func syncUntilQuiet(t *testing.T, n *testutil.Node, u *testutil.User, since string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		d, next := syncOnce(t, n, u, since, 0)
		since = next
		if len(d.changed)+len(d.left) == 0 {
			return since
		}
	}
	t.Fatal("device-list changes never stopped")
	return ""
}

func changesBetween(t *testing.T, n *testutil.Node, u *testutil.User, from, to string) map[string]bool {
	t.Helper()
	r := n.Must(t, "GET", clientV3+"/keys/changes?from="+url.QueryEscape(from)+"&to="+url.QueryEscape(to), u.Token, nil)
	out := map[string]bool{}
	for _, c := range asList(r["changed"]) {
		out[c.(string)] = true
	}
	return out
}

// A new login followed by a key upload (as the tools upload them) is a
// change at the next /sync and in /keys/changes of every user sharing a
// room, on the user's server and on the other, and /keys/query answers
// the new device at once (on the other server, once the update arrived).
func TestNewDeviceSeenByRoomMembers(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a, b := laxPair(t, db)
		alice := a.Register(t, "alice", "ALICE1")
		carol := a.Register(t, "carol", "CAROL1")
		bob := b.Register(t, "bob", "BOB1")
		roomID := createPublicRoom(t, a, alice)
		joinVia(t, a, carol, roomID, a)
		joinVia(t, b, bob, roomID, a)
		carolSince := syncUntilQuiet(t, a, carol, "")
		bobSince := syncUntilQuiet(t, b, bob, "")

		second := a.Login(t, alice, "ALICE2")
		keys := toolKeys(t, a, second)
		d, carolTo := syncOnce(t, a, carol, carolSince, 0)
		if !d.has("changed", alice.UserID) {
			t.Fatalf("carol's sync after alice's new device: %+v", d)
		}
		if !changesBetween(t, a, carol, carolSince, carolTo)[alice.UserID] {
			t.Fatal("carol's /keys/changes does not list alice")
		}
		mustQueryKeys(t, a, carol, second, keys)

		bobTo := syncUntil(t, b, bob, bobSince, "changed", alice.UserID)
		if !changesBetween(t, b, bob, bobSince, bobTo)[alice.UserID] {
			t.Fatal("bob's /keys/changes does not list alice")
		}
		mustQueryKeys(t, b, bob, second, keys)
	})
}

// Local device changes uploaded as sytest does (device keys with no keys
// at all, then with a field changed) reach the other server as updates
// whose prev_id names the update before, so it follows them without
// fetching the list; a device signed with the user's self-signing key
// goes out with the signature. A device's identity keys replaced in lax
// mode go out like any other change.
func TestLocalToolChangesReachRemoteServers(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a, b := laxPair(t, db)
		alice := a.Register(t, "alice", "ALICE1")
		bob := b.Register(t, "bob", "BOB1")
		w := newEDUWatcher(t)
		roomID := createPublicRoom(t, a, alice)
		joinVia(t, b, bob, roomID, a)
		a.Join(t, roomID, w.user) // a third server, to see the EDUs themselves
		firstFetch(t, b, bob, alice.UserID)
		queuesDrained(t, a, b) // A told of bob's devices by his join
		eventually(t, "B's updater idle", func() bool { return b.Updater.InFlight() == 0 })
		fetches := a.Requests.Count("GET", devicesPath)

		uploads := []map[string]any{
			{"user_id": alice.UserID, "device_id": "ALICE1"},
			{"user_id": alice.UserID, "device_id": "ALICE1", "updated": "keys"},
			{"user_id": alice.UserID, "device_id": "ALICE1", "keys": map[string]any{"ed25519:test": "cmltKURmLTRV86hBT_jh8AFH9RAdz0yAZOfvlBUQqP8"}},
			{"user_id": alice.UserID, "device_id": "ALICE1", "keys": map[string]any{"ed25519:test": "aI2BUUeIQ0Y8T7Tv7jJh2ADagpoWdtHf4XipFPvjXI8"}},
			{"user_id": alice.UserID, "device_id": "ALICE1", "algorithms": []any{"m.olm.v1.curve25519-aes-sha2"},
				"keys": map[string]any{"ed25519:ALICE1": testutil.RandomKeyFor(alice.Key), "curve25519:ALICE1": testutil.RandomKey()}},
		}
		for i, keys := range uploads {
			a.Upload(t, alice, map[string]any{"device_keys": keys, "one_time_keys": map[string]any{"my_algorithm:my_id_1": "my+base64+key"}})
			eventually(t, "B to answer upload "+itoa(i), func() bool {
				got := devicesOf(t, query(t, b, bob, map[string][]string{alice.UserID: {}}, 10000), alice.UserID)["ALICE1"]
				return got != nil && testutil.Canonical(t, got) == testutil.Canonical(t, keys)
			})
		}
		// The watcher's queue may coalesce updates sent while it waited:
		// its last one has the last keys, and each names the one before.
		eventually(t, "the watcher to get the last update", func() bool {
			got := w.received("m.device_list_update", alice.UserID)
			return len(got) > 0 && testutil.Canonical(t, got[len(got)-1]["keys"]) == testutil.Canonical(t, uploads[len(uploads)-1])
		})
		var prev int64
		for i, e := range w.received("m.device_list_update", alice.UserID) {
			var streamID int64
			var prevIDs []int64
			if json.Unmarshal(e["stream_id"], &streamID) != nil || json.Unmarshal(e["prev_id"], &prevIDs) != nil && i > 0 {
				t.Fatalf("update %d: %v", i, e)
			}
			if i > 0 && (len(prevIDs) != 1 || prevIDs[0] != prev) {
				t.Fatalf("update %d: prev_id %v, want [%d]", i, prevIDs, prev)
			}
			if streamID <= prev {
				t.Fatalf("update %d: stream_id %d after %d", i, streamID, prev)
			}
			prev = streamID
		}

		// Cross-signing: alice signs her device (keys as the tools upload
		// them) with her self-signing key; B answers the signature.
		ax := testutil.NewCrossSigning(alice.UserID)
		a.Must(t, "POST", signingUploadPath, alice.Token, ax.Upload(t))
		signed := testutil.SignWith(t, uploads[len(uploads)-1], alice.UserID, ax.SelfSigning)
		sskID := "ed25519:" + testutil.PublicKey(ax.SelfSigning)
		r := a.Must(t, "POST", clientV3+"/keys/signatures/upload", alice.Token, map[string]any{alice.UserID: map[string]any{"ALICE1": signed}})
		if f, _ := r["failures"].(map[string]any); len(f) != 0 {
			t.Fatalf("signature upload failures: %v", f)
		}
		eventually(t, "B to answer the device's signature", func() bool {
			got := devicesOf(t, query(t, b, bob, map[string][]string{alice.UserID: {}}, 10000), alice.UserID)["ALICE1"]
			return got != nil && strings.Contains(testutil.Canonical(t, got), sskID)
		})
		queuesEmpty(t, a)
		if n := a.Requests.Count("GET", devicesPath); n != fetches {
			t.Fatalf("B fetched alice's list %d times: the prev_id chain broke", n-fetches)
		}
	})
}
