package federationapi_test

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

// presenceOf returns the content of sender's m.presence event in a /sync
// answer (nil when none), and whether the answer has a presence section.
func presenceOf(r map[string]any, sender string) (map[string]any, bool) {
	sec, ok := r["presence"].(map[string]any)
	if !ok {
		return nil, false
	}
	for _, e := range asList(sec["events"]) {
		ev := e.(map[string]any)
		if ev["type"] == "m.presence" && ev["sender"] == sender {
			return ev["content"].(map[string]any), true
		}
	}
	return nil, true
}

// presenceRoom has alice (on A) create a room, invite bob (on B), and bob
// join it; both servers then see both members.
func presenceRoom(t *testing.T, p *roomPair) string {
	t.Helper()
	roomID := p.a.Must(t, "POST", "/_matrix/client/v3/createRoom", p.alice.Token, map[string]any{
		"preset": "private_chat", "invite": []string{p.bob.UserID}})["room_id"].(string)
	eventually(t, "bob's invite to reach B", func() bool {
		r := p.b.Do(t, "POST", "/_matrix/client/v3/join/"+url.PathEscape(roomID), p.bob.Token, map[string]any{})
		return r.Status == 200
	})
	eventually(t, "both servers to see both members", func() bool {
		return equalStrings(joinedMembers(t, p.a, p.alice, roomID), p.alice.UserID, p.bob.UserID) &&
			equalStrings(joinedMembers(t, p.b, p.bob, roomID), p.alice.UserID, p.bob.UserID)
	})
	return roomID
}

// A user on one server sets presence; the user on the other server,
// sharing a room, sees it in /sync (a waiting /sync wakes for it) and in
// GET /presence, through m.presence EDUs both ways.
func TestPresenceBetweenServers(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		p := newRoomPair(t, db)
		presenceRoom(t, p)
		since := syncToken(t, p.b, p.bob)

		done := make(chan testutil.Response, 1)
		go func() {
			done <- p.b.Do(t, "GET", "/_matrix/client/v3/sync?timeout=20000&since="+url.QueryEscape(since), p.bob.Token, nil)
		}()
		eventually(t, "bob's /sync to wait", func() bool { return p.b.Parts.Sync.WaitingSyncs() == 1 })
		p.a.Must(t, "PUT", "/_matrix/client/v3/presence/"+url.PathEscape(p.alice.UserID)+"/status", p.alice.Token,
			map[string]any{"presence": "online", "status_msg": "from A"})
		// The wait ends for alice's presence (or for something else
		// first, after which the next wait does), long before its 20 s.
		deadline := time.Now().Add(15 * time.Second)
		for {
			var r testutil.Response
			select {
			case r = <-done:
			case <-time.After(time.Until(deadline)):
				t.Fatal("bob's /sync did not wake for alice's presence")
			}
			if r.Status != 200 {
				t.Fatalf("bob's /sync: %s", r.Raw)
			}
			if c, _ := presenceOf(r.Body, p.alice.UserID); c != nil {
				if c["presence"] != "online" || c["status_msg"] != "from A" || c["currently_active"] != true {
					t.Fatalf("bob's woken /sync: %s", r.Raw)
				}
				break
			}
			next := r.Body["next_batch"].(string)
			go func() {
				done <- p.b.Do(t, "GET", "/_matrix/client/v3/sync?timeout=20000&since="+url.QueryEscape(next), p.bob.Token, nil)
			}()
		}
		got := p.b.Must(t, "GET", "/_matrix/client/v3/presence/"+url.PathEscape(p.alice.UserID)+"/status", p.bob.Token, nil)
		if got["presence"] != "online" || got["status_msg"] != "from A" {
			t.Fatalf("B's GET of alice: %v", got)
		}

		// The other way: bob's /sync marks him online, and A hears of it.
		p.b.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0&set_presence=unavailable", p.bob.Token, nil)
		eventually(t, "bob's presence to reach A", func() bool {
			c, _ := presenceOf(p.a.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0&set_presence=offline", p.alice.Token, nil), p.bob.UserID)
			return c != nil && c["presence"] == "unavailable"
		})
		got = p.a.Must(t, "GET", "/_matrix/client/v3/presence/"+url.PathEscape(p.bob.UserID)+"/status", p.alice.Token, nil)
		if got["presence"] != "unavailable" {
			t.Fatalf("A's GET of bob: %v", got)
		}
		eventually(t, "the presence queues to empty", func() bool {
			da, errA := p.a.Store.PresenceDestinations(context.Background())
			dbb, errB := p.b.Store.PresenceDestinations(context.Background())
			return errA == nil && errB == nil && len(da) == 0 && len(dbb) == 0
		})
	})
}

// A server with presence off neither sends its users' presence nor keeps
// what other servers send.
func TestPresenceOffBetweenServers(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		p := &roomPair{a: testutil.StartNode(t, db, nil),
			b: testutil.StartNode(t, testutil.SQLite(t), func(c *config.Config) { c.Presence.Enabled = false })}
		p.alice = p.a.Register(t, "alice", "ALICE1")
		p.bob = p.b.Register(t, "bob", "BOB1")
		presenceRoom(t, p)

		// A sends alice's presence; B drops it.
		p.a.Must(t, "PUT", "/_matrix/client/v3/presence/"+url.PathEscape(p.alice.UserID)+"/status", p.alice.Token,
			map[string]any{"presence": "online", "status_msg": "from A"})
		eventually(t, "A to deliver alice's presence", func() bool {
			d, err := p.a.Store.PresenceDestinations(context.Background())
			return err == nil && len(d) == 0
		})
		if stored, err := p.b.Store.Presence(context.Background(), []string{p.alice.UserID}); err != nil || len(stored) != 0 {
			t.Fatalf("B stored %v (%v)", stored, err)
		}
		sync := p.b.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0", p.bob.Token, nil)
		if _, ok := presenceOf(sync, p.alice.UserID); ok {
			t.Fatalf("B's /sync has presence: %v", sync["presence"])
		}
		if got := p.b.Must(t, "GET", "/_matrix/client/v3/presence/"+url.PathEscape(p.alice.UserID)+"/status", p.bob.Token, nil); got["presence"] != "offline" {
			t.Fatalf("B's GET of alice: %v", got)
		}

		// bob's /sync and PUT on B queue nothing; a to-device message
		// sent after them arrives at A alone.
		p.b.Must(t, "PUT", "/_matrix/client/v3/presence/"+url.PathEscape(p.bob.UserID)+"/status", p.bob.Token, map[string]any{"presence": "online"})
		if d, err := p.b.Store.PresenceDestinations(context.Background()); err != nil || len(d) != 0 {
			t.Fatalf("B queued presence for %v (%v)", d, err)
		}
		sendToDevice(t, p.b, p.bob, "after", map[string]any{p.alice.UserID: map[string]any{"*": map[string]any{"n": 1}}})
		eventually(t, "bob's message to reach A", func() bool { return len(inbox(t, p.a, p.alice)) == 1 })
		if stored, err := p.a.Store.Presence(context.Background(), []string{p.bob.UserID}); err != nil || len(stored) != 0 {
			t.Fatalf("A stored bob's presence %v (%v)", stored, err)
		}
	})
}

// Presence set before a room is shared reaches the other server when its
// user joins, without a change after: the joining server's user is sent
// the room's members' presence, and the joiner's presence is sent to the
// room's servers.
func TestPresenceSentOnJoin(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		p := newRoomPair(t, db)
		p.a.Must(t, "PUT", "/_matrix/client/v3/presence/"+url.PathEscape(p.alice.UserID)+"/status", p.alice.Token,
			map[string]any{"presence": "online", "status_msg": "here first"})
		p.b.Must(t, "PUT", "/_matrix/client/v3/presence/"+url.PathEscape(p.bob.UserID)+"/status", p.bob.Token,
			map[string]any{"presence": "unavailable", "status_msg": "joining"})
		// Nothing is queued while no room is shared.
		for _, n := range []*testutil.Node{p.a, p.b} {
			if d, err := n.Store.PresenceDestinations(context.Background()); err != nil || len(d) != 0 {
				t.Fatalf("%s queued presence for %v (%v)", n.ServerName, d, err)
			}
		}
		since := p.b.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0&set_presence=offline", p.bob.Token, nil)["next_batch"].(string)
		presenceRoom(t, p)
		eventually(t, "alice's presence to reach B", func() bool {
			c, _ := presenceOf(p.b.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0&set_presence=offline&since="+url.QueryEscape(since), p.bob.Token, nil), p.alice.UserID)
			// Online, or offline already if the join took longer than
			// SyncOnlineTimeout: alice does not sync.
			return c != nil && c["status_msg"] == "here first"
		})
		eventually(t, "bob's presence to reach A", func() bool {
			got := p.a.Must(t, "GET", "/_matrix/client/v3/presence/"+url.PathEscape(p.bob.UserID)+"/status", p.alice.Token, nil)
			return got["status_msg"] == "joining"
		})
	})
}
