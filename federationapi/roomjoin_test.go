package federationapi_test

import (
	"context"
	"net/url"
	"sort"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/testutil"
)

// roomPair is two daemons with a user each and no shared room yet.
type roomPair struct {
	a, b       *testutil.Node
	alice, bob *testutil.User
}

func newRoomPair(t *testing.T, db testutil.Database) *roomPair {
	p := &roomPair{a: testutil.StartNode(t, db, nil), b: testutil.StartNode(t, testutil.SQLite(t), nil)}
	p.alice = p.a.Register(t, "alice", "ALICE1")
	p.a.Upload(t, p.alice, map[string]any{"device_keys": p.alice.DeviceKeys(t)})
	p.bob = p.b.Register(t, "bob", "BOB1")
	p.b.Upload(t, p.bob, map[string]any{"device_keys": p.bob.DeviceKeys(t)})
	return p
}

func rpath(roomID, rest string) string {
	return "/_matrix/client/v3/rooms/" + url.PathEscape(roomID) + rest
}

// syncChanged runs an incremental /sync and returns device_lists.changed
// (sorted) and the next token.
func syncChanged(t *testing.T, n *testutil.Node, u *testutil.User, since string) ([]string, string, map[string]any) {
	t.Helper()
	r := n.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0&since="+url.QueryEscape(since), u.Token, nil)
	var out []string
	if dl, ok := r["device_lists"].(map[string]any); ok {
		for _, c := range asList(dl["changed"]) {
			out = append(out, c.(string))
		}
	}
	sort.Strings(out)
	return out, r["next_batch"].(string), r
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

func joinedMembers(t *testing.T, n *testutil.Node, u *testutil.User, roomID string) []string {
	t.Helper()
	r := n.Must(t, "GET", rpath(roomID, "/joined_members"), u.Token, nil)
	var out []string
	for id := range r["joined"].(map[string]any) {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

func equalStrings(a []string, b ...string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// alice on A creates an encrypted private room inviting bob on B; bob
// joins by room ID alone (through the inviter's server). Both servers
// then see both members, and device_lists.changed is exactly what the
// issue's example says.
func TestRemoteInviteAndJoin(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		p := newRoomPair(t, db)
		aliceSince := syncToken(t, p.a, p.alice)
		bobSince := syncToken(t, p.b, p.bob)
		roomID := p.a.Must(t, "POST", "/_matrix/client/v3/createRoom", p.alice.Token, map[string]any{
			"preset": "private_chat", "invite": []string{p.bob.UserID},
			"initial_state": []map[string]any{{"type": "m.room.encryption", "state_key": "", "content": map[string]any{"algorithm": "m.megolm.v1.aes-sha2"}}},
		})["room_id"].(string)

		// bob sees the invite with the room's stripped state.
		_, bobSince2, r := syncChanged(t, p.b, p.bob, bobSince)
		invite, _ := r["rooms"].(map[string]any)["invite"].(map[string]any)[roomID].(map[string]any)
		if invite == nil {
			t.Fatalf("bob's sync has no invite: %v", r["rooms"])
		}
		var types []string
		for _, ev := range asList(invite["invite_state"].(map[string]any)["events"]) {
			types = append(types, ev.(map[string]any)["type"].(string))
		}
		sort.Strings(types)
		if !equalStrings(types, "m.room.create", "m.room.encryption", "m.room.join_rules", "m.room.member") {
			t.Fatalf("invite_state types %v", types)
		}
		_ = bobSince2

		// alice's sync after creating the room names bob, invited.
		changed, aliceSince, _ := syncChanged(t, p.a, p.alice, aliceSince)
		if !equalStrings(changed, p.alice.UserID, p.bob.UserID) {
			t.Fatalf("alice's changed after the invite %v, want [alice bob]", changed)
		}

		p.b.Must(t, "POST", "/_matrix/client/v3/join/"+url.PathEscape(roomID), p.bob.Token, map[string]any{})
		queuesDrained(t, p.a, p.b) // B announced bob's devices to A
		if got := joinedMembers(t, p.b, p.bob, roomID); !equalStrings(got, p.alice.UserID, p.bob.UserID) {
			t.Fatalf("B's joined members %v", got)
		}
		if got := joinedMembers(t, p.a, p.alice, roomID); !equalStrings(got, p.alice.UserID, p.bob.UserID) {
			t.Fatalf("A's joined members %v", got)
		}
		changed, aliceSince, _ = syncChanged(t, p.a, p.alice, aliceSince)
		if !equalStrings(changed, p.bob.UserID) {
			t.Fatalf("alice's changed %v, want [bob]", changed)
		}
		changed, _, _ = syncChanged(t, p.b, p.bob, bobSince)
		if !equalStrings(changed, p.alice.UserID, p.bob.UserID) {
			t.Fatalf("bob's changed %v, want [alice bob]", changed)
		}
		// bob's sync made him online: the presence his server sends to A
		// arrives before alice's next sync, which then waits for the
		// device alone.
		queuesDrained(t, p.a, p.b)
		_, aliceSince, _ = syncChanged(t, p.a, p.alice, aliceSince)

		// bob adds a device: alice's waiting /sync wakes with bob in
		// changed, and A serves the new device.
		done := make(chan testutil.Response, 1)
		go func() {
			done <- p.a.Do(t, "GET", "/_matrix/client/v3/sync?timeout=10000&since="+url.QueryEscape(aliceSince), p.alice.Token, nil)
		}()
		eventually(t, "alice's sync to wait", func() bool { return p.a.Parts.Sync.WaitingSyncs() == 1 })
		second := p.b.Login(t, p.bob, "BOB2")
		p.b.Upload(t, second, map[string]any{"device_keys": second.DeviceKeys(t)})
		select {
		case r := <-done:
			changed, _ := r.Body["device_lists"].(map[string]any)["changed"].([]any)
			if r.Status != 200 || len(changed) != 1 || changed[0] != p.bob.UserID {
				t.Fatalf("alice's sync after bob's new device: %d %s", r.Status, r.Raw)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("alice's sync did not wake for bob's new device")
		}
		if got := deviceIDs(t, p.a, p.alice, p.bob.UserID); !sameSet(got, "BOB1", "BOB2") {
			t.Fatalf("A serves bob's devices %v", got)
		}

		// bob leaves: alice's sync has him in left, not in changed; A
		// stops caching his list, so a query right after is fresh.
		_, aliceSince, _ = syncChanged(t, p.a, p.alice, aliceSince)
		p.b.Must(t, "POST", rpath(roomID, "/leave"), p.bob.Token, map[string]any{})
		var left []any
		eventually(t, "A to learn of bob's leave", func() bool {
			r := p.a.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0&since="+url.QueryEscape(aliceSince), p.alice.Token, nil)
			dl, _ := r["device_lists"].(map[string]any)
			left = asList(dl["left"])
			if len(left) > 0 {
				if changed := asList(dl["changed"]); len(changed) != 0 {
					t.Fatalf("alice's changed with bob's leave: %v", changed)
				}
				aliceSince = r["next_batch"].(string)
			}
			return len(left) > 0
		})
		if len(left) != 1 || left[0] != p.bob.UserID {
			t.Fatalf("alice's left %v", left)
		}
		if got := joinedMembers(t, p.a, p.alice, roomID); !equalStrings(got, p.alice.UserID) {
			t.Fatalf("A's joined members after the leave %v", got)
		}
		if lists, err := p.a.Store.RemoteDeviceLists(context.Background(), []string{p.bob.UserID}); err != nil || lists[p.bob.UserID] != nil {
			t.Fatalf("A still caches bob's list after he left: %v %v", lists, err)
		}
		third := p.b.Login(t, p.bob, "BOB3")
		p.b.Upload(t, third, map[string]any{"device_keys": third.DeviceKeys(t)})
		if got := deviceIDs(t, p.a, p.alice, p.bob.UserID); !sameSet(got, "BOB1", "BOB2", "BOB3") {
			t.Fatalf("a query after the leave serves %v, not bob's devices now", got)
		}

		// Re-invited, bob rejoins through A (B is no longer in the room).
		p.a.Must(t, "POST", rpath(roomID, "/invite"), p.alice.Token, map[string]any{"user_id": p.bob.UserID})
		p.b.Must(t, "POST", rpath(roomID, "/join"), p.bob.Token, map[string]any{})
		for _, n := range []*testutil.Node{p.a, p.b} {
			u := p.alice
			if n == p.b {
				u = p.bob
			}
			if got := joinedMembers(t, n, u, roomID); !equalStrings(got, p.alice.UserID, p.bob.UserID) {
				t.Fatalf("%s's joined members after the rejoin %v", n.ServerName, got)
			}
		}
		changed, _, _ = syncChanged(t, p.a, p.alice, aliceSince)
		if !equalStrings(changed, p.bob.UserID) {
			t.Fatalf("alice's changed after the rejoin %v, want [bob]", changed)
		}
		// And messages flow both ways again.
		msg := p.a.Must(t, "PUT", rpath(roomID, "/send/m.room.message/m1"), p.alice.Token, map[string]any{"body": "welcome back", "msgtype": "m.text"})["event_id"].(string)
		eventually(t, "bob to receive alice's message", func() bool {
			return p.b.Do(t, "GET", rpath(roomID, "/event/"+url.PathEscape(msg)), p.bob.Token, nil).Status == 200
		})
	})
}
