package clientapi_test

import (
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

func hierarchyPath(roomID, query string) string {
	p := "/_matrix/client/v1/rooms/" + url.PathEscape(roomID) + "/hierarchy"
	if query != "" {
		p += "?" + query
	}
	return p
}

func summaryPath(room, query string) string {
	p := "/_matrix/client/v1/room_summary/" + url.PathEscape(room)
	if query != "" {
		p += "?" + query
	}
	return p
}

// hierarchyRooms returns the room IDs of a hierarchy page, and the page's
// rooms by ID.
func hierarchyRooms(t *testing.T, page map[string]any) ([]string, map[string]map[string]any) {
	t.Helper()
	ids := []string{}
	byID := map[string]map[string]any{}
	rooms, ok := page["rooms"].([]any)
	if !ok {
		t.Fatalf("no rooms in %v", page)
	}
	for _, r := range rooms {
		m := r.(map[string]any)
		ids = append(ids, m["room_id"].(string))
		byID[m["room_id"].(string)] = m
	}
	return ids, byID
}

// spaceFixture is a space with a subspace, public rooms, a world-readable
// room, a private room, a child removed (no via) and a child not known
// anywhere:
//
//	space: r1 (order "a"), sub (order "b", suggested), private (order "c"),
//	       r3 (no order, suggested), gone (via []), unknown (no order)
//	sub:   r2 (order "x"), world (order "y", suggested)
type spaceFixture struct {
	srv                                          *testutil.Server
	alice, bob                                   *testutil.User
	space, sub, r1, r2, r3, world, private, gone string
	unknown                                      string
}

func newSpaceFixture(t *testing.T, db testutil.Database) spaceFixture {
	srv := testutil.NewServer(t, db, testutil.ServerOptions{})
	f := spaceFixture{srv: srv, alice: srv.Register(t, "alice", ""), bob: srv.Register(t, "bob", "")}
	space := map[string]any{"type": "m.space"}
	f.space = createRoom(t, srv, f.alice, map[string]any{"preset": "public_chat", "name": "The space", "topic": "all of it",
		"creation_content": space, "room_alias_name": "space"})
	f.sub = createRoom(t, srv, f.alice, map[string]any{"preset": "public_chat", "name": "Subspace", "creation_content": space})
	f.r1 = createRoom(t, srv, f.alice, map[string]any{"preset": "public_chat", "name": "Room one", "room_alias_name": "one",
		"initial_state": []any{map[string]any{"type": "m.room.avatar", "content": map[string]any{"url": "mxc://x/y"}}}})
	f.r2 = createRoom(t, srv, f.alice, map[string]any{"preset": "public_chat", "name": "Room two"})
	f.r3 = createRoom(t, srv, f.alice, map[string]any{"preset": "public_chat", "name": "Room three"})
	f.world = createRoom(t, srv, f.alice, map[string]any{"preset": "private_chat", "name": "Readable",
		"initial_state": []any{map[string]any{"type": "m.room.history_visibility", "content": map[string]any{"history_visibility": "world_readable"}}}})
	f.private = createRoom(t, srv, f.alice, map[string]any{"preset": "private_chat", "name": "Secret",
		"initial_state": []any{map[string]any{"type": "m.room.encryption", "content": map[string]any{"algorithm": "m.megolm.v1.aes-sha2"}}}})
	f.gone = createRoom(t, srv, f.alice, map[string]any{"preset": "public_chat", "name": "Removed"})
	f.unknown = "!nowhere:" + srv.ServerName
	child := func(parent, child string, content map[string]any) {
		t.Helper()
		srv.Must(t, "PUT", v3+"/rooms/"+url.PathEscape(parent)+"/state/m.space.child/"+url.PathEscape(child), f.alice.Token, content)
	}
	via := []string{srv.ServerName}
	child(f.space, f.unknown, map[string]any{"via": via})
	child(f.space, f.r3, map[string]any{"via": via, "suggested": true})
	child(f.space, f.private, map[string]any{"via": via, "order": "c"})
	child(f.space, f.sub, map[string]any{"via": via, "order": "b", "suggested": true})
	child(f.space, f.r1, map[string]any{"via": via, "order": "a"})
	child(f.space, f.gone, map[string]any{"via": via})
	child(f.space, f.gone, map[string]any{}) // removed: no via
	child(f.sub, f.world, map[string]any{"via": via, "order": "y", "suggested": true})
	child(f.sub, f.r2, map[string]any{"via": via, "order": "x"})
	return f
}

func TestSpaceHierarchy(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		f := newSpaceFixture(t, db)
		srv := f.srv

		// The whole hierarchy, depth first in each space's order: the
		// private room is left out for bob, the removed and the unknown
		// children too.
		page := srv.Must(t, "GET", hierarchyPath(f.space, ""), f.bob.Token, nil)
		ids, rooms := hierarchyRooms(t, page)
		if want := []string{f.space, f.r1, f.sub, f.r2, f.world, f.r3}; !slices.Equal(ids, want) {
			t.Fatalf("bob's hierarchy %v, want %v", ids, want)
		}
		if _, ok := page["next_batch"]; ok {
			t.Fatalf("a whole hierarchy has a next_batch: %v", page)
		}
		top := rooms[f.space]
		if top["name"] != "The space" || top["topic"] != "all of it" || top["canonical_alias"] != "#space:"+srv.ServerName ||
			top["room_type"] != "m.space" || top["join_rule"] != "public" || top["num_joined_members"] != float64(1) ||
			top["world_readable"] != false || top["guest_can_join"] != false {
			t.Fatalf("the space's entry %v", top)
		}
		var children []string
		for _, c := range top["children_state"].([]any) {
			ev := c.(map[string]any)
			if ev["type"] != "m.space.child" || ev["sender"] != f.alice.UserID || ev["origin_server_ts"] == nil || ev["content"] == nil {
				t.Fatalf("a stripped child event %v", ev)
			}
			if _, ok := ev["event_id"]; ok {
				t.Fatalf("a stripped child event has an event ID: %v", ev)
			}
			children = append(children, ev["state_key"].(string))
		}
		if want := []string{f.r1, f.sub, f.private}; len(children) != 5 || !slices.Equal(children[:3], want) ||
			slices.Contains(children, f.gone) || !slices.Contains(children, f.r3) || !slices.Contains(children, f.unknown) {
			t.Fatalf("the space's children %v", children)
		}
		if r1 := rooms[f.r1]; r1["name"] != "Room one" || r1["avatar_url"] != "mxc://x/y" || r1["canonical_alias"] != "#one:"+srv.ServerName ||
			r1["room_type"] != nil || len(r1["children_state"].([]any)) != 0 {
			t.Fatalf("a room's entry %v", r1)
		}
		if w := rooms[f.world]; w["world_readable"] != true || w["join_rule"] != "invite" {
			t.Fatalf("the world-readable room's entry %v", w)
		}
		if len(rooms[f.sub]["children_state"].([]any)) != 2 {
			t.Fatalf("the subspace's children %v", rooms[f.sub])
		}

		// alice is in the private room.
		ids, _ = hierarchyRooms(t, srv.Must(t, "GET", hierarchyPath(f.space, ""), f.alice.Token, nil))
		if want := []string{f.space, f.r1, f.sub, f.r2, f.world, f.private, f.r3}; !slices.Equal(ids, want) {
			t.Fatalf("alice's hierarchy %v, want %v", ids, want)
		}

		// suggested_only keeps the suggested children, and the space's
		// children_state only theirs.
		page = srv.Must(t, "GET", hierarchyPath(f.space, "suggested_only=true"), f.bob.Token, nil)
		ids, rooms = hierarchyRooms(t, page)
		if want := []string{f.space, f.sub, f.world, f.r3}; !slices.Equal(ids, want) {
			t.Fatalf("suggested only %v, want %v", ids, want)
		}
		if n := len(rooms[f.space]["children_state"].([]any)); n != 2 {
			t.Fatalf("suggested children_state %v", rooms[f.space])
		}

		// max_depth.
		ids, _ = hierarchyRooms(t, srv.Must(t, "GET", hierarchyPath(f.space, "max_depth=1"), f.bob.Token, nil))
		if want := []string{f.space, f.r1, f.sub, f.r3}; !slices.Equal(ids, want) {
			t.Fatalf("max_depth=1 %v, want %v", ids, want)
		}
		ids, _ = hierarchyRooms(t, srv.Must(t, "GET", hierarchyPath(f.space, "max_depth=0"), f.bob.Token, nil))
		if want := []string{f.space}; !slices.Equal(ids, want) {
			t.Fatalf("max_depth=0 %v", ids)
		}
		// A subspace's own hierarchy.
		ids, _ = hierarchyRooms(t, srv.Must(t, "GET", hierarchyPath(f.sub, ""), f.bob.Token, nil))
		if want := []string{f.sub, f.r2, f.world}; !slices.Equal(ids, want) {
			t.Fatalf("the subspace's hierarchy %v", ids)
		}

		// Pages of two, with from, add up to the whole.
		var all []string
		from := ""
		for pages := 0; ; pages++ {
			if pages > 5 {
				t.Fatalf("too many pages: %v", all)
			}
			q := "limit=2"
			if from != "" {
				q += "&from=" + url.QueryEscape(from)
			}
			page := srv.Must(t, "GET", hierarchyPath(f.space, q), f.bob.Token, nil)
			ids, _ := hierarchyRooms(t, page)
			if len(ids) > 2 {
				t.Fatalf("a page of %d rooms with limit=2", len(ids))
			}
			all = append(all, ids...)
			next, _ := page["next_batch"].(string)
			if next == "" {
				break
			}
			if pages == 0 {
				// A token is for the request it continues.
				expectError(t, srv, "GET", hierarchyPath(f.space, "limit=2&suggested_only=true&from="+url.QueryEscape(next)), f.bob.Token, nil, 400, "M_INVALID_PARAM")
				expectError(t, srv, "GET", hierarchyPath(f.sub, "limit=2&from="+url.QueryEscape(next)), f.bob.Token, nil, 400, "M_INVALID_PARAM")
				expectError(t, srv, "GET", hierarchyPath(f.space, "limit=2&from="+url.QueryEscape(next)), f.alice.Token, nil, 400, "M_INVALID_PARAM")
			}
			from = next
		}
		if want := []string{f.space, f.r1, f.sub, f.r2, f.world, f.r3}; !slices.Equal(all, want) {
			t.Fatalf("the pages %v, want %v", all, want)
		}

		// Rooms bob may not preview, and bad requests.
		expectError(t, srv, "GET", hierarchyPath(f.private, ""), f.bob.Token, nil, 403, "M_FORBIDDEN")
		expectError(t, srv, "GET", hierarchyPath(f.unknown, ""), f.bob.Token, nil, 403, "M_FORBIDDEN")
		expectError(t, srv, "GET", hierarchyPath(f.space, ""), "", nil, 401, "M_MISSING_TOKEN")
		expectError(t, srv, "GET", hierarchyPath(f.space, "limit=0"), f.bob.Token, nil, 400, "M_INVALID_PARAM")
		expectError(t, srv, "GET", hierarchyPath(f.space, "limit=x"), f.bob.Token, nil, 400, "M_INVALID_PARAM")
		expectError(t, srv, "GET", hierarchyPath(f.space, "max_depth=-1"), f.bob.Token, nil, 400, "M_INVALID_PARAM")
		expectError(t, srv, "GET", hierarchyPath(f.space, "suggested_only=maybe"), f.bob.Token, nil, 400, "M_INVALID_PARAM")
		expectError(t, srv, "GET", hierarchyPath(f.space, "from=nonsense"), f.bob.Token, nil, 400, "M_INVALID_PARAM")
		expectError(t, srv, "GET", hierarchyPath("not-a-room", ""), f.bob.Token, nil, 400, "M_INVALID_PARAM")

		// Once invited, bob sees the private room; its children would be
		// walked like any other's.
		srv.Must(t, "POST", v3+"/rooms/"+url.PathEscape(f.private)+"/invite", f.alice.Token, map[string]any{"user_id": f.bob.UserID})
		ids, _ = hierarchyRooms(t, srv.Must(t, "GET", hierarchyPath(f.space, "max_depth=1"), f.bob.Token, nil))
		if want := []string{f.space, f.r1, f.sub, f.private, f.r3}; !slices.Equal(ids, want) {
			t.Fatalf("after the invite %v, want %v", ids, want)
		}
		// Also under MSC2946's prefix.
		ids, _ = hierarchyRooms(t, srv.Must(t, "GET", strings.Replace(hierarchyPath(f.sub, ""), "/v1/", "/unstable/org.matrix.msc2946/", 1), f.bob.Token, nil))
		if want := []string{f.sub, f.r2, f.world}; !slices.Equal(ids, want) {
			t.Fatalf("the unstable path %v", ids)
		}
	})
}

func TestRoomSummary(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		f := newSpaceFixture(t, db)
		srv := f.srv

		// A public room bob is not in: its entry, his membership "leave".
		s := srv.Must(t, "GET", summaryPath(f.r1, ""), f.bob.Token, nil)
		if s["room_id"] != f.r1 || s["name"] != "Room one" || s["canonical_alias"] != "#one:"+srv.ServerName || s["join_rule"] != "public" ||
			s["num_joined_members"] != float64(1) || s["membership"] != "leave" || s["room_version"] == nil || s["room_version"] == "" ||
			s["world_readable"] != false || s["guest_can_join"] != false || s["avatar_url"] != "mxc://x/y" {
			t.Fatalf("the summary of a public room %v", s)
		}
		if _, ok := s["children_state"]; ok {
			t.Fatalf("a summary with children_state %v", s)
		}
		// By alias, without a token (no membership), and on the unstable
		// path.
		s = srv.Must(t, "GET", summaryPath("#space:"+srv.ServerName, ""), "", nil)
		if s["room_id"] != f.space || s["room_type"] != "m.space" || s["membership"] != nil {
			t.Fatalf("the space's summary by alias %v", s)
		}
		s = srv.Must(t, "GET", "/_matrix/client/unstable/im.nheko.summary/summary/"+url.PathEscape("#one:"+srv.ServerName), f.alice.Token, nil)
		if s["room_id"] != f.r1 || s["membership"] != "join" {
			t.Fatalf("the unstable summary %v", s)
		}
		// A world-readable room is previewable.
		if s := srv.Must(t, "GET", summaryPath(f.world, ""), f.bob.Token, nil); s["world_readable"] != true || s["membership"] != "leave" {
			t.Fatalf("the world-readable room %v", s)
		}

		// The private room: not to bob (404, as if unknown), to alice
		// with her membership and its encryption.
		expectError(t, srv, "GET", summaryPath(f.private, ""), f.bob.Token, nil, 404, "M_NOT_FOUND")
		expectError(t, srv, "GET", summaryPath(f.private, ""), "", nil, 404, "M_NOT_FOUND")
		s = srv.Must(t, "GET", summaryPath(f.private, ""), f.alice.Token, nil)
		if s["membership"] != "join" || s["encryption"] != "m.megolm.v1.aes-sha2" || s["join_rule"] != "invite" || s["name"] != "Secret" {
			t.Fatalf("alice's summary of the private room %v", s)
		}
		// Invited, bob sees it with membership "invite".
		srv.Must(t, "POST", v3+"/rooms/"+url.PathEscape(f.private)+"/invite", f.alice.Token, map[string]any{"user_id": f.bob.UserID})
		if s := srv.Must(t, "GET", summaryPath(f.private, ""), f.bob.Token, nil); s["membership"] != "invite" || s["num_joined_members"] != float64(1) {
			t.Fatalf("bob's summary once invited %v", s)
		}

		// Unknown rooms and aliases, bad identifiers, a bad token.
		expectError(t, srv, "GET", summaryPath(f.unknown, ""), f.bob.Token, nil, 400, "M_MISSING_PARAM")
		expectError(t, srv, "GET", summaryPath(f.unknown, "via=elsewhere.test"), f.bob.Token, nil, 404, "M_NOT_FOUND")
		expectError(t, srv, "GET", summaryPath("#nothing:"+srv.ServerName, ""), f.bob.Token, nil, 404, "M_NOT_FOUND")
		expectError(t, srv, "GET", summaryPath("nothing", ""), f.bob.Token, nil, 400, "M_INVALID_PARAM")
		expectError(t, srv, "GET", summaryPath(f.r1, ""), "not-a-token", nil, 401, "M_UNKNOWN_TOKEN")
	})
}
