package clientapi_test

import (
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

func profilePath(userID, field string) string {
	p := v3 + "/profile/" + url.PathEscape(userID)
	if field != "" {
		p += "/" + field
	}
	return p
}

func expectProfile(t *testing.T, srv *testutil.Server, userID, field string, want map[string]any) {
	t.Helper()
	got := srv.Must(t, "GET", profilePath(userID, field), "", nil)
	if len(got) != len(want) {
		t.Fatalf("profile %s %s: %v, want %v", userID, field, got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("profile %s %s: %v, want %v", userID, field, got, want)
		}
	}
}

func TestProfiles(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")

		// A new user's display name is their localpart; anyone may read it.
		expectProfile(t, srv, alice.UserID, "", map[string]any{"displayname": "alice"})
		expectProfile(t, srv, alice.UserID, "displayname", map[string]any{"displayname": "alice"})
		expectProfile(t, srv, alice.UserID, "avatar_url", map[string]any{})

		srv.Must(t, "PUT", profilePath(alice.UserID, "displayname"), alice.Token, map[string]any{"displayname": "Alice A"})
		srv.Must(t, "PUT", profilePath(alice.UserID, "avatar_url"), alice.Token, map[string]any{"avatar_url": "mxc://test.local/abc"})
		expectProfile(t, srv, alice.UserID, "", map[string]any{"displayname": "Alice A", "avatar_url": "mxc://test.local/abc"})
		expectProfile(t, srv, alice.UserID, "avatar_url", map[string]any{"avatar_url": "mxc://test.local/abc"})
		// null removes a field.
		srv.Must(t, "PUT", profilePath(alice.UserID, "avatar_url"), alice.Token, map[string]any{"avatar_url": nil})
		expectProfile(t, srv, alice.UserID, "", map[string]any{"displayname": "Alice A"})

		// Mistakes change nothing.
		for _, c := range []struct {
			who     *testutil.User
			path    string
			body    any
			status  int
			errcode string
		}{
			{bob, profilePath(alice.UserID, "displayname"), map[string]any{"displayname": "mallory"}, 403, "M_FORBIDDEN"},
			{alice, profilePath(alice.UserID, "displayname"), map[string]any{}, 400, "M_MISSING_PARAM"},
			{alice, profilePath(alice.UserID, "displayname"), map[string]any{"displayname": 7}, 400, "M_BAD_JSON"},
			{alice, profilePath(alice.UserID, "displayname"), map[string]any{"displayname": strings.Repeat("é", 257)}, 400, "M_INVALID_PARAM"},
			{alice, profilePath(alice.UserID, "avatar_url"), map[string]any{"avatar_url": strings.Repeat("a", 1001)}, 400, "M_INVALID_PARAM"},
			{alice, profilePath(alice.UserID, "displayname"), "[1]", 400, "M_BAD_JSON"},
		} {
			expectError(t, srv, "PUT", c.path, c.who.Token, c.body, c.status, c.errcode)
		}
		expectError(t, srv, "PUT", profilePath(alice.UserID, "displayname"), "", map[string]any{"displayname": "x"}, 401, "M_MISSING_TOKEN")
		expectProfile(t, srv, alice.UserID, "", map[string]any{"displayname": "Alice A"})
		srv.Must(t, "PUT", profilePath(alice.UserID, "displayname"), alice.Token, map[string]any{"displayname": strings.Repeat("é", 256)})
		srv.Must(t, "PUT", profilePath(alice.UserID, "displayname"), alice.Token, map[string]any{"displayname": "Alice A"})

		// Both fields set at once: both stay.
		carol := srv.Register(t, "carol", "")
		var wg sync.WaitGroup
		for _, f := range []struct{ field, value string }{{"displayname", "Carol"}, {"avatar_url", "mxc://test.local/c"}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				srv.Must(t, "PUT", profilePath(carol.UserID, f.field), carol.Token, map[string]any{f.field: f.value})
			}()
		}
		wg.Wait()
		expectProfile(t, srv, carol.UserID, "", map[string]any{"displayname": "Carol", "avatar_url": "mxc://test.local/c"})
		// A first change of the avatar keeps the default display name.
		srv.Must(t, "PUT", profilePath(bob.UserID, "avatar_url"), bob.Token, map[string]any{"avatar_url": "mxc://test.local/b"})
		expectProfile(t, srv, bob.UserID, "", map[string]any{"displayname": "bob", "avatar_url": "mxc://test.local/b"})

		expectError(t, srv, "GET", profilePath("@nobody:test.local", ""), "", nil, 404, "M_NOT_FOUND")
		expectError(t, srv, "GET", profilePath("not-a-user", ""), "", nil, 400, "M_INVALID_PARAM")
		// This server asks no other (the daemon does: see federationapi).
		expectError(t, srv, "GET", profilePath("@alice:elsewhere.example", ""), "", nil, 404, "M_NOT_FOUND")

		// A deactivated user has no profile.
		path := acctV3 + "/account/deactivate"
		session := acctExpectChallenge(t, srv.Do(t, "POST", path, bob.Token, map[string]any{}), "m.login.password")
		srv.Must(t, "POST", path, bob.Token, map[string]any{"auth": acctPasswordAuth("bob", bob.Password, session)})
		expectError(t, srv, "GET", profilePath(bob.UserID, ""), "", nil, 404, "M_NOT_FOUND")
	})
}

// TestProfilesInMemberEvents: joins and invites carry the user's profile,
// and a change of it is written into every room the user is in.
func TestProfilesInMemberEvents(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		srv.Must(t, "PUT", profilePath(alice.UserID, "displayname"), alice.Token, map[string]any{"displayname": "Alice"})
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "private_chat", "invite": []string{bob.UserID}})
		other := createRoom(t, srv, alice, map[string]any{"preset": "public_chat"})
		srv.Must(t, "POST", roomPath(roomID, "/join"), bob.Token, nil)
		srv.Must(t, "POST", roomPath(roomID, "/invite"), alice.Token, map[string]any{"user_id": carol.UserID})

		member := func(room, userID string) map[string]any {
			t.Helper()
			return srv.Must(t, "GET", roomPath(room, "/state/m.room.member/"+url.PathEscape(userID)), alice.Token, nil)
		}
		for _, c := range []struct {
			room, user, membership, name string
		}{
			{roomID, alice.UserID, "join", "Alice"},
			{other, alice.UserID, "join", "Alice"},
			{roomID, bob.UserID, "join", "bob"},
			{roomID, carol.UserID, "invite", "carol"},
		} {
			if m := member(c.room, c.user); m["membership"] != c.membership || m["displayname"] != c.name {
				t.Fatalf("%s's member event: %v, want %s with displayname %s", c.user, m, c.membership, c.name)
			}
		}

		since := roomSync(t, srv, bob, nil)["next_batch"].(string)
		srv.Must(t, "PUT", profilePath(alice.UserID, "displayname"), alice.Token, map[string]any{"displayname": "Alice B"})
		srv.Must(t, "PUT", profilePath(alice.UserID, "avatar_url"), alice.Token, map[string]any{"avatar_url": "mxc://test.local/a"})
		for _, room := range []string{roomID, other} {
			if m := member(room, alice.UserID); m["membership"] != "join" || m["displayname"] != "Alice B" || m["avatar_url"] != "mxc://test.local/a" {
				t.Fatalf("alice's member event after her change: %v", m)
			}
		}
		joined := srv.Must(t, "GET", roomPath(roomID, "/joined_members"), bob.Token, nil)["joined"].(map[string]any)
		if a := joined[alice.UserID].(map[string]any); a["display_name"] != "Alice B" || a["avatar_url"] != "mxc://test.local/a" {
			t.Fatalf("joined_members: %v", joined)
		}
		// bob sees both changes in his timeline, and no device list
		// change: alice was in the room already.
		next := roomSync(t, srv, bob, url.Values{"since": {since}})
		expectEvents(t, "bob's timeline", eventsOf(t, section(t, next, "join", roomID), "timeline"),
			"m.room.member|@alice:test.local|join", "m.room.member|@alice:test.local|join")
		dl, _ := next["device_lists"].(map[string]any)
		if left, _ := dl["left"].([]any); len(left) > 0 {
			t.Fatalf("a profile change reported device lists as left: %v", dl)
		}
		if changed, _ := dl["changed"].([]any); len(changed) > 0 {
			t.Fatalf("a profile change reported device lists as changed: %v", dl)
		}
	})
}
