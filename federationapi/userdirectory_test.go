package federationapi_test

import (
	"net/url"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

// The user directory of one daemon finds a user of another once they
// share a room, by user ID and by the display name their member event
// carries, and not before.
func TestUserDirectoryFindsRemoteUser(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a, b := testutil.StartNode(t, db, nil), testutil.StartNode(t, testutil.SQLite(t), nil)
		alice := a.Register(t, "alice", "")
		bob := b.Register(t, "bob", "")
		b.Must(t, "PUT", clientV3+"/profile/"+url.PathEscape(bob.UserID)+"/displayname", bob.Token, map[string]any{"displayname": "Bobby Tables"})
		search := func(term string) []map[string]any {
			t.Helper()
			r := a.Must(t, "POST", clientV3+"/user_directory/search", alice.Token, map[string]any{"search_term": term})
			var out []map[string]any
			for _, e := range asList(r["results"]) {
				out = append(out, e.(map[string]any))
			}
			return out
		}
		if got := search("bob"); len(got) != 0 {
			t.Fatalf("bob found before sharing a room: %v", got)
		}
		room := a.Must(t, "POST", clientV3+"/createRoom", alice.Token, map[string]any{"preset": "public_chat"})["room_id"].(string)
		joinVia(t, b, bob, room, a)
		eventually(t, "bob's join on alice's server", func() bool {
			r := a.Do(t, "GET", rpath(room, "/state/m.room.member/"+url.PathEscape(bob.UserID)), alice.Token, nil)
			return r.Status == 200 && r.Body["membership"] == "join"
		})
		for _, term := range []string{"bob", "Tables", b.ServerName} {
			got := search(term)
			if len(got) != 1 || got[0]["user_id"] != bob.UserID || got[0]["display_name"] != "Bobby Tables" {
				t.Fatalf("search %q: %v", term, got)
			}
		}
	})
}
