package clientapi_test

import (
	"net/url"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

const publicRoomsPath = "/_matrix/client/v3/publicRooms"

func visibilityPath(roomID string) string {
	return "/_matrix/client/v3/directory/list/room/" + url.PathEscape(roomID)
}

func chunkIDs(t *testing.T, page map[string]any) []string {
	t.Helper()
	var out []string
	for _, c := range page["chunk"].([]any) {
		out = append(out, c.(map[string]any)["room_id"].(string))
	}
	return out
}

func TestPublicRoomDirectory(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		cake := createRoom(t, srv, alice, map[string]any{"visibility": "public", "preset": "public_chat",
			"name": "Cake lovers", "topic": "All about CAKE", "room_alias_name": "cake"})
		private := createRoom(t, srv, bob, map[string]any{"preset": "private_chat", "name": "secret cake"})

		// Listed without a token; only the published room.
		page := srv.Must(t, "GET", publicRoomsPath, "", nil)
		if ids := chunkIDs(t, page); len(ids) != 1 || ids[0] != cake {
			t.Fatalf("directory %v", page)
		}
		entry := page["chunk"].([]any)[0].(map[string]any)
		if entry["name"] != "Cake lovers" || entry["topic"] != "All about CAKE" || entry["canonical_alias"] != "#cake:"+srv.ServerName ||
			entry["num_joined_members"] != float64(1) || entry["join_rule"] != "public" || entry["world_readable"] != false ||
			entry["guest_can_join"] != false || page["total_room_count_estimate"] != float64(1) {
			t.Fatalf("entry %v", page)
		}
		if v := srv.Must(t, "GET", visibilityPath(cake), "", nil); v["visibility"] != "public" {
			t.Fatalf("visibility %v", v)
		}
		if v := srv.Must(t, "GET", visibilityPath(private), "", nil); v["visibility"] != "private" {
			t.Fatalf("visibility %v", v)
		}

		// Who may change an entry: a joined member with the power to set
		// the canonical alias.
		fails := func(method, path, token string, body any, status int, errcode string) {
			t.Helper()
			if r := srv.Do(t, method, path, token, body); r.Status != status || r.Errcode() != errcode {
				t.Fatalf("%s %s %v: %d %s, want %d %s", method, path, body, r.Status, r.Raw, status, errcode)
			}
		}
		fails("PUT", visibilityPath(private), alice.Token, map[string]any{"visibility": "public"}, 403, "M_FORBIDDEN")
		srv.Must(t, "POST", "/_matrix/client/v3/rooms/"+url.PathEscape(cake)+"/join", bob.Token, map[string]any{})
		fails("PUT", visibilityPath(cake), bob.Token, map[string]any{"visibility": "private"}, 403, "M_FORBIDDEN")
		fails("PUT", visibilityPath(cake), alice.Token, map[string]any{"visibility": "secret"}, 400, "M_INVALID_PARAM")
		fails("PUT", visibilityPath(cake), alice.Token, map[string]any{}, 400, "M_MISSING_PARAM")
		fails("PUT", visibilityPath(cake), "", map[string]any{"visibility": "private"}, 401, "M_MISSING_TOKEN")
		fails("GET", visibilityPath("!unknown:"+srv.ServerName), "", nil, 404, "M_NOT_FOUND")
		fails("GET", publicRoomsPath+"?limit=-1", "", nil, 400, "M_INVALID_PARAM")
		fails("GET", publicRoomsPath+"?since=nonsense", "", nil, 400, "M_INVALID_PARAM")
		fails("POST", publicRoomsPath, "", map[string]any{}, 401, "M_MISSING_TOKEN")
		fails("POST", publicRoomsPath, alice.Token, map[string]any{"filter": "cake"}, 400, "M_BAD_JSON")
		if ids := chunkIDs(t, srv.Must(t, "GET", publicRoomsPath, "", nil)); len(ids) != 1 || ids[0] != cake {
			t.Fatalf("refused changes changed the directory: %v", ids)
		}

		srv.Must(t, "PUT", visibilityPath(private), bob.Token, map[string]any{"visibility": "public"})
		srv.Must(t, "PUT", visibilityPath(cake), alice.Token, map[string]any{"visibility": "private"})
		if ids := chunkIDs(t, srv.Must(t, "GET", publicRoomsPath, "", nil)); len(ids) != 1 || ids[0] != private {
			t.Fatalf("after the changes: %v", ids)
		}
		srv.Must(t, "PUT", visibilityPath(cake), alice.Token, map[string]any{"visibility": "public"})

		// Most members first (cake has two), then by room ID; pages.
		var more []string
		for _, name := range []string{"one", "two", "three"} {
			more = append(more, createRoom(t, srv, alice, map[string]any{"visibility": "public", "name": name}))
		}
		first := srv.Must(t, "GET", publicRoomsPath+"?limit=2", "", nil)
		ids := chunkIDs(t, first)
		if len(ids) != 2 || ids[0] != cake || first["next_batch"] == nil || first["prev_batch"] != nil || first["total_room_count_estimate"] != float64(5) {
			t.Fatalf("first page %v", first)
		}
		seen := map[string]bool{ids[0]: true, ids[1]: true}
		next := first
		for next["next_batch"] != nil {
			next = srv.Must(t, "GET", publicRoomsPath+"?limit=2&since="+url.QueryEscape(next["next_batch"].(string)), "", nil)
			if next["prev_batch"] == nil {
				t.Fatalf("a later page without prev_batch: %v", next)
			}
			for _, id := range chunkIDs(t, next) {
				if seen[id] {
					t.Fatalf("%s on two pages", id)
				}
				seen[id] = true
			}
		}
		if len(seen) != 5 {
			t.Fatalf("pages held %d rooms, want 5", len(seen))
		}

		// A filter, by a user: the term in any case, in name, topic or alias.
		for term, want := range map[string]string{"cake LOVERS": cake, "all about": cake, "#cake:": cake, "THREE": more[2]} {
			got := chunkIDs(t, srv.Must(t, "POST", publicRoomsPath, bob.Token, map[string]any{"filter": map[string]any{"generic_search_term": term}}))
			if len(got) != 1 || got[0] != want {
				t.Fatalf("search %q: %v", term, got)
			}
		}
		space := createRoom(t, srv, alice, map[string]any{"visibility": "public", "name": "a space",
			"creation_content": map[string]any{"type": "m.space"}})
		got := chunkIDs(t, srv.Must(t, "POST", publicRoomsPath, bob.Token, map[string]any{"filter": map[string]any{"room_types": []any{"m.space"}}}))
		if len(got) != 1 || got[0] != space {
			t.Fatalf("spaces %v", got)
		}
		got = chunkIDs(t, srv.Must(t, "POST", publicRoomsPath, bob.Token, map[string]any{"filter": map[string]any{"room_types": []any{nil}}}))
		if len(got) != 5 {
			t.Fatalf("rooms without a type %v", got)
		}
	})
}
