package clientapi_test

import (
	"fmt"
	"net/url"
	"slices"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

const searchPath = v3 + "/search"

func say(t *testing.T, srv *testutil.Server, u *testutil.User, roomID, body string) string {
	t.Helper()
	txn := fmt.Sprintf("s%d", len(body)*7919+len(roomID)+int(body[0]))
	return srv.Must(t, "PUT", roomPath(roomID, "/send/m.room.message/"+url.PathEscape(txn+body)), u.Token,
		map[string]any{"msgtype": "m.text", "body": body})["event_id"].(string)
}

// searchBodies runs a search and returns the results' bodies (or names),
// and the whole room_events answer.
func searchBodies(t *testing.T, srv *testutil.Server, u *testutil.User, criteria map[string]any, nextBatch string) ([]string, map[string]any) {
	t.Helper()
	path := searchPath
	if nextBatch != "" {
		path += "?next_batch=" + url.QueryEscape(nextBatch)
	}
	r := srv.Must(t, "POST", path, u.Token, map[string]any{"search_categories": map[string]any{"room_events": criteria}})
	re := r["search_categories"].(map[string]any)["room_events"].(map[string]any)
	var out []string
	for _, res := range re["results"].([]any) {
		c := res.(map[string]any)["result"].(map[string]any)["content"].(map[string]any)
		for _, k := range []string{"body", "name", "topic"} {
			if v, ok := c[k].(string); ok {
				out = append(out, v)
			}
		}
	}
	return out, re
}

func TestSearchRoomEvents(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		room := createRoom(t, srv, alice, map[string]any{"preset": "public_chat", "name": "Fox Den"})
		srv.Must(t, "POST", roomPath(room, "/join"), bob.Token, map[string]any{})
		say(t, srv, alice, room, "hello world")
		say(t, srv, bob, room, "the quick brown fox")
		say(t, srv, alice, room, "Foxes are quick, quicker than dogs")
		srv.Must(t, "PUT", roomPath(room, "/send/m.room.encrypted/e1"), alice.Token,
			map[string]any{"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "fox fox fox", "session_id": "x", "sender_key": "y", "device_id": "D"})
		private := createRoom(t, srv, carol, map[string]any{"preset": "private_chat"})
		say(t, srv, carol, private, "a fox nobody else sees")

		// Newest first, prefixes matching, every key by default; the
		// encrypted event and carol's room are not found.
		got, re := searchBodies(t, srv, alice, map[string]any{"search_term": "FOX", "order_by": "recent"}, "")
		want := []string{"Foxes are quick, quicker than dogs", "the quick brown fox", "Fox Den"}
		if !slices.Equal(got, want) || re["count"].(float64) != 3 || !slices.Contains(asStrings(re["highlights"]), "fox") {
			t.Fatalf("recent: %q (count %v, highlights %v), want %q", got, re["count"], re["highlights"], want)
		}
		// All words must match.
		if got, _ := searchBodies(t, srv, alice, map[string]any{"search_term": "quick dogs"}, ""); !slices.Equal(got, want[:1]) {
			t.Fatalf("two words: %q", got)
		}
		// By rank: every match, the one with the word most often first
		// among the messages.
		got, _ = searchBodies(t, srv, alice, map[string]any{"search_term": "quick", "order_by": "rank", "keys": []string{"content.body"}}, "")
		if len(got) != 2 || got[0] != "Foxes are quick, quicker than dogs" {
			t.Fatalf("by rank: %q", got)
		}
		// Keys, senders and types narrow it.
		if got, _ := searchBodies(t, srv, alice, map[string]any{"search_term": "fox", "keys": []string{"content.name"}}, ""); !slices.Equal(got, []string{"Fox Den"}) {
			t.Fatalf("names only: %q", got)
		}
		if got, _ := searchBodies(t, srv, alice, map[string]any{"search_term": "fox", "filter": map[string]any{"senders": []string{bob.UserID}}}, ""); !slices.Equal(got, []string{"the quick brown fox"}) {
			t.Fatalf("bob's only: %q", got)
		}
		if got, _ := searchBodies(t, srv, carol, map[string]any{"search_term": "fox", "filter": map[string]any{"rooms": []string{room}}}, ""); len(got) != 0 {
			t.Fatalf("carol searching a room she is not in: %q", got)
		}

		// Pages of one, both orders, find each match once.
		for _, order := range []string{"recent", "rank"} {
			var all []string
			next := ""
			for i := 0; i < 5; i++ {
				got, re := searchBodies(t, srv, alice, map[string]any{"search_term": "fox", "order_by": order, "filter": map[string]any{"limit": 1}}, next)
				all = append(all, got...)
				next, _ = re["next_batch"].(string)
				if next == "" {
					break
				}
			}
			slices.Sort(all)
			sorted := slices.Clone(want)
			slices.Sort(sorted)
			if !slices.Equal(all, sorted) {
				t.Fatalf("paging by %s: %q", order, all)
			}
		}

		// Context around a result, with the senders' profiles as they
		// were there (a later change of name is not theirs); groups.
		srv.Must(t, "PUT", v3+"/profile/"+url.PathEscape(bob.UserID)+"/displayname", bob.Token, map[string]any{"displayname": "Bob B"})
		_, re = searchBodies(t, srv, alice, map[string]any{"search_term": "brown", "event_context": map[string]any{"before_limit": 1, "after_limit": 1, "include_profile": true},
			"groupings": map[string]any{"group_by": []any{map[string]any{"key": "room_id"}}}}, "")
		res := re["results"].([]any)[0].(map[string]any)
		ctx := res["context"].(map[string]any)
		before, after := ctx["events_before"].([]any), ctx["events_after"].([]any)
		if len(before) != 1 || len(after) != 1 || before[0].(map[string]any)["content"].(map[string]any)["body"] != "hello world" || ctx["start"] == nil || ctx["end"] == nil {
			t.Fatalf("context %v", ctx)
		}
		if p := ctx["profile_info"].(map[string]any)[bob.UserID].(map[string]any); p["displayname"] != "bob" {
			t.Fatalf("profile_info %v", ctx["profile_info"])
		}
		if g := re["groups"].(map[string]any)["room_id"].(map[string]any)[room].(map[string]any); len(g["results"].([]any)) != 1 {
			t.Fatalf("groups %v", re["groups"])
		}

		// A redacted message is no longer found.
		id := say(t, srv, alice, room, "regrettable words")
		if got, _ := searchBodies(t, srv, alice, map[string]any{"search_term": "regrettable"}, ""); len(got) != 1 {
			t.Fatalf("before the redaction: %q", got)
		}
		srv.Must(t, "PUT", roomPath(room, "/redact/"+url.PathEscape(id)+"/r1"), alice.Token, map[string]any{})
		if got, _ := searchBodies(t, srv, alice, map[string]any{"search_term": "regrettable"}, ""); len(got) != 0 {
			t.Fatalf("after the redaction: %q", got)
		}

		// History the user may not see is not found: dave joins a room
		// whose history is visible to members from their join only.
		dave := srv.Register(t, "dave", "")
		closed := createRoom(t, srv, alice, map[string]any{"preset": "public_chat",
			"initial_state": []any{map[string]any{"type": "m.room.history_visibility", "content": map[string]any{"history_visibility": "joined"}}}})
		say(t, srv, alice, closed, "secret plans before dave")
		srv.Must(t, "POST", roomPath(closed, "/join"), dave.Token, map[string]any{})
		say(t, srv, alice, closed, "plans dave may read")
		if got, _ := searchBodies(t, srv, dave, map[string]any{"search_term": "plans"}, ""); !slices.Equal(got, []string{"plans dave may read"}) {
			t.Fatalf("dave's search: %q", got)
		}

		// Bad requests change nothing and say why.
		for _, c := range []struct {
			body map[string]any
			path string
			code string
		}{
			{map[string]any{"search_categories": map[string]any{"room_events": map[string]any{}}}, searchPath, "M_BAD_JSON"},
			{map[string]any{"search_categories": map[string]any{"room_events": map[string]any{"search_term": "x", "order_by": "size"}}}, searchPath, "M_BAD_JSON"},
			{map[string]any{"search_categories": map[string]any{"room_events": map[string]any{"search_term": "x", "keys": []string{"content.secret"}}}}, searchPath, "M_BAD_JSON"},
			{map[string]any{"search_categories": map[string]any{"room_events": map[string]any{"search_term": "x"}}}, searchPath + "?next_batch=zzz", "M_INVALID_PARAM"},
			{map[string]any{"search_categories": map[string]any{"room_events": map[string]any{"search_term": "x", "order_by": "recent"}}}, searchPath + "?next_batch=o3", "M_INVALID_PARAM"},
		} {
			if r := srv.Do(t, "POST", c.path, alice.Token, c.body); r.Status != 400 || r.Errcode() != c.code {
				t.Fatalf("%v: %d %s", c.body, r.Status, r.Raw)
			}
		}
		if r := srv.Do(t, "POST", searchPath, "", map[string]any{}); r.Status != 401 {
			t.Fatalf("without a token: %d", r.Status)
		}
	})
}
