package federationapi_test

import (
	"net/http"
	"net/url"
	"slices"
	"testing"

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
