package clientapi_test

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

const v1 = "/_matrix/client/v1"

var relTxn atomic.Int64

// sendEvent sends an event of any type with a fresh transaction ID.
func sendEvent(t *testing.T, srv *testutil.Server, u *testutil.User, roomID, evType string, content map[string]any) string {
	t.Helper()
	txn := fmt.Sprintf("rel%d", relTxn.Add(1))
	return srv.Must(t, "PUT", roomPath(roomID, "/send/"+evType+"/"+txn), u.Token, content)["event_id"].(string)
}

func relatesTo(relType, parent string, more map[string]any) map[string]any {
	content := map[string]any{"msgtype": "m.text", "body": relType + " of " + parent,
		"m.relates_to": map[string]any{"rel_type": relType, "event_id": parent}}
	for k, v := range more {
		content[k] = v
	}
	return content
}

// relationsPath is /relations of an event, with the path's filters and a
// query.
func relationsPath(roomID, eventID string, q url.Values, filters ...string) string {
	p := v1 + "/rooms/" + url.PathEscape(roomID) + "/relations/" + url.PathEscape(eventID)
	for _, f := range filters {
		p += "/" + url.PathEscape(f)
	}
	if len(q) > 0 {
		p += "?" + q.Encode()
	}
	return p
}

// eventIDsOf returns the event IDs of an answer's chunk.
func eventIDsOf(t *testing.T, list any) []string {
	t.Helper()
	out := []string{}
	for _, e := range list.([]any) {
		out = append(out, e.(map[string]any)["event_id"].(string))
	}
	return out
}

// bundle returns an event's unsigned m.relations (nil when none).
func bundle(ev any) map[string]any {
	m, _ := ev.(map[string]any)
	u, _ := m["unsigned"].(map[string]any)
	r, _ := u["m.relations"].(map[string]any)
	return r
}

// eventByID finds an event in a list of events.
func eventByID(list any, id string) map[string]any {
	l, _ := list.([]any)
	for _, e := range l {
		if ev := e.(map[string]any); ev["event_id"] == id {
			return ev
		}
	}
	return nil
}

// GET /relations: pages in both directions with next_batch and
// prev_batch, relation and event type filters (an encrypted reply is
// matched as m.room.encrypted), recurse with recursion_depth, and 404 for
// an event the user may not see, clear errors for bad parameters.
func TestRelationsEndpoint(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "public_chat",
			"initial_state": []any{map[string]any{"type": "m.room.history_visibility", "state_key": "", "content": map[string]any{"history_visibility": "joined"}}}})
		srv.Must(t, "POST", roomPath(roomID, "/join"), bob.Token, nil)
		root := sendMessage(t, srv, alice, roomID, "root", "root")
		var replies []string
		for i := 0; i < 5; i++ {
			replies = append(replies, sendEvent(t, srv, alice, roomID, "m.room.message", relatesTo("m.thread", root, nil)))
		}
		enc := sendEvent(t, srv, bob, roomID, "m.room.encrypted", map[string]any{"algorithm": "m.megolm.v1.aes-sha2",
			"ciphertext": "AwgAEnACgAkLmt6qF84IK++J7UDH2Za1YVchHyprqTqsg", "device_id": "BOB", "sender_key": "x", "session_id": "y",
			"m.relates_to": map[string]any{"rel_type": "m.thread", "event_id": root}})
		reaction := sendEvent(t, srv, bob, roomID, "m.reaction", map[string]any{
			"m.relates_to": map[string]any{"rel_type": "m.annotation", "event_id": replies[0], "key": "👍"}})
		sendMessage(t, srv, alice, roomID, "unrelated", "unrelated")
		all := append(slices.Clone(replies), enc)
		newestFirst := slices.Clone(all)
		slices.Reverse(newestFirst)

		// Newest first by default, 5 a page.
		page := srv.Must(t, "GET", relationsPath(roomID, root, nil), bob.Token, nil)
		if got := eventIDsOf(t, page["chunk"]); !slices.Equal(got, newestFirst[:5]) {
			t.Fatalf("first page %v, want %v", got, newestFirst[:5])
		}
		if _, ok := page["prev_batch"]; ok {
			t.Errorf("the first page has a prev_batch: %v", page)
		}
		if _, ok := page["recursion_depth"]; ok {
			t.Errorf("recursion_depth without recurse: %v", page)
		}
		// Pages of two, backwards and forwards, until no next_batch.
		pageAll := func(dir string, extra url.Values, filters ...string) []string {
			var seen []string
			from := ""
			for i := 0; i < 20; i++ {
				q := url.Values{"limit": {"2"}, "dir": {dir}}
				for k, v := range extra {
					q[k] = v
				}
				if from != "" {
					q.Set("from", from)
				}
				p := srv.Must(t, "GET", relationsPath(roomID, root, q, filters...), bob.Token, nil)
				ids := eventIDsOf(t, p["chunk"])
				if len(ids) > 2 {
					t.Fatalf("a page of %d with limit 2", len(ids))
				}
				if from != "" && p["prev_batch"] != from {
					t.Fatalf("prev_batch %v, want %s", p["prev_batch"], from)
				}
				seen = append(seen, ids...)
				next, ok := p["next_batch"].(string)
				if !ok {
					return seen
				}
				from = next
			}
			t.Fatal("pagination does not end")
			return nil
		}
		if got := pageAll("b", nil); !slices.Equal(got, newestFirst) {
			t.Errorf("backwards %v, want %v", got, newestFirst)
		}
		if got := pageAll("f", nil); !slices.Equal(got, all) {
			t.Errorf("forwards %v, want %v", got, all)
		}
		// A /messages token pages /relations too: from the end backwards.
		msgs := srv.Must(t, "GET", roomPath(roomID, "/messages?dir=b&limit=1"), bob.Token, nil)
		q := url.Values{"from": {msgs["end"].(string)}, "limit": {"1"}}
		if got := eventIDsOf(t, srv.Must(t, "GET", relationsPath(roomID, root, q), bob.Token, nil)["chunk"]); !slices.Equal(got, []string{enc}) {
			t.Errorf("from /messages' end: %v", got)
		}
		// to bounds the page.
		first := srv.Must(t, "GET", relationsPath(roomID, root, url.Values{"dir": {"f"}, "limit": {"2"}}), bob.Token, nil)
		q = url.Values{"to": {first["next_batch"].(string)}, "limit": {"10"}}
		if got := eventIDsOf(t, srv.Must(t, "GET", relationsPath(roomID, root, q), bob.Token, nil)["chunk"]); !slices.Equal(got, newestFirst[:4]) {
			t.Errorf("back to the first page's end: %v, want %v", got, newestFirst[:4])
		}

		// Filters: by relation type, then by event type too.
		q = url.Values{"limit": {"50"}}
		if got := eventIDsOf(t, srv.Must(t, "GET", relationsPath(roomID, root, q, "m.thread"), bob.Token, nil)["chunk"]); !slices.Equal(got, newestFirst) {
			t.Errorf("m.thread: %v", got)
		}
		if got := eventIDsOf(t, srv.Must(t, "GET", relationsPath(roomID, root, q, "m.annotation"), bob.Token, nil)["chunk"]); len(got) != 0 {
			t.Errorf("annotations of the root: %v", got)
		}
		if got := eventIDsOf(t, srv.Must(t, "GET", relationsPath(roomID, root, q, "m.thread", "m.room.encrypted"), bob.Token, nil)["chunk"]); !slices.Equal(got, []string{enc}) {
			t.Errorf("encrypted thread replies: %v", got)
		}
		if got := eventIDsOf(t, srv.Must(t, "GET", relationsPath(roomID, root, q, "m.thread", "m.room.message"), bob.Token, nil)["chunk"]); len(got) != 5 {
			t.Errorf("plain thread replies: %v", got)
		}
		if got := eventIDsOf(t, srv.Must(t, "GET", relationsPath(roomID, replies[0], q, "m.annotation", "m.reaction"), bob.Token, nil)["chunk"]); !slices.Equal(got, []string{reaction}) {
			t.Errorf("the reaction: %v", got)
		}
		// recurse: the reaction to a reply comes with the replies.
		q.Set("recurse", "true")
		rec := srv.Must(t, "GET", relationsPath(roomID, root, q), bob.Token, nil)
		if got := eventIDsOf(t, rec["chunk"]); !slices.Equal(got, append([]string{reaction}, newestFirst...)) {
			t.Errorf("recursed: %v", got)
		}
		if d, _ := rec["recursion_depth"].(float64); d < 3 {
			t.Errorf("recursion_depth %v", rec["recursion_depth"])
		}
		if got := eventIDsOf(t, srv.Must(t, "GET", relationsPath(roomID, root, q, "m.annotation"), bob.Token, nil)["chunk"]); !slices.Equal(got, []string{reaction}) {
			t.Errorf("recursed annotations: %v", got)
		}
		q.Set("recurse", "false")
		flat := srv.Must(t, "GET", relationsPath(roomID, root, q, "m.annotation"), bob.Token, nil)
		if got := eventIDsOf(t, flat["chunk"]); len(got) != 0 {
			t.Errorf("recurse=false annotations: %v", got)
		}
		if flat["recursion_depth"] != float64(1) {
			t.Errorf("recurse=false: recursion_depth %v", flat["recursion_depth"])
		}

		// carol joins after it all: under joined history she sees neither
		// the root (404) nor the replies.
		srv.Must(t, "POST", roomPath(roomID, "/join"), carol.Token, nil)
		expectError(t, srv, "GET", relationsPath(roomID, root, nil), carol.Token, nil, http.StatusNotFound, "M_NOT_FOUND")
		late := sendEvent(t, srv, alice, roomID, "m.room.message", relatesTo("m.thread", root, nil))
		// A reply carol may see, to a root she may not: still 404.
		expectError(t, srv, "GET", relationsPath(roomID, root, nil), carol.Token, nil, http.StatusNotFound, "M_NOT_FOUND")
		// The root's reader sees the new reply.
		if got := eventIDsOf(t, srv.Must(t, "GET", relationsPath(roomID, root, url.Values{"limit": {"1"}}), bob.Token, nil)["chunk"]); !slices.Equal(got, []string{late}) {
			t.Errorf("after carol's join: %v", got)
		}
		// A user outside the room: 403 as for /messages.
		dave := srv.Register(t, "dave", "")
		expectError(t, srv, "GET", relationsPath(roomID, root, nil), dave.Token, nil, http.StatusForbidden, "M_FORBIDDEN")
		expectError(t, srv, "GET", relationsPath(roomID, "$nope", nil), bob.Token, nil, http.StatusNotFound, "M_NOT_FOUND")
		expectError(t, srv, "GET", relationsPath("!nowhere:test.local", root, nil), bob.Token, nil, http.StatusNotFound, "M_NOT_FOUND")
		for _, bad := range []url.Values{{"dir": {"x"}}, {"limit": {"-1"}}, {"limit": {"x"}}, {"recurse": {"yes"}}, {"from": {"zz"}}, {"to": {"s-1"}}} {
			expectError(t, srv, "GET", relationsPath(roomID, root, bad), bob.Token, nil, http.StatusBadRequest, "M_INVALID_PARAM")
		}
		expectError(t, srv, "GET", relationsPath(roomID, root, nil), "", nil, http.StatusUnauthorized, "M_MISSING_TOKEN")
	})
}

// GET /threads: a room's threads, the most recently active first, a page
// at a time; include=participated keeps those whose root or a reply the
// user sent. Each root comes with its m.thread aggregation.
func TestThreadsEndpoint(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "public_chat"})
		srv.Must(t, "POST", roomPath(roomID, "/join"), bob.Token, nil)
		threadsPath := func(q url.Values) string {
			return v1 + "/rooms/" + url.PathEscape(roomID) + "/threads?" + q.Encode()
		}
		t1 := sendMessage(t, srv, alice, roomID, "t1", "one")
		t2 := sendMessage(t, srv, bob, roomID, "t2", "two")
		t3 := sendMessage(t, srv, bob, roomID, "t3", "three")
		sendMessage(t, srv, alice, roomID, "plain", "no thread")
		sendEvent(t, srv, bob, roomID, "m.room.message", relatesTo("m.thread", t1, nil))
		sendEvent(t, srv, bob, roomID, "m.room.message", relatesTo("m.thread", t3, nil))
		sendEvent(t, srv, bob, roomID, "m.room.message", relatesTo("m.thread", t2, nil))
		latest1 := sendEvent(t, srv, bob, roomID, "m.room.message", relatesTo("m.thread", t1, nil))

		got := srv.Must(t, "GET", threadsPath(url.Values{}), alice.Token, nil)
		if ids := eventIDsOf(t, got["chunk"]); !slices.Equal(ids, []string{t1, t2, t3}) {
			t.Fatalf("threads %v, want %v", ids, []string{t1, t2, t3})
		}
		th, _ := bundle(eventByID(got["chunk"], t1))["m.thread"].(map[string]any)
		if th == nil || th["count"] != float64(2) || th["current_user_participated"] != true ||
			th["latest_event"].(map[string]any)["event_id"] != latest1 {
			t.Errorf("t1's thread for alice: %v", th)
		}
		// Pages of one.
		var paged []string
		q := url.Values{"limit": {"1"}}
		for i := 0; i < 10; i++ {
			p := srv.Must(t, "GET", threadsPath(q), alice.Token, nil)
			paged = append(paged, eventIDsOf(t, p["chunk"])...)
			next, ok := p["next_batch"].(string)
			if !ok {
				break
			}
			q.Set("from", next)
		}
		if !slices.Equal(paged, []string{t1, t2, t3}) {
			t.Errorf("paged threads %v", paged)
		}
		// alice sent t1's root and nothing in t2 or t3.
		if ids := eventIDsOf(t, srv.Must(t, "GET", threadsPath(url.Values{"include": {"participated"}}), alice.Token, nil)["chunk"]); !slices.Equal(ids, []string{t1}) {
			t.Errorf("alice's threads %v", ids)
		}
		sendEvent(t, srv, alice, roomID, "m.room.message", relatesTo("m.thread", t3, nil))
		if ids := eventIDsOf(t, srv.Must(t, "GET", threadsPath(url.Values{"include": {"participated"}}), alice.Token, nil)["chunk"]); !slices.Equal(ids, []string{t3, t1}) {
			t.Errorf("alice's threads after her reply in t3: %v", ids)
		}
		if ids := eventIDsOf(t, srv.Must(t, "GET", threadsPath(url.Values{"include": {"all"}}), bob.Token, nil)["chunk"]); !slices.Equal(ids, []string{t3, t1, t2}) {
			t.Errorf("all threads for bob %v", ids)
		}
		expectError(t, srv, "GET", threadsPath(url.Values{"include": {"mine"}}), alice.Token, nil, http.StatusBadRequest, "M_INVALID_PARAM")
		expectError(t, srv, "GET", threadsPath(url.Values{"from": {"nope"}}), alice.Token, nil, http.StatusBadRequest, "M_INVALID_PARAM")
		carol := srv.Register(t, "carol", "")
		expectError(t, srv, "GET", threadsPath(url.Values{}), carol.Token, nil, http.StatusForbidden, "M_FORBIDDEN")
	})
}

// Bundled aggregations: a thread root shows its m.thread (count, latest
// reply, the user's participation), an edited event its latest edit by
// its sender (whole) and not another's, a referred event its references,
// in /sync, /messages, /event and /context alike; encrypted replies count;
// a redacted reply stops counting.
func TestBundledAggregations(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "public_chat"})
		srv.Must(t, "POST", roomPath(roomID, "/join"), bob.Token, nil)
		root := sendMessage(t, srv, alice, roomID, "root", "root")
		r1 := sendEvent(t, srv, bob, roomID, "m.room.message", relatesTo("m.thread", root, nil))
		r2 := sendEvent(t, srv, bob, roomID, "m.room.encrypted", map[string]any{"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AwgA",
			"m.relates_to": map[string]any{"rel_type": "m.thread", "event_id": root}})
		edit := sendEvent(t, srv, alice, roomID, "m.room.message", relatesTo("m.replace", root,
			map[string]any{"m.new_content": map[string]any{"msgtype": "m.text", "body": "root, edited"}}))
		sendEvent(t, srv, bob, roomID, "m.room.message", relatesTo("m.replace", root,
			map[string]any{"m.new_content": map[string]any{"msgtype": "m.text", "body": "bob may not edit"}}))
		ref := sendEvent(t, srv, bob, roomID, "m.room.message", relatesTo("m.reference", root, nil))
		sendEvent(t, srv, bob, roomID, "m.reaction", map[string]any{"m.relates_to": map[string]any{"rel_type": "m.annotation", "event_id": root, "key": "x"}})

		checkRoot := func(where string, ev any, user string, count int, latest string) {
			t.Helper()
			rels := bundle(ev)
			if rels == nil {
				t.Fatalf("%s: the root has no m.relations: %v", where, ev)
			}
			th, _ := rels["m.thread"].(map[string]any)
			le, _ := th["latest_event"].(map[string]any)
			if th == nil || th["count"] != float64(count) || le["event_id"] != latest || th["current_user_participated"] != (user == "bob" || user == "alice") {
				t.Errorf("%s: m.thread %v", where, rels["m.thread"])
			}
			rep, _ := rels["m.replace"].(map[string]any)
			if rep["event_id"] != edit || rep["sender"] != alice.UserID || rep["origin_server_ts"] == nil ||
				rep["content"].(map[string]any)["m.new_content"] == nil {
				t.Errorf("%s: m.replace %v", where, rels["m.replace"])
			}
			refs, _ := rels["m.reference"].(map[string]any)
			if fmt.Sprint(refs["chunk"]) != fmt.Sprint([]any{map[string]any{"event_id": ref}}) {
				t.Errorf("%s: m.reference %v", where, rels["m.reference"])
			}
			if _, ok := rels["m.annotation"]; ok {
				t.Errorf("%s: annotations bundled", where)
			}
			if body := ev.(map[string]any)["content"].(map[string]any)["body"]; body != "root" {
				t.Errorf("%s: the root's content was replaced: %v", where, body)
			}
		}
		// /sync
		timeline := section(t, roomSync(t, srv, bob, url.Values{"filter": {`{"room":{"timeline":{"limit":50}}}`}}), "join", roomID)["timeline"].(map[string]any)["events"]
		checkRoot("/sync", eventByID(timeline, root), "bob", 2, r2)
		if b := bundle(eventByID(timeline, r1)); b != nil {
			t.Errorf("/sync: a thread reply has aggregations %v", b)
		}
		// /messages
		msgs := srv.Must(t, "GET", roomPath(roomID, "/messages?dir=b&limit=50"), alice.Token, nil)
		checkRoot("/messages", eventByID(msgs["chunk"], root), "alice", 2, r2)
		// /event
		ev := srv.Must(t, "GET", roomPath(roomID, "/event/"+url.PathEscape(root)), bob.Token, nil)
		checkRoot("/event", ev, "bob", 2, r2)
		// /context: the root itself, and as an event around another.
		ctx := srv.Must(t, "GET", roomPath(roomID, "/context/"+url.PathEscape(root)), bob.Token, nil)
		checkRoot("/context event", ctx["event"], "bob", 2, r2)
		ctx = srv.Must(t, "GET", roomPath(roomID, "/context/"+url.PathEscape(r1)+"?limit=10"), bob.Token, nil)
		checkRoot("/context events_before", eventByID(ctx["events_before"], root), "bob", 2, r2)

		// The latest reply redacted: it stops counting.
		srv.Must(t, "PUT", roomPath(roomID, "/redact/"+url.PathEscape(r2)+"/red1"), bob.Token, map[string]any{})
		ev = srv.Must(t, "GET", roomPath(roomID, "/event/"+url.PathEscape(root)), bob.Token, nil)
		checkRoot("/event after the redaction", ev, "bob", 1, r1)
		// The edit redacted: no m.replace.
		srv.Must(t, "PUT", roomPath(roomID, "/redact/"+url.PathEscape(edit)+"/red2"), alice.Token, map[string]any{})
		ev = srv.Must(t, "GET", roomPath(roomID, "/event/"+url.PathEscape(root)), bob.Token, nil)
		if rep := bundle(ev)["m.replace"]; rep != nil {
			t.Errorf("a redacted edit is still bundled: %v", rep)
		}

		// A user who sent nothing in the thread has not participated; a
		// later /sync shows the new reply's effect on the root only when
		// the root is in the timeline.
		carol := srv.Register(t, "carol", "")
		srv.Must(t, "POST", roomPath(roomID, "/join"), carol.Token, nil)
		ev = srv.Must(t, "GET", roomPath(roomID, "/event/"+url.PathEscape(root)), carol.Token, nil)
		if th := bundle(ev)["m.thread"].(map[string]any); th["current_user_participated"] != false {
			t.Errorf("carol participated: %v", th)
		}
	})
}
