package federationapi_test

import (
	"net/http"
	"net/url"
	"slices"
	"testing"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

// A space of A whose children live on B: A's hierarchy includes the
// entries of B's rooms, asked of B with the federation /hierarchy; B's
// private room is left out (B refuses it to A), as are the children B
// names inaccessible. B answers other servers' /hierarchy directly, and
// A's room summary of a room of B comes from B.
func TestSpaceHierarchyOverFederation(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a := testutil.StartNode(t, db, nil)
		b := testutil.StartNode(t, testutil.SQLite(t), nil)
		alice := a.Register(t, "alice", "")
		bob := b.Register(t, "bob", "")
		space := map[string]any{"type": "m.space"}
		create := func(n *testutil.Node, u *testutil.User, body map[string]any) string {
			t.Helper()
			return n.Must(t, "POST", clientV3+"/createRoom", u.Token, body)["room_id"].(string)
		}
		child := func(n *testutil.Node, u *testutil.User, parent, child string, content map[string]any) {
			t.Helper()
			n.Must(t, "PUT", clientV3+"/rooms/"+url.PathEscape(parent)+"/state/m.space.child/"+url.PathEscape(child), u.Token, content)
		}
		top := create(a, alice, map[string]any{"preset": "public_chat", "name": "A's space", "creation_content": space})
		remote := create(b, bob, map[string]any{"preset": "public_chat", "name": "Remote room", "topic": "on B", "room_alias_name": "remote"})
		private := create(b, bob, map[string]any{"preset": "private_chat", "name": "B's secret"})
		sub := create(b, bob, map[string]any{"preset": "public_chat", "name": "B's space", "creation_content": space})
		deep := create(b, bob, map[string]any{"preset": "public_chat", "name": "Deep room"})
		child(b, bob, sub, deep, map[string]any{"via": []string{b.ServerName}, "order": "1"})
		child(b, bob, sub, private, map[string]any{"via": []string{b.ServerName}, "order": "2"})
		via := []string{b.ServerName}
		child(a, alice, top, remote, map[string]any{"via": via, "order": "a"})
		child(a, alice, top, private, map[string]any{"via": via, "order": "b"})
		child(a, alice, top, sub, map[string]any{"via": via, "order": "c"})

		// B answers A directly: the space with its children's events, the
		// entry of the child it may show and the one it may not.
		fed := fedMust(t, b, asNode(t, a), "GET", fedV1+"/hierarchy/"+url.PathEscape(sub)+"?suggested_only=false", nil)
		room := fed["room"].(map[string]any)
		if room["room_id"] != sub || room["room_type"] != "m.space" || room["name"] != "B's space" || len(room["children_state"].([]any)) != 2 {
			t.Fatalf("B's answer for its space: %v", fed)
		}
		children := fed["children"].([]any)
		if len(children) != 1 || children[0].(map[string]any)["room_id"] != deep || children[0].(map[string]any)["name"] != "Deep room" {
			t.Fatalf("B's children: %v", fed)
		}
		if in := fed["inaccessible_children"].([]any); len(in) != 1 || in[0] != private {
			t.Fatalf("B's inaccessible children: %v", fed)
		}
		expectFedError(t, b, asNode(t, a), "GET", fedV1+"/hierarchy/"+url.PathEscape(private), nil, 404, "M_NOT_FOUND")
		expectFedError(t, b, asNode(t, a), "GET", fedV1+"/hierarchy/"+url.PathEscape(sub)+"?suggested_only=perhaps", nil, 400, "M_INVALID_PARAM")
		unsigned, _ := http.NewRequest("GET", "https://x"+fedV1+"/hierarchy/"+url.PathEscape(sub), nil)
		if r := testutil.SendTo(t, b, unsigned); r.Status != 401 || r.Errcode() != "M_UNAUTHORIZED" {
			t.Fatalf("an unsigned /hierarchy: %d %s", r.Status, r.Raw)
		}

		// A's hierarchy for alice, with B's rooms fetched from B.
		before := b.Requests.Count("GET", fedV1+"/hierarchy/")
		page := a.Must(t, "GET", "/_matrix/client/v1/rooms/"+url.PathEscape(top)+"/hierarchy", alice.Token, nil)
		var ids []string
		byID := map[string]map[string]any{}
		for _, r := range page["rooms"].([]any) {
			m := r.(map[string]any)
			ids = append(ids, m["room_id"].(string))
			byID[m["room_id"].(string)] = m
		}
		if want := []string{top, remote, sub, deep}; !slices.Equal(ids, want) {
			t.Fatalf("A's hierarchy %v, want %v", ids, want)
		}
		if r := byID[remote]; r["name"] != "Remote room" || r["topic"] != "on B" || r["num_joined_members"] != float64(1) ||
			r["join_rule"] != "public" || r["canonical_alias"] != "#remote:"+b.ServerName {
			t.Fatalf("the remote room's entry %v", r)
		}
		if r := byID[sub]; len(r["children_state"].([]any)) != 2 {
			t.Fatalf("the remote space's entry %v", r)
		}
		// Once for each room of B: the private room's refusal is not asked
		// again under B's space, which named it inaccessible.
		if n := b.Requests.Count("GET", fedV1+"/hierarchy/") - before; n != 3 {
			t.Fatalf("A asked B %d times for hierarchies, want 3", n)
		}

		// The summary of a room of B, through A.
		s := a.Must(t, "GET", "/_matrix/client/v1/room_summary/"+url.PathEscape(remote)+"?via="+url.QueryEscape(b.ServerName), alice.Token, nil)
		if s["room_id"] != remote || s["name"] != "Remote room" || s["membership"] != "leave" || s["room_version"] == nil {
			t.Fatalf("the summary of B's room through A: %v", s)
		}
		s = a.Must(t, "GET", "/_matrix/client/v1/room_summary/"+url.PathEscape("#remote:"+b.ServerName), alice.Token, nil)
		if s["room_id"] != remote || s["topic"] != "on B" {
			t.Fatalf("the summary of B's room by its alias through A: %v", s)
		}
		r := a.Do(t, "GET", "/_matrix/client/v1/room_summary/"+url.PathEscape(private)+"?via="+url.QueryEscape(b.ServerName), alice.Token, nil)
		if r.Status != 404 || r.Errcode() != "M_NOT_FOUND" {
			t.Fatalf("the summary of B's private room through A: %d %s", r.Status, r.Raw)
		}
	})
}

// A restricted room of A in a space of A that a user of B joined: A shows
// it to B (a user of B is in the room its join rule names) with
// allowed_room_ids, and B shows it to that user, not to another of its
// users.
func TestRestrictedRoomInRemoteSpace(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a := testutil.StartNode(t, db, nil)
		b := testutil.StartNode(t, testutil.SQLite(t), nil)
		alice := a.Register(t, "alice", "")
		bob := b.Register(t, "bob", "")
		carol := b.Register(t, "carol", "")
		top := a.Must(t, "POST", clientV3+"/createRoom", alice.Token, map[string]any{"preset": "public_chat", "name": "Space",
			"creation_content": map[string]any{"type": "m.space"}})["room_id"].(string)
		restricted := a.Must(t, "POST", clientV3+"/createRoom", alice.Token, map[string]any{"preset": "private_chat", "name": "Members only",
			"initial_state": []any{map[string]any{"type": "m.room.join_rules", "content": map[string]any{"join_rule": "restricted",
				"allow": []any{map[string]any{"type": "m.room_membership", "room_id": top}}}}}})["room_id"].(string)
		a.Must(t, "PUT", clientV3+"/rooms/"+url.PathEscape(top)+"/state/m.space.child/"+url.PathEscape(restricted), alice.Token,
			map[string]any{"via": []string{a.ServerName}})

		// Before anyone of B is in the space, A keeps the room from B.
		expectFedError(t, a, asNode(t, b), "GET", fedV1+"/hierarchy/"+url.PathEscape(restricted), nil, 404, "M_NOT_FOUND")
		fed := fedMust(t, a, asNode(t, b), "GET", fedV1+"/hierarchy/"+url.PathEscape(top), nil)
		if c := fed["children"].([]any); len(c) != 0 || len(fed["inaccessible_children"].([]any)) != 1 {
			t.Fatalf("A's space for B before the join: %v", fed)
		}

		b.Must(t, "POST", clientV3+"/join/"+url.PathEscape(top)+"?server_name="+url.QueryEscape(a.ServerName), bob.Token, map[string]any{})
		fed = fedMust(t, a, asNode(t, b), "GET", fedV1+"/hierarchy/"+url.PathEscape(top), nil)
		c := fed["children"].([]any)
		if len(c) != 1 || c[0].(map[string]any)["room_id"] != restricted || len(fed["inaccessible_children"].([]any)) != 0 {
			t.Fatalf("A's space for B after the join: %v", fed)
		}
		if allowed := c[0].(map[string]any)["allowed_room_ids"].([]any); len(allowed) != 1 || allowed[0] != top {
			t.Fatalf("allowed_room_ids %v", c[0])
		}

		hierarchy := func(u *testutil.User) []string {
			t.Helper()
			page := b.Must(t, "GET", "/_matrix/client/v1/rooms/"+url.PathEscape(top)+"/hierarchy", u.Token, nil)
			var ids []string
			for _, r := range page["rooms"].([]any) {
				m := r.(map[string]any)
				if _, ok := m["allowed_room_ids"]; ok {
					t.Fatalf("allowed_room_ids told to a client: %v", m)
				}
				ids = append(ids, m["room_id"].(string))
			}
			return ids
		}
		if got := hierarchy(bob); !slices.Equal(got, []string{top, restricted}) {
			t.Fatalf("bob's hierarchy on B: %v", got)
		}
		if got := hierarchy(carol); !slices.Equal(got, []string{top}) {
			t.Fatalf("carol's hierarchy on B: %v", got)
		}
	})
}

// The servers a space's children and a summary's via name are asked
// through the federation's address policy: a denied address is never
// contacted, and its rooms are left out.
func TestSpaceViaDenied(t *testing.T) {
	n := testutil.StartNode(t, testutil.SQLite(t), func(c *config.Config) { c.Federation.IPRangeAllowlist = []string{} })
	alice := n.Register(t, "alice", "")
	port, accepted := countingListener(t)
	server := "127.0.0.1:" + port
	top := n.Must(t, "POST", clientV3+"/createRoom", alice.Token, map[string]any{"preset": "public_chat",
		"creation_content": map[string]any{"type": "m.space"}})["room_id"].(string)
	far := "!far:" + server
	n.Must(t, "PUT", clientV3+"/rooms/"+url.PathEscape(top)+"/state/m.space.child/"+url.PathEscape(far), alice.Token,
		map[string]any{"via": []string{server, "localhost:" + port}})
	page := n.Must(t, "GET", "/_matrix/client/v1/rooms/"+url.PathEscape(top)+"/hierarchy", alice.Token, nil)
	if rooms := page["rooms"].([]any); len(rooms) != 1 {
		t.Fatalf("a room behind a denied address is listed: %v", page)
	}
	r := n.Do(t, "GET", "/_matrix/client/v1/room_summary/"+url.PathEscape(far)+"?via="+url.QueryEscape(server), alice.Token, nil)
	if r.Status != 404 || r.Errcode() != "M_NOT_FOUND" {
		t.Fatalf("the summary of a room behind a denied address: %d %s", r.Status, r.Raw)
	}
	if a := accepted.Load(); a != 0 {
		t.Fatalf("the daemon opened %d connections to denied addresses", a)
	}
}
