package clientapi_test

import (
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/voip"
)

const userSearch = "/_matrix/client/v3/user_directory/search"

func foundUsers(t *testing.T, res map[string]any) []string {
	t.Helper()
	var out []string
	for _, r := range res["results"].([]any) {
		out = append(out, r.(map[string]any)["user_id"].(string))
	}
	return out
}

func TestUserDirectory(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		dan := srv.Register(t, "dan", "")
		srv.Must(t, "PUT", "/_matrix/client/v3/profile/"+url.PathEscape(bob.UserID)+"/displayname", bob.Token, map[string]any{"displayname": "Bobby Tables"})

		search := func(u *testutil.User, term string, limit int) map[string]any {
			t.Helper()
			body := map[string]any{"search_term": term}
			if limit > 0 {
				body["limit"] = limit
			}
			return srv.Must(t, "POST", userSearch, u.Token, body)
		}
		// Nobody shares a room with alice yet.
		if got := foundUsers(t, search(alice, "bob", 0)); len(got) != 0 {
			t.Fatalf("before sharing a room: %v", got)
		}
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "private_chat", "invite": []string{bob.UserID}})
		srv.Must(t, "POST", roomPath(roomID, "/join"), bob.Token, map[string]any{})
		// By display name, in any case, and by user ID.
		res := search(alice, "TABLES", 0)
		if got := foundUsers(t, res); !slices.Equal(got, []string{bob.UserID}) || res["limited"] != false {
			t.Fatalf("search by name: %v", res)
		}
		if r := res["results"].([]any)[0].(map[string]any); r["display_name"] != "Bobby Tables" {
			t.Fatalf("result %v", r)
		}
		if got := foundUsers(t, search(alice, "@bob:", 0)); !slices.Equal(got, []string{bob.UserID}) {
			t.Fatalf("search by ID: %v", got)
		}
		// A profile change is found at once; carol, in no shared room, is not.
		srv.Must(t, "PUT", "/_matrix/client/v3/profile/"+url.PathEscape(bob.UserID)+"/displayname", bob.Token, map[string]any{"displayname": "Robert"})
		if got := foundUsers(t, search(alice, "robert", 0)); !slices.Equal(got, []string{bob.UserID}) {
			t.Fatalf("after the rename: %v", got)
		}
		if got := foundUsers(t, search(alice, "carol", 0)); len(got) != 0 {
			t.Fatalf("carol without a shared room: %v", got)
		}
		// Members of a room in the public directory are found by anyone.
		public := createRoom(t, srv, carol, map[string]any{"preset": "public_chat", "visibility": "public"})
		if got := foundUsers(t, search(alice, "carol", 0)); !slices.Equal(got, []string{carol.UserID}) {
			t.Fatalf("carol in a public room: %v", got)
		}
		// Leaving ends it.
		srv.Must(t, "POST", roomPath(public, "/leave"), carol.Token, map[string]any{})
		srv.Must(t, "POST", roomPath(roomID, "/leave"), bob.Token, map[string]any{})
		if got := foundUsers(t, search(alice, "robert", 0)); len(got) != 0 {
			t.Fatalf("after bob left: %v", got)
		}
		// The limit, and limited.
		for _, u := range []*testutil.User{bob, carol, dan} {
			srv.Must(t, "POST", roomPath(roomID, "/invite"), alice.Token, map[string]any{"user_id": u.UserID})
			srv.Must(t, "POST", roomPath(roomID, "/join"), u.Token, map[string]any{})
		}
		res = search(alice, ":"+srv.ServerName, 2)
		if got := foundUsers(t, res); len(got) != 2 || res["limited"] != true {
			t.Fatalf("limit 2: %v", res)
		}
		// Mistakes.
		for _, c := range []struct {
			body    any
			errcode string
		}{{map[string]any{}, "M_MISSING_PARAM"}, {map[string]any{"search_term": "a", "limit": -1}, "M_INVALID_PARAM"},
			{map[string]any{"search_term": 5}, "M_BAD_JSON"}} {
			if r := srv.Do(t, "POST", userSearch, alice.Token, c.body); r.Status != 400 || r.Errcode() != c.errcode {
				t.Fatalf("%v: %d %s", c.body, r.Status, r.Raw)
			}
		}
		if r := srv.Do(t, "POST", userSearch, "", map[string]any{"search_term": "a"}); r.Status != 401 {
			t.Fatalf("without a token: %d", r.Status)
		}
	})
}

func TestUserDirectorySearchAllUsers(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{SearchAllUsers: true})
		alice := srv.Register(t, "alice", "")
		srv.Register(t, "under_score", "")
		srv.Register(t, "percent", "")
		if got := foundUsers(t, srv.Must(t, "POST", userSearch, alice.Token, map[string]any{"search_term": "UNDER"})); len(got) != 1 {
			t.Fatalf("every local user: %v", got)
		}
		// LIKE's wildcards in the term match themselves only.
		if got := foundUsers(t, srv.Must(t, "POST", userSearch, alice.Token, map[string]any{"search_term": "_"})); !slices.Equal(got, []string{"@under_score:" + srv.ServerName}) {
			t.Fatalf("search for _: %v", got)
		}
		if got := foundUsers(t, srv.Must(t, "POST", userSearch, alice.Token, map[string]any{"search_term": "%"})); len(got) != 0 {
			t.Fatalf("search for %%: %v", got)
		}
	})
}

func TestTurnServerAndThirdParty(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		none := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := none.Register(t, "alice", "")
		if got := none.Must(t, "GET", "/_matrix/client/v3/voip/turnServer", alice.Token, nil); len(got) != 0 {
			t.Fatalf("no TURN server: %v", got)
		}
		if got := none.Must(t, "GET", "/_matrix/client/v3/thirdparty/protocols", alice.Token, nil); len(got) != 0 {
			t.Fatalf("protocols: %v", got)
		}
		now := time.Unix(1_800_000_000, 0)
		srv := testutil.NewServer(t, testutil.SQLite(t), testutil.ServerOptions{Now: func() time.Time { return now },
			TURN: voip.Config{URIs: []string{"turn:turn.example.org"}, SharedSecret: "s", UserLifetime: time.Hour}})
		bob := srv.Register(t, "bob", "")
		got := srv.Must(t, "GET", "/_matrix/client/v3/voip/turnServer", bob.Token, nil)
		if got["username"] != "1800003600:"+bob.UserID || got["password"] == "" || got["ttl"] != float64(3600) || len(got["uris"].([]any)) != 1 {
			t.Fatalf("turnServer %v", got)
		}
	})
}
