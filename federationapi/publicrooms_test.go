package federationapi_test

import (
	"net/url"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

// A user of B reads A's public room directory through B (federation
// /publicRooms, GET and, with a filter, POST), and A answers other servers
// directly.
func TestFederationPublicRooms(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a := testutil.StartNode(t, db, nil)
		b := testutil.StartNode(t, testutil.SQLite(t), nil)
		alice := a.Register(t, "alice", "")
		listed := a.Must(t, "POST", clientV3+"/createRoom", alice.Token, map[string]any{
			"preset": "public_chat", "visibility": "public", "name": "Federated cake"})["room_id"].(string)
		a.Must(t, "POST", clientV3+"/createRoom", alice.Token, map[string]any{"preset": "public_chat", "name": "unlisted"})
		bob := b.Register(t, "bob", "")

		ids := func(page map[string]any) []string {
			var out []string
			for _, c := range page["chunk"].([]any) {
				out = append(out, c.(map[string]any)["room_id"].(string))
			}
			return out
		}
		page := b.Must(t, "GET", clientV3+"/publicRooms?server="+url.QueryEscape(a.ServerName), bob.Token, nil)
		if got := ids(page); len(got) != 1 || got[0] != listed || page["chunk"].([]any)[0].(map[string]any)["name"] != "Federated cake" {
			t.Fatalf("A's directory through B: %v", page)
		}
		filtered := b.Must(t, "POST", clientV3+"/publicRooms?server="+url.QueryEscape(a.ServerName), bob.Token,
			map[string]any{"filter": map[string]any{"generic_search_term": "CAKE"}})
		if got := ids(filtered); len(got) != 1 || got[0] != listed {
			t.Fatalf("A's directory filtered through B: %v", filtered)
		}
		none := b.Must(t, "POST", clientV3+"/publicRooms?server="+url.QueryEscape(a.ServerName), bob.Token,
			map[string]any{"filter": map[string]any{"generic_search_term": "pie"}})
		if got := ids(none); len(got) != 0 {
			t.Fatalf("a search for pie: %v", none)
		}
		// B's own directory is empty; a server name that is none is 400.
		if got := ids(b.Must(t, "GET", clientV3+"/publicRooms", bob.Token, nil)); len(got) != 0 {
			t.Fatalf("B's directory %v", got)
		}
		if r := b.Do(t, "GET", clientV3+"/publicRooms?server="+url.QueryEscape("bad:server:name"), bob.Token, nil); r.Status != 400 || r.Errcode() != "M_INVALID_PARAM" {
			t.Fatalf("a bad server name: %d %s", r.Status, r.Raw)
		}
		// Asking another server takes a user: no token, no request out.
		if r := b.Do(t, "GET", clientV3+"/publicRooms?server="+url.QueryEscape(a.ServerName), "", nil); r.Status != 401 || r.Errcode() != "M_MISSING_TOKEN" {
			t.Fatalf("another server's directory without a token: %d %s", r.Status, r.Raw)
		}

		// Asked directly, signed by B.
		direct := fedMust(t, a, asNode(t, b), "GET", "/_matrix/federation/v1/publicRooms?limit=5", nil)
		if got := ids(direct); len(got) != 1 || got[0] != listed {
			t.Fatalf("federation /publicRooms: %v", direct)
		}
		expectFedError(t, a, asNode(t, b), "GET", "/_matrix/federation/v1/publicRooms?limit=x", nil, 400, "M_INVALID_PARAM")
	})
}
