package clientapi_test

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

// messagesPage gets one page of /messages and returns it with its
// events as eventsOf shows them.
func messagesPage(t *testing.T, srv *testutil.Server, u *testutil.User, roomID string, q url.Values) (map[string]any, []string) {
	t.Helper()
	page := srv.Must(t, "GET", roomPath(roomID, "/messages?"+q.Encode()), u.Token, nil)
	return page, eventList(t, page["chunk"])
}

// eventList is eventsOf for a bare list of events (a /messages chunk,
// /context's events_before and events_after).
func eventList(t *testing.T, list any) []string {
	t.Helper()
	return eventsOf(t, map[string]any{"list": map[string]any{"events": list}}, "list")
}

// allMessages pages through /messages from a token (none: from the end
// or the start) until the answer has no end, and returns every event seen
// and the number of pages.
func allMessages(t *testing.T, srv *testutil.Server, u *testutil.User, roomID, dir, from string, limit int) ([]string, int) {
	t.Helper()
	var all []string
	for pages := 1; pages < 100; pages++ {
		q := url.Values{"dir": {dir}, "limit": {strconv.Itoa(limit)}}
		if from != "" {
			q.Set("from", from)
		}
		page, evs := messagesPage(t, srv, u, roomID, q)
		if len(evs) > limit {
			t.Fatalf("a page of %d events with limit %d", len(evs), limit)
		}
		if from != "" && page["start"] != from {
			t.Fatalf("start %v, want the from token %s", page["start"], from)
		}
		all = append(all, evs...)
		end, ok := page["end"].(string)
		if !ok {
			return all, pages
		}
		from = end
	}
	t.Fatal("pagination does not end")
	return nil, 0
}

func TestRoomMessagesPagination(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "public_chat"})
		for _, b := range []string{"m1", "m2", "m3", "m4", "m5"} {
			sendMessage(t, srv, alice, roomID, b, b)
		}
		srv.Must(t, "POST", roomPath(roomID, "/join"), bob.Token, nil)
		sendMessage(t, srv, bob, roomID, "m6", "m6")

		// The whole room, oldest first, as an initial sync with a large
		// limit shows it.
		whole := eventsOf(t, section(t, roomSync(t, srv, alice, url.Values{"filter": {`{"room":{"timeline":{"limit":50}}}`}}), "join", roomID), "timeline")
		if len(whole) != 13 || whole[0] != "m.room.create|" || whole[12] != "m.room.message|m6" {
			t.Fatalf("whole timeline %q", whole)
		}
		reversed := slices.Clone(whole)
		slices.Reverse(reversed)

		// Back from a limited sync's prev_batch: what came before its
		// timeline, newest first, without a gap or a repeat.
		sync := roomSync(t, srv, alice, url.Values{"filter": {`{"room":{"timeline":{"limit":3}}}`}})
		timeline := section(t, sync, "join", roomID)["timeline"].(map[string]any)
		prev := timeline["prev_batch"].(string)
		before, pages := allMessages(t, srv, alice, roomID, "b", prev, 4)
		expectEvents(t, "back from prev_batch", before, reversed[3:]...)
		if pages != 3 { // 4 + 4 + 2: the last page is short and has no end
			t.Fatalf("%d pages", pages)
		}

		// Without from: back from the end, and forward from the start.
		back, _ := allMessages(t, srv, bob, roomID, "b", "", 5)
		expectEvents(t, "back from the end", back, reversed...)
		fwd, _ := allMessages(t, srv, alice, roomID, "f", "", 5)
		expectEvents(t, "forward from the start", fwd, whole...)

		// Forward from prev_batch gives the sync's own timeline, and "to"
		// bounds a page.
		_, evs := messagesPage(t, srv, alice, roomID, url.Values{"dir": {"f"}, "from": {prev}, "limit": {"10"}})
		expectEvents(t, "forward from prev_batch", evs, whole[10:]...)
		next := sync["next_batch"].(string)
		page, evs := messagesPage(t, srv, alice, roomID, url.Values{"dir": {"b"}, "from": {next}, "to": {prev}, "limit": {"10"}})
		expectEvents(t, "back to prev_batch", evs, reversed[:3]...)
		if _, ok := page["end"]; ok {
			t.Fatalf("a page that reached its to has an end: %v", page["end"])
		}

		// A new message after next_batch: forward from it gives just that.
		sendMessage(t, srv, alice, roomID, "m7", "m7")
		_, evs = messagesPage(t, srv, alice, roomID, url.Values{"dir": {"f"}, "from": {next}})
		expectEvents(t, "forward from next_batch", evs, "m.room.message|m7")

		// Filters: types with a wildcard, senders, not_types.
		_, evs = messagesPage(t, srv, alice, roomID, url.Values{"dir": {"b"}, "limit": {"3"}, "filter": {`{"types":["m.room.mess*"],"not_senders":["@alice:test.local"]}`}})
		expectEvents(t, "bob's messages", evs, "m.room.message|m6")
		_, evs = messagesPage(t, srv, alice, roomID, url.Values{"dir": {"f"}, "limit": {"3"}, "filter": {`{"not_types":["m.room.message","m.room.power_levels"],"unknown":1}`}})
		expectEvents(t, "not messages", evs, "m.room.create|", "m.room.member|@alice:test.local|join", "m.room.join_rules|")
		_, evs = messagesPage(t, srv, alice, roomID, url.Values{"dir": {"f"}, "limit": {"3"}, "filter": {`{"senders":["@bob:test.local"]}`}})
		expectEvents(t, "bob's events", evs, "m.room.member|@bob:test.local|join", "m.room.message|m6")
	})
}

func TestRoomMessagesErrors(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		eve := srv.Register(t, "eve", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "private_chat"})
		for _, c := range []struct {
			who     *testutil.User
			room    string
			query   string
			status  int
			errcode string
		}{
			{alice, roomID, "", 400, "M_MISSING_PARAM"},
			{alice, roomID, "dir=x", 400, "M_INVALID_PARAM"},
			{alice, roomID, "dir=b&from=nonsense", 400, "M_INVALID_PARAM"},
			{alice, roomID, "dir=b&to=s-1", 400, "M_INVALID_PARAM"},
			{alice, roomID, "dir=b&limit=-1", 400, "M_INVALID_PARAM"},
			{alice, roomID, "dir=b&limit=ten", 400, "M_INVALID_PARAM"},
			{alice, roomID, "dir=b&filter=" + url.QueryEscape(`{"types":"m.room.message"}`), 400, "M_INVALID_PARAM"},
			{alice, roomID, "dir=b&filter=%7B", 400, "M_INVALID_PARAM"},
			{eve, roomID, "dir=b", 403, "M_FORBIDDEN"},
			{alice, "!nowhere:test.local", "dir=b", 404, "M_NOT_FOUND"},
		} {
			expectError(t, srv, "GET", roomPath(c.room, "/messages?"+c.query), c.who.Token, nil, c.status, c.errcode)
		}
		// A large limit is capped, not refused.
		page, _ := messagesPage(t, srv, alice, roomID, url.Values{"dir": {"b"}, "limit": {"100000"}})
		if len(page["chunk"].([]any)) != 6 {
			t.Fatalf("chunk %v", page["chunk"])
		}
	})
}

// TestRoomHistoryVisibility checks which events /messages, /sync and
// /event show a user, for each history visibility setting.
func TestRoomHistoryVisibility(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		dave := srv.Register(t, "dave", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "private_chat"})
		setVisibility := func(v string) {
			srv.Must(t, "PUT", roomPath(roomID, "/state/m.room.history_visibility/"), alice.Token, map[string]any{"history_visibility": v})
		}
		messages := func(u *testutil.User) []string {
			t.Helper()
			evs, _ := allMessages(t, srv, u, roomID, "f", "", 50)
			var out []string
			for _, e := range evs {
				if strings.HasPrefix(e, "m.room.message|") || strings.HasPrefix(e, "m.room.member|") || strings.HasPrefix(e, "m.room.history_visibility|") {
					out = append(out, e)
				}
			}
			return out
		}

		// joined: bob, invited and joined later, sees from his join on (and
		// what came before the setting, shared as a new room's history is).
		setVisibility("joined")
		secret := sendMessage(t, srv, alice, roomID, "1", "before bob")
		srv.Must(t, "POST", roomPath(roomID, "/invite"), alice.Token, map[string]any{"user_id": bob.UserID})
		sendMessage(t, srv, alice, roomID, "2", "while bob is invited")
		srv.Must(t, "POST", roomPath(roomID, "/join"), bob.Token, nil)
		after := sendMessage(t, srv, alice, roomID, "3", "after bob joined")
		// The change to joined shows to bob: judged by the more open of
		// the settings before and after it (shared).
		hv := "m.room.history_visibility|"
		expectEvents(t, "bob's history (joined)", messages(bob),
			"m.room.member|@alice:test.local|join", hv, hv, "m.room.member|@bob:test.local|join", "m.room.message|after bob joined")
		expectEvents(t, "alice's history", messages(alice),
			"m.room.member|@alice:test.local|join", hv, hv, "m.room.message|before bob", "m.room.member|@bob:test.local|invite",
			"m.room.message|while bob is invited", "m.room.member|@bob:test.local|join", "m.room.message|after bob joined")
		bobSync := eventsOf(t, section(t, roomSync(t, srv, bob, nil), "join", roomID), "timeline")
		if slices.Contains(bobSync, "m.room.message|before bob") || !slices.Contains(bobSync, "m.room.message|after bob joined") {
			t.Fatalf("bob's initial sync shows what he may not see, or not what he may: %q", bobSync)
		}
		expectError(t, srv, "GET", roomPath(roomID, "/event/"+url.PathEscape(secret)), bob.Token, nil, 404, "M_NOT_FOUND")
		srv.Must(t, "GET", roomPath(roomID, "/event/"+url.PathEscape(after)), bob.Token, nil)
		expectError(t, srv, "GET", roomPath(roomID, "/context/"+url.PathEscape(secret)), bob.Token, nil, 404, "M_NOT_FOUND")
		around := srv.Must(t, "GET", roomPath(roomID, "/context/"+url.PathEscape(after)+"?limit=10"), bob.Token, nil)
		// Five read before: bob's join and invite, the messages while he
		// was invited and before, and the change to joined.
		expectEvents(t, "bob's context before", eventList(t, around["events_before"]),
			"m.room.member|@bob:test.local|join", "m.room.history_visibility|")

		// invited: carol sees from her invite on.
		setVisibility("invited")
		sendMessage(t, srv, alice, roomID, "4", "before carol")
		srv.Must(t, "POST", roomPath(roomID, "/invite"), alice.Token, map[string]any{"user_id": carol.UserID})
		sendMessage(t, srv, alice, roomID, "5", "while carol is invited")
		srv.Must(t, "POST", roomPath(roomID, "/join"), carol.Token, nil)
		// The change to invited does not show to carol: judged as invited,
		// and she was not invited yet.
		expectEvents(t, "carol's history (invited)", messages(carol), "m.room.member|@alice:test.local|join", hv, hv,
			"m.room.member|@carol:test.local|invite", "m.room.message|while carol is invited", "m.room.member|@carol:test.local|join")

		// shared: a member sees what was sent while it was shared, from
		// before they joined, but not what "joined" hid.
		setVisibility("shared")
		sendMessage(t, srv, alice, roomID, "6", "shared, before dave")
		srv.Must(t, "POST", roomPath(roomID, "/invite"), alice.Token, map[string]any{"user_id": dave.UserID})
		srv.Must(t, "POST", roomPath(roomID, "/join"), dave.Token, nil)
		daves := messages(dave)
		if !slices.Contains(daves, "m.room.message|shared, before dave") || slices.Contains(daves, "m.room.message|before carol") ||
			slices.Contains(daves, "m.room.message|before bob") {
			t.Fatalf("dave's history (shared): %q", daves)
		}

		// bob leaves: his history ends with his leave, on every endpoint.
		srv.Must(t, "POST", roomPath(roomID, "/leave"), bob.Token, nil)
		gone := sendMessage(t, srv, alice, roomID, "7", "after bob left")
		back, _ := allMessages(t, srv, bob, roomID, "b", "", 50)
		if back[0] != "m.room.member|@bob:test.local|leave" || slices.Contains(back, "m.room.message|after bob left") {
			t.Fatalf("bob's history after leaving, newest first: %q", back)
		}
		expectError(t, srv, "GET", roomPath(roomID, "/event/"+url.PathEscape(gone)), bob.Token, nil, 404, "M_NOT_FOUND")
		srv.Must(t, "GET", roomPath(roomID, "/event/"+url.PathEscape(after)), bob.Token, nil)

		// world_readable: anyone may read, even someone never in the room.
		outsider := srv.Register(t, "outsider", "")
		expectError(t, srv, "GET", roomPath(roomID, "/messages?dir=b"), outsider.Token, nil, http.StatusForbidden, "M_FORBIDDEN")
		setVisibility("world_readable")
		open := sendMessage(t, srv, alice, roomID, "8", "for everyone")
		_, evs := messagesPage(t, srv, outsider, roomID, url.Values{"dir": {"b"}, "limit": {"2"}})
		expectEvents(t, "outsider's page", evs, "m.room.message|for everyone", "m.room.history_visibility|")
		srv.Must(t, "GET", roomPath(roomID, "/event/"+url.PathEscape(open)), outsider.Token, nil)
		expectError(t, srv, "GET", roomPath(roomID, "/event/"+url.PathEscape(gone)), outsider.Token, nil, 404, "M_NOT_FOUND")
	})
}

func TestRoomMembersFilters(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "private_chat"})
		early := roomSync(t, srv, alice, nil)["next_batch"].(string)
		srv.Must(t, "POST", roomPath(roomID, "/invite"), alice.Token, map[string]any{"user_id": bob.UserID})
		srv.Must(t, "POST", roomPath(roomID, "/join"), bob.Token, nil)
		srv.Must(t, "POST", roomPath(roomID, "/invite"), alice.Token, map[string]any{"user_id": carol.UserID})
		bobIn := roomSync(t, srv, alice, nil)["next_batch"].(string)
		srv.Must(t, "POST", roomPath(roomID, "/leave"), bob.Token, nil)

		members := func(u *testutil.User, q string) []string {
			t.Helper()
			var out []string
			for _, e := range srv.Must(t, "GET", roomPath(roomID, "/members?"+q), u.Token, nil)["chunk"].([]any) {
				ev := e.(map[string]any)
				out = append(out, ev["state_key"].(string)+"|"+ev["content"].(map[string]any)["membership"].(string))
			}
			slices.Sort(out)
			return out
		}
		expectEvents(t, "all", members(alice, ""), "@alice:test.local|join", "@bob:test.local|leave", "@carol:test.local|invite")
		expectEvents(t, "membership=join", members(alice, "membership=join"), "@alice:test.local|join")
		expectEvents(t, "not_membership=leave", members(alice, "not_membership=leave"), "@alice:test.local|join", "@carol:test.local|invite")
		expectEvents(t, "both", members(alice, "membership=leave&not_membership=join"), "@bob:test.local|leave", "@carol:test.local|invite")
		expectEvents(t, "at the start", members(alice, "at="+url.QueryEscape(early)), "@alice:test.local|join")
		expectEvents(t, "at bob's time in", members(alice, "at="+url.QueryEscape(bobIn)), "@alice:test.local|join", "@bob:test.local|join", "@carol:test.local|invite")
		// bob, gone, sees the members as they were when he left, whatever at.
		expectEvents(t, "bob after leaving", members(bob, "at="+url.QueryEscape(bobIn)), "@alice:test.local|join", "@bob:test.local|join", "@carol:test.local|invite")
		expectEvents(t, "bob now", members(bob, ""), "@alice:test.local|join", "@bob:test.local|leave", "@carol:test.local|invite")
		expectError(t, srv, "GET", roomPath(roomID, "/members?membership=joined"), alice.Token, nil, 400, "M_INVALID_PARAM")
		expectError(t, srv, "GET", roomPath(roomID, "/members?at=x"), alice.Token, nil, 400, "M_INVALID_PARAM")
	})
}

func TestRoomContext(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "public_chat"})
		var ids []string
		for _, b := range []string{"m1", "m2", "m3", "m4", "m5", "m6"} {
			ids = append(ids, sendMessage(t, srv, alice, roomID, b, b))
		}
		srv.Must(t, "PUT", roomPath(roomID, "/state/m.room.topic/"), alice.Token, map[string]any{"topic": "later"})

		// Two before (newest first), the event, three after (oldest first);
		// the state after the last one returned.
		c := srv.Must(t, "GET", roomPath(roomID, "/context/"+url.PathEscape(ids[2])+"?limit=5"), alice.Token, nil)
		if ev := c["event"].(map[string]any); ev["event_id"] != ids[2] {
			t.Fatalf("context event %v", ev)
		}
		expectEvents(t, "events_before", eventList(t, c["events_before"]), "m.room.message|m2", "m.room.message|m1")
		expectEvents(t, "events_after", eventList(t, c["events_after"]), "m.room.message|m4", "m.room.message|m5", "m.room.message|m6")
		for _, st := range eventList(t, c["state"]) {
			if st == "m.room.topic|" {
				t.Fatalf("the state after m6 has the topic set after it: %q", eventList(t, c["state"]))
			}
		}
		if len(eventList(t, c["state"])) < 5 {
			t.Fatalf("state %q", eventList(t, c["state"]))
		}

		// The tokens continue with /messages: back from start, forward
		// from end.
		_, back := messagesPage(t, srv, alice, roomID, url.Values{"dir": {"b"}, "from": {c["start"].(string)}, "limit": {"1"}})
		expectEvents(t, "before start", back, "m.room.guest_access|")
		_, fwd := messagesPage(t, srv, alice, roomID, url.Values{"dir": {"f"}, "from": {c["end"].(string)}})
		expectEvents(t, "after end", fwd, "m.room.topic|")

		// A filter applies to the events around.
		c = srv.Must(t, "GET", roomPath(roomID, "/context/"+url.PathEscape(ids[5])+"?limit=4&filter="+url.QueryEscape(`{"not_types":["m.room.topic"]}`)), alice.Token, nil)
		expectEvents(t, "filtered after", eventList(t, c["events_after"]))
		expectEvents(t, "filtered before", eventList(t, c["events_before"]), "m.room.message|m5", "m.room.message|m4")

		// Errors: an unknown event, an event of another room, a
		// non-member, a bad limit.
		other := createRoom(t, srv, alice, map[string]any{"preset": "public_chat"})
		expectError(t, srv, "GET", roomPath(roomID, "/context/$nope"), alice.Token, nil, 404, "M_NOT_FOUND")
		expectError(t, srv, "GET", roomPath(other, "/context/"+url.PathEscape(ids[0])), alice.Token, nil, 404, "M_NOT_FOUND")
		expectError(t, srv, "GET", roomPath(roomID, "/context/"+url.PathEscape(ids[0])), bob.Token, nil, 403, "M_FORBIDDEN")
		expectError(t, srv, "GET", roomPath(roomID, "/context/"+url.PathEscape(ids[0])+"?limit=-2"), alice.Token, nil, 400, "M_INVALID_PARAM")
	})
}
