package federationapi_test

import (
	"context"
	"database/sql"
	"net/http"
	"testing"
	"time"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

// pair is two daemons with a user each, sharing a room (as both servers'
// membership feeds say).
type pair struct {
	a, b       *testutil.Node
	alice, bob *testutil.User
}

const sharedRoom = "!shared:x"

func newPair(t *testing.T, db testutil.Database) *pair {
	p := &pair{a: testutil.StartNode(t, db, nil), b: testutil.StartNode(t, testutil.SQLite(t), nil)}
	p.alice = p.a.Register(t, "alice", "ALICE1")
	p.a.Upload(t, p.alice, map[string]any{"device_keys": p.alice.DeviceKeys(t)})
	p.bob = p.b.Register(t, "bob", "BOB1")
	p.b.Upload(t, p.bob, map[string]any{"device_keys": p.bob.DeviceKeys(t)})
	for _, n := range []*testutil.Node{p.a, p.b} {
		n.Join(t, sharedRoom, p.alice.UserID)
		n.Join(t, sharedRoom, p.bob.UserID)
	}
	// Each server fetches the other's user when its own user first asks;
	// bob's join on B was announced to A.
	firstFetch(t, p.b, p.bob, p.alice.UserID)
	firstFetch(t, p.a, p.alice, p.bob.UserID)
	queuesDrained(t, p.a, p.b)
	eventually(t, "the updaters idle", func() bool {
		return p.a.Updater.InFlight() == 0 && p.b.Updater.InFlight() == 0
	})
	if !sameSet(deviceIDs(t, p.b, p.bob, p.alice.UserID), "ALICE1") || !sameSet(deviceIDs(t, p.a, p.alice, p.bob.UserID), "BOB1") {
		t.Fatal("the first resyncs did not fetch the devices")
	}
	return p
}

// Local changes reach the other server as updates whose prev_id chain it
// can follow: B sees every change without fetching alice's list again.
func TestLocalChangesReachRemoteServers(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		p := newPair(t, db)
		fetches := p.a.Requests.Count("GET", devicesPath)
		since := syncToken(t, p.b, p.bob)

		second := p.a.Login(t, p.alice, "ALICE2")
		p.a.Upload(t, second, map[string]any{"device_keys": second.DeviceKeys(t)})
		third := p.a.Login(t, p.alice, "ALICE3")
		p.a.Upload(t, third, map[string]any{"device_keys": third.DeviceKeys(t)})
		eventually(t, "B to see the new devices", func() bool {
			return sameSet(deviceIDs(t, p.b, p.bob, p.alice.UserID), "ALICE1", "ALICE2", "ALICE3")
		})
		if !changedSince(t, p.b, p.bob, since)[p.alice.UserID] {
			t.Fatal("bob's /keys/changes does not list alice")
		}

		// Deletion propagates.
		p.a.Must(t, "POST", "/_matrix/client/v3/logout", third.Token, map[string]any{})
		eventually(t, "B to see the deletion", func() bool {
			return sameSet(deviceIDs(t, p.b, p.bob, p.alice.UserID), "ALICE1", "ALICE2")
		})
		if n := p.a.Requests.Count("GET", devicesPath); n != fetches {
			t.Fatalf("B resynced alice %d times: the prev_id chain broke", n-fetches)
		}
		if n := p.b.Requests.Count("PUT", "/_matrix/federation/v1/send/"); n == 0 {
			t.Fatal("no transactions reached B")
		}
	})
}

// Updates queued while the destination is down survive a restart of the
// sender and are delivered when the destination is back; meanwhile the
// destination's view does not change.
func TestPendingUpdatesSurviveRestart(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		p := newPair(t, db)
		p.b.Stop()
		second := p.a.Login(t, p.alice, "ALICE2")
		p.a.Upload(t, second, map[string]any{"device_keys": second.DeviceKeys(t)})
		pending, err := p.a.Store.PendingDestinations(context.Background())
		if err != nil || len(pending) != 1 || pending[0] != p.b.ServerName {
			t.Fatalf("queue while B is down: %v %v", pending, err)
		}
		p.a.Stop()
		p.a.Restart()
		p.b.Restart()
		if got := deviceIDs(t, p.b, p.bob, p.alice.UserID); len(got) == 0 {
			t.Fatal("B lost its cache")
		}
		eventually(t, "the queued update to arrive", func() bool {
			return sameSet(deviceIDs(t, p.b, p.bob, p.alice.UserID), "ALICE1", "ALICE2")
		})
		eventually(t, "the queue to empty", func() bool {
			pending, _ := p.a.Store.PendingDestinations(context.Background())
			return len(pending) == 0
		})
	})
}

// A destination that was down is retried at once when it shows it is up
// again by sending a request.
func TestDestinationBackWakesSender(t *testing.T) {
	p := newPair(t, testutil.SQLite(t))
	p.b.Stop()
	second := p.a.Login(t, p.alice, "ALICE2")
	p.a.Upload(t, second, map[string]any{"device_keys": second.DeviceKeys(t)})
	eventually(t, "A to fail a delivery", func() bool { return !p.a.Daemon.Federation().Backoff(p.b.ServerName).IsZero() })
	p.b.Restart()
	// B asks A something (a user it has not cached): A learns B is up.
	p.a.Register(t, "carol", "")
	query(t, p.b, p.bob, map[string][]string{"@carol:" + p.a.ServerName: {}}, 10000)
	eventually(t, "delivery after B showed up", func() bool {
		return sameSet(deviceIDs(t, p.b, p.bob, p.alice.UserID), "ALICE1", "ALICE2")
	})
}

// After a remote user leaves every shared room, their changes no longer
// arrive and they appear in left; leaving, changing devices and rejoining
// shows up as a change with the new devices.
func TestLeaveAndRejoin(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		p := newPair(t, db)
		since := syncToken(t, p.a, p.alice)
		p.a.Leave(t, sharedRoom, p.bob.UserID)
		r := p.a.Must(t, "GET", "/_matrix/client/v3/keys/changes?from="+since+"&to="+syncToken(t, p.a, p.alice), p.alice.Token, nil)
		if left := r["left"].([]any); len(left) != 1 || left[0] != p.bob.UserID {
			t.Fatalf("left %v", r)
		}
		lists, err := p.a.Store.RemoteDeviceLists(context.Background(), []string{p.bob.UserID})
		if err != nil || len(lists) != 0 {
			t.Fatalf("bob still tracked after leaving: %v %v", lists, err)
		}

		// Bob changes devices; B still sends (its feed says they share a
		// room), A drops it.
		sends := p.a.Requests.Count("PUT", "/_matrix/federation/v1/send/")
		second := p.b.Login(t, p.bob, "BOB2")
		p.b.Upload(t, second, map[string]any{"device_keys": second.DeviceKeys(t)})
		eventually(t, "B's update to arrive", func() bool { return p.a.Requests.Count("PUT", "/_matrix/federation/v1/send/") > sends })
		eventually(t, "B's queue to empty", func() bool {
			pending, _ := p.b.Store.PendingDestinations(context.Background())
			return len(pending) == 0
		})
		if lists, _ := p.a.Store.RemoteDeviceLists(context.Background(), []string{p.bob.UserID}); len(lists) != 0 {
			t.Fatal("an update for an untracked user was stored")
		}

		// Rejoin: a change for alice, and the new device on query.
		since = syncToken(t, p.a, p.alice)
		p.a.Join(t, sharedRoom, p.bob.UserID)
		if !changedSince(t, p.a, p.alice, since)[p.bob.UserID] {
			t.Fatal("rejoin not shown as a change")
		}
		if got := deviceIDs(t, p.a, p.alice, p.bob.UserID); !sameSet(got, "BOB1", "BOB2") {
			t.Fatalf("after rejoin: %v", got)
		}
	})
}

// With two daemons on one PostgreSQL database, an update /send delivers to
// one is visible to /keys/query on the other as soon as /send returns.
func TestSharedDatabaseSeesSendAtOnce(t *testing.T) {
	db := testutil.Postgres(t)
	a1 := testutil.StartNode(t, db, nil)
	a2 := sameServer(t, db, a1)
	alice := a1.Register(t, "alice", "")
	carol := newFakeRemote(t, "carol")
	carol.addDevice("D0")
	a1.Join(t, "!room:x", alice.UserID)
	a1.Join(t, "!room:x", carol.user)
	firstFetch(t, a2, alice, carol.user)
	if !sameSet(deviceIDs(t, a2, alice, carol.user), "D0") {
		t.Fatal("the first resync did not fetch the device")
	}

	want := []string{"D0"}
	for i := 1; i <= 30; i++ {
		id := "D" + string(rune('A'+i%26)) + string(rune('0'+i/26))
		edus := []map[string]any{carol.addDevice(id)}
		if i%10 == 0 { // now and then a gap, which needs a resync before the answer
			gap := "G" + id
			carol.addDevice(gap)
			want = append(want, gap)
			edus = []map[string]any{carol.addDevice(id)}
		}
		want = append(want, id)
		if r := carol.send(a1, carol.nextTxn(), edus...); r.Status != http.StatusOK {
			t.Fatalf("send %d: %d %s", i, r.Status, r.Raw)
		}
		if got := deviceIDs(t, a2, alice, carol.user); !sameSet(got, want...) {
			t.Fatalf("iteration %d: the other daemon sees %v, want %v", i, got, want)
		}
	}
}

// A /sync waiting on one daemon wakes for a change made through another
// daemon sharing the PostgreSQL database, and the change is readable there
// when it wakes.
func TestSharedDatabaseWakesSync(t *testing.T) {
	db := testutil.Postgres(t)
	a1 := testutil.StartNode(t, db, nil)
	a2 := testutil.StartNode(t, db, func(c *config.Config) { c.ServerName = a1.ServerName })
	alice := a1.Register(t, "alice", "")
	bob := a1.Register(t, "bob", "")
	a1.Join(t, "!room:x", alice.UserID)
	a1.Join(t, "!room:x", bob.UserID)
	// First, proof that a2 answers queries from its device cache (which it
	// turns on once it listens): keys written behind the daemons' backs,
	// with no notification, stay unseen there. Without that proof the
	// check after the sync below could pass uncached.
	sqlDB, err := sql.Open("postgres", db.URI)
	if err != nil {
		t.Fatal(err)
	}
	defer sqlDB.Close()
	carol := a1.Register(t, "carol", "")
	setKeys := func(keys any) {
		if _, err := sqlDB.Exec(`UPDATE devices SET key_json = $1 WHERE user_id = $2`, keys, carol.UserID); err != nil {
			t.Fatal(err)
		}
	}
	written := false
	eventually(t, "a2 to answer from its device cache", func() bool {
		if got := deviceIDs(t, a2, alice, carol.UserID); len(got) != 0 {
			if !written {
				t.Fatalf("carol has keys before any were written: %v", got)
			}
			// The cache came on while the keys were in the database and
			// kept them after they were taken away: a2 answers from it.
			return true
		}
		written = true
		setKeys(`{"device_id":"` + carol.DeviceID + `"}`)
		cached := len(deviceIDs(t, a2, alice, carol.UserID)) == 0
		setKeys(nil)
		return cached
	})

	since := syncToken(t, a2, alice)
	done := make(chan testutil.Response, 1)
	go func() {
		done <- a2.Do(t, "GET", "/_matrix/client/v3/sync?timeout=20000&since="+since, alice.Token, nil)
	}()
	eventually(t, "the sync to wait", func() bool { return a2.Parts.Sync.WaitingSyncs() == 1 })
	// a2 has bob's (still keyless) device list cached...
	if got := deviceIDs(t, a2, alice, bob.UserID); len(got) != 0 {
		t.Fatalf("bob has keys before uploading any: %v", got)
	}
	a1.Upload(t, bob, map[string]any{"device_keys": bob.DeviceKeys(t)})
	select {
	case r := <-done:
		changed, _ := r.Body["device_lists"].(map[string]any)["changed"].([]any)
		if r.Status != 200 || len(changed) != 1 || changed[0] != bob.UserID {
			t.Fatalf("sync: %d %s", r.Status, r.Raw)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the sync on the other daemon was not woken")
	}
	// ...and a client told of the change by a2 reads the new keys from a2
	// at once: the cache was dropped before the sync woke.
	if got := deviceIDs(t, a2, alice, bob.UserID); !got[bob.DeviceID] || len(got) != 1 {
		t.Fatalf("after the sync woke, a2 serves bob's devices %v, want %s", got, bob.DeviceID)
	}
}
