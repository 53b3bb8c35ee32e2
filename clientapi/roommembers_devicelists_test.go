package clientapi_test

import (
	"net/url"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

// syncLists returns device_lists.changed and .left of u's /sync since a
// token, and the next token.
func syncLists(t *testing.T, srv *testutil.Server, u *testutil.User, since string) (changed, left []string, next string) {
	t.Helper()
	r := srv.Must(t, "GET", v3+"/sync?timeout=0&since="+since, u.Token, nil)
	lists := r["device_lists"].(map[string]any)
	return strs(t, lists["changed"]), strs(t, lists["left"]), r["next_batch"].(string)
}

// Room membership drives device lists: an invite makes the invitee and the
// room share it (as Synapse counts it), a join shows the joiner everyone
// in the room, themselves included, and a leave puts the user in "left".
func TestRoomMembershipDrivesDeviceLists(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		for _, u := range []*testutil.User{alice, bob, carol} {
			srv.Upload(t, u, map[string]any{"device_keys": u.DeviceKeys(t)})
		}

		// The example: an encrypted private room inviting bob;
		// bob joins.
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "private_chat", "invite": []string{bob.UserID},
			"initial_state": []any{map[string]any{"type": "m.room.encryption", "content": map[string]any{"algorithm": "m.megolm.v1.aes-sha2"}}}})
		aliceSince, bobSince := syncToken(t, srv, alice), syncToken(t, srv, bob)
		// alice waits; bob's join wakes her.
		ch := syncAsync(t, srv, alice, aliceSince, 1)
		srv.Must(t, "POST", roomPath(roomID, "/join"), bob.Token, nil)
		woken := receive(t, ch)
		expectUsers(t, "alice's woken sync", strs(t, woken.Body["device_lists"].(map[string]any)["changed"]), []string{bob.UserID})
		changed, left, _ := syncLists(t, srv, alice, aliceSince)
		expectUsers(t, "alice's changed after bob joins", changed, []string{bob.UserID})
		expectUsers(t, "alice's left", left, nil)
		changed, _, bobSince = syncLists(t, srv, bob, bobSince)
		expectUsers(t, "bob's changed after joining", changed, []string{alice.UserID, bob.UserID})

		// A new device of bob's reaches alice.
		aliceSince = syncToken(t, srv, alice)
		bob2 := srv.Login(t, bob, "")
		srv.Upload(t, bob2, map[string]any{"device_keys": bob2.DeviceKeys(t)})
		changed, _, aliceSince = syncLists(t, srv, alice, aliceSince)
		expectUsers(t, "alice's changed after bob's new device", changed, []string{bob.UserID})

		// bob leaves: he is in alice's left and not in her changed again.
		srv.Must(t, "POST", roomPath(roomID, "/leave"), bob.Token, nil)
		changed, left, aliceSince = syncLists(t, srv, alice, aliceSince)
		expectUsers(t, "alice's changed after bob leaves", changed, nil)
		expectUsers(t, "alice's left after bob leaves", left, []string{bob.UserID})
		bob3 := srv.Login(t, bob, "")
		srv.Upload(t, bob3, map[string]any{"device_keys": bob3.DeviceKeys(t)})
		changed, _, aliceSince = syncLists(t, srv, alice, aliceSince)
		expectUsers(t, "alice's changed after a stranger's new device", changed, nil)

		// An invite alone shares the room: each sees the other.
		bobSince = syncToken(t, srv, bob)
		srv.Must(t, "POST", roomPath(roomID, "/invite"), alice.Token, map[string]any{"user_id": bob.UserID})
		changed, _, aliceSince = syncLists(t, srv, alice, aliceSince)
		expectUsers(t, "alice's changed after inviting bob", changed, []string{bob.UserID})
		changed, _, bobSince = syncLists(t, srv, bob, bobSince)
		expectUsers(t, "bob's changed after his invite", changed, []string{alice.UserID, bob.UserID})
		// Rejoining: changed again, nothing left.
		srv.Must(t, "POST", v3+"/join/"+url.PathEscape(roomID), bob.Token, nil)
		changed, left, _ = syncLists(t, srv, alice, aliceSince)
		expectUsers(t, "alice's changed after bob rejoins", changed, []string{bob.UserID})
		expectUsers(t, "alice's left after bob rejoins", left, nil)

		// A rejected invite and a kick both end the sharing.
		srv.Must(t, "POST", roomPath(roomID, "/invite"), alice.Token, map[string]any{"user_id": carol.UserID})
		aliceSince = syncToken(t, srv, alice)
		srv.Must(t, "POST", roomPath(roomID, "/leave"), carol.Token, nil)
		_, left, aliceSince = syncLists(t, srv, alice, aliceSince)
		expectUsers(t, "alice's left after carol rejects", left, []string{carol.UserID})
		srv.Must(t, "POST", roomPath(roomID, "/kick"), alice.Token, map[string]any{"user_id": bob.UserID})
		_, left, _ = syncLists(t, srv, alice, aliceSince)
		expectUsers(t, "alice's left after kicking bob", left, []string{bob.UserID})
		// The kicked user sees alice in left too, and carol, who shared
		// the room with him for a while since his token.
		_, left, _ = syncLists(t, srv, bob, bobSince)
		expectUsers(t, "bob's left after the kick", left, []string{alice.UserID, carol.UserID})

		// A refused event changes no membership.
		before := syncToken(t, srv, alice)
		expectError(t, srv, "POST", roomPath(roomID, "/join"), carol.Token, nil, 403, "M_FORBIDDEN")
		if after := syncToken(t, srv, alice); after != before {
			t.Fatalf("a refused join advanced the stream: %s -> %s", before, after)
		}
	})
}

// The admin endpoint still feeds membership, into the same rooms as
// membership events.
func TestAdminMembershipBesideRoomEvents(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "public_chat"})
		since := syncToken(t, srv, alice)
		srv.Join(t, roomID, "@dave:remote.example")
		changed, _, _ := syncLists(t, srv, alice, since)
		expectUsers(t, "changed after a remote join", changed, []string{"@dave:remote.example"})
	})
}
