package federationapi_test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

// TestFederationRelations: a thread with replies from users of both
// servers (one encrypted), an edit, a reaction and a reference, each made
// on its sender's server, show the same bundled aggregations and the
// same /relations and /threads answers on both servers; a reply redacted
// on one server stops counting on both.
func TestFederationRelations(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		a := testutil.StartNode(t, db, nil)
		r := newFedRoom(t, a, "rel")
		b := testutil.StartNode(t, testutil.SQLite(t), nil)
		bob := b.Register(t, "bob", "")
		r.joinFrom(t, b, bob, "#rel:"+a.ServerName)
		type user struct {
			n *testutil.Node
			u *testutil.User
		}
		alice, bobOnB := user{a, r.alice}, user{b, bob}
		txn := 0
		// send sends an event on its sender's server and waits until both
		// servers hold it, so that both see the events in the same order.
		send := func(from user, evType string, content map[string]any) string {
			t.Helper()
			txn++
			id := from.n.Must(t, "PUT", r.path(fmt.Sprintf("/send/%s/rel%d", evType, txn)), from.u.Token, content)["event_id"].(string)
			for _, n := range []*testutil.Node{a, b} {
				testutil.Eventually(t, id+" on "+n.ServerName, func() bool {
					ev, err := n.Store.RoomEvent(ctx, id)
					return err == nil && ev.Pos != 0
				})
			}
			return id
		}
		rel := func(relType, parent string, more map[string]any) map[string]any {
			c := map[string]any{"msgtype": "m.text", "body": relType, "m.relates_to": map[string]any{"rel_type": relType, "event_id": parent}}
			for k, v := range more {
				c[k] = v
			}
			return c
		}
		root := send(alice, "m.room.message", map[string]any{"msgtype": "m.text", "body": "root"})
		fromBob := send(bobOnB, "m.room.message", rel("m.thread", root, nil))
		encrypted := send(bobOnB, "m.room.encrypted", map[string]any{"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AwgA",
			"device_id": "BOBDEV", "sender_key": "k", "session_id": "s", "m.relates_to": map[string]any{"rel_type": "m.thread", "event_id": root}})
		fromAlice := send(alice, "m.room.message", rel("m.thread", root, nil))
		edit := send(alice, "m.room.message", rel("m.replace", root, map[string]any{"m.new_content": map[string]any{"msgtype": "m.text", "body": "root!"}}))
		reaction := send(bobOnB, "m.reaction", map[string]any{"m.relates_to": map[string]any{"rel_type": "m.annotation", "event_id": root, "key": "👍"}})
		ref := send(bobOnB, "m.room.message", rel("m.reference", root, nil))
		replyEdit := send(bobOnB, "m.room.message", rel("m.replace", fromBob, map[string]any{"m.new_content": map[string]any{"body": "b!"}}))

		relPath := func(eventID string, q url.Values, filters ...string) string {
			p := "/_matrix/client/v1/rooms/" + url.PathEscape(r.roomID) + "/relations/" + url.PathEscape(eventID)
			for _, f := range filters {
				p += "/" + f
			}
			return p + "?" + q.Encode()
		}
		ids := func(list any) []string {
			out := []string{}
			for _, e := range list.([]any) {
				out = append(out, e.(map[string]any)["event_id"].(string))
			}
			return out
		}
		check := func(who user, replies int, latest string, order []string) {
			t.Helper()
			where := who.n.ServerName
			ev := who.n.Must(t, "GET", r.path("/event/"+url.PathEscape(root)), who.u.Token, nil)
			rels, _ := ev["unsigned"].(map[string]any)["m.relations"].(map[string]any)
			th, _ := rels["m.thread"].(map[string]any)
			le, _ := th["latest_event"].(map[string]any)
			if th == nil || th["count"] != float64(replies) || le["event_id"] != latest || th["current_user_participated"] != true {
				t.Errorf("%s: m.thread %v", where, rels["m.thread"])
			}
			if rep, _ := rels["m.replace"].(map[string]any); rep["event_id"] != edit || rep["sender"] != r.alice.UserID {
				t.Errorf("%s: m.replace %v", where, rels["m.replace"])
			}
			if refs, _ := rels["m.reference"].(map[string]any); fmt.Sprint(refs["chunk"]) != fmt.Sprint([]any{map[string]any{"event_id": ref}}) {
				t.Errorf("%s: m.reference %v", where, rels["m.reference"])
			}
			all := who.n.Must(t, "GET", relPath(root, url.Values{"limit": {"50"}, "dir": {"f"}}), who.u.Token, nil)
			if got := ids(all["chunk"]); !slices.Equal(got, order) {
				t.Errorf("%s: /relations %v, want %v", where, got, order)
			}
			if got := ids(who.n.Must(t, "GET", relPath(root, url.Values{}, "m.annotation", "m.reaction"), who.u.Token, nil)["chunk"]); !slices.Equal(got, []string{reaction}) {
				t.Errorf("%s: reactions %v", where, got)
			}
			if got := ids(who.n.Must(t, "GET", relPath(root, url.Values{}, "m.thread", "m.room.encrypted"), who.u.Token, nil)["chunk"]); !slices.Equal(got, []string{encrypted}) {
				t.Errorf("%s: encrypted replies %v", where, got)
			}
			threads := who.n.Must(t, "GET", "/_matrix/client/v1/rooms/"+url.PathEscape(r.roomID)+"/threads?include=participated", who.u.Token, nil)
			if got := ids(threads["chunk"]); !slices.Equal(got, []string{root}) {
				t.Errorf("%s: threads %v", where, got)
			}
			// /sync's timeline bundles the same, and the latest reply's
			// own edit when it has one.
			sync := who.n.Must(t, "GET", clientV3+"/sync?timeout=0&filter="+url.QueryEscape(`{"room":{"timeline":{"limit":50}}}`), who.u.Token, nil)
			timeline := sync["rooms"].(map[string]any)["join"].(map[string]any)[r.roomID].(map[string]any)["timeline"].(map[string]any)["events"].([]any)
			for _, e := range timeline {
				if e.(map[string]any)["event_id"] != root {
					continue
				}
				rels, _ := e.(map[string]any)["unsigned"].(map[string]any)["m.relations"].(map[string]any)
				th, _ := rels["m.thread"].(map[string]any)
				if th == nil || th["count"] != float64(replies) {
					t.Errorf("%s: /sync's m.thread %v", where, rels)
				}
			}
		}
		order := []string{fromBob, encrypted, fromAlice, edit, reaction, ref}
		check(alice, 3, fromAlice, order)
		check(bobOnB, 3, fromAlice, order)
		// The edit of bob's reply is one of its relations on both servers.
		for _, who := range []user{alice, bobOnB} {
			if got := ids(who.n.Must(t, "GET", relPath(fromBob, url.Values{}, "m.replace"), who.u.Token, nil)["chunk"]); !slices.Equal(got, []string{replyEdit}) {
				t.Errorf("%s: edits of bob's reply %v", who.n.ServerName, got)
			}
		}

		// alice's reply redacted on A: on both servers it stops counting,
		// and the latest reply is the encrypted one again.
		a.Must(t, "PUT", r.path("/redact/"+url.PathEscape(fromAlice)+"/red"), r.alice.Token, map[string]any{})
		testutil.Eventually(t, "the redaction on "+b.ServerName, func() bool {
			ev := b.Must(t, "GET", r.path("/event/"+url.PathEscape(fromAlice)), bob.Token, nil)
			u, _ := ev["unsigned"].(map[string]any)
			_, redacted := u["redacted_because"]
			return redacted
		})
		order = []string{fromBob, encrypted, edit, reaction, ref}
		check(alice, 2, encrypted, order)
		check(bobOnB, 2, encrypted, order)
	})
}
