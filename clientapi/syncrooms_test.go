package clientapi_test

import (
	"net/url"
	"slices"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

func sendMessage(t *testing.T, srv *testutil.Server, u *testutil.User, roomID, txn, body string) string {
	t.Helper()
	return srv.Must(t, "PUT", roomPath(roomID, "/send/m.room.message/"+txn), u.Token, map[string]any{"msgtype": "m.text", "body": body})["event_id"].(string)
}

// roomSync sends /sync with query parameters and returns the answer.
func roomSync(t *testing.T, srv *testutil.Server, u *testutil.User, query url.Values) map[string]any {
	t.Helper()
	if query == nil {
		query = url.Values{}
	}
	query.Set("timeout", "0")
	return srv.Must(t, "GET", v3+"/sync?"+query.Encode(), u.Token, nil)
}

func section(t *testing.T, sync map[string]any, kind, roomID string) map[string]any {
	t.Helper()
	room, _ := sync["rooms"].(map[string]any)[kind].(map[string]any)[roomID].(map[string]any)
	return room
}

// eventsOf returns "type|state_key|body-or-membership" of a section's
// list of events, to compare.
func eventsOf(t *testing.T, room map[string]any, part string) []string {
	t.Helper()
	p, ok := room[part].(map[string]any)
	if !ok {
		t.Fatalf("no %s in %v", part, room)
	}
	var out []string
	for _, e := range p["events"].([]any) {
		ev := e.(map[string]any)
		s := ev["type"].(string)
		if k, ok := ev["state_key"].(string); ok {
			s += "|" + k
		}
		c := ev["content"].(map[string]any)
		if b, ok := c["body"].(string); ok {
			s += "|" + b
		}
		if m, ok := c["membership"].(string); ok {
			s += "|" + m
		}
		out = append(out, s)
	}
	return out
}

func expectEvents(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s:\n got %q\nwant %q", what, got, want)
	}
}

func TestSyncRoomsJoined(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "public_chat", "name": "R"})
		sendMessage(t, srv, alice, roomID, "1", "one")
		sendMessage(t, srv, alice, roomID, "2", "two")
		sendMessage(t, srv, alice, roomID, "3", "three")

		// Initial sync with a limit of 2: the newest two messages, limited,
		// and the whole state before them.
		limit2 := url.Values{"filter": {`{"room":{"timeline":{"limit":2}},"unknown_field":{"x":1}}`}}
		initial := roomSync(t, srv, alice, limit2)
		room := section(t, initial, "join", roomID)
		expectEvents(t, "initial timeline", eventsOf(t, room, "timeline"), "m.room.message|two", "m.room.message|three")
		tl := room["timeline"].(map[string]any)
		if tl["limited"] != true || tl["prev_batch"] == nil {
			t.Fatalf("initial timeline: %v", tl)
		}
		expectEvents(t, "initial state", eventsOf(t, room, "state"),
			"m.room.create|", "m.room.member|"+alice.UserID+"|join", "m.room.power_levels|", "m.room.join_rules|",
			"m.room.history_visibility|", "m.room.guest_access|", "m.room.name|")
	})
}

func TestSyncRooms(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "public_chat", "name": "R"})
		sendMessage(t, srv, alice, roomID, "1", "one")

		// Initial sync: the room's events in the timeline, unlimited, and
		// no state before the first event (the create has none).
		initial := roomSync(t, srv, alice, nil)
		room := section(t, initial, "join", roomID)
		timeline := eventsOf(t, room, "timeline")
		if len(timeline) != 8 || timeline[0] != "m.room.create|" || timeline[7] != "m.room.message|one" {
			t.Fatalf("initial timeline %q", timeline)
		}
		expectEvents(t, "state before the create", eventsOf(t, room, "state"))
		since := initial["next_batch"].(string)

		// A waiting sync wakes for a new event of the room: just it.
		srv.Must(t, "POST", roomPath(roomID, "/join"), bob.Token, nil)
		since = roomSync(t, srv, alice, url.Values{"since": {since}})["next_batch"].(string)
		ch := syncAsync(t, srv, alice, since, 1)
		sendMessage(t, srv, bob, roomID, "1", "hello")
		woken := receive(t, ch).Body
		room = section(t, woken, "join", roomID)
		expectEvents(t, "woken timeline", eventsOf(t, room, "timeline"), "m.room.message|hello")
		expectEvents(t, "woken state", eventsOf(t, room, "state"))
		if room["timeline"].(map[string]any)["limited"] != false {
			t.Fatalf("a contiguous timeline is limited: %v", room["timeline"])
		}
		since = woken["next_batch"].(string)

		// Nothing new: the room is left out.
		if r := section(t, roomSync(t, srv, alice, url.Values{"since": {since}}), "join", roomID); r != nil {
			t.Fatalf("an idle room is in /sync: %v", r)
		}

		// A gap: the timeline is limited and the state that changed in the
		// gap comes with it.
		srv.Must(t, "PUT", roomPath(roomID, "/state/m.room.topic/"), alice.Token, map[string]any{"topic": "new"})
		sendMessage(t, srv, alice, roomID, "g1", "g1")
		sendMessage(t, srv, alice, roomID, "g2", "g2")
		sendMessage(t, srv, alice, roomID, "g3", "g3")
		limit2 := `{"room":{"timeline":{"limit":2}}}`
		gap := roomSync(t, srv, alice, url.Values{"since": {since}, "filter": {limit2}})
		room = section(t, gap, "join", roomID)
		expectEvents(t, "gap timeline", eventsOf(t, room, "timeline"), "m.room.message|g2", "m.room.message|g3")
		expectEvents(t, "gap state", eventsOf(t, room, "state"), "m.room.topic|")
		if room["timeline"].(map[string]any)["limited"] != true {
			t.Fatalf("a timeline with a gap is not limited: %v", room["timeline"])
		}
		// full_state: the whole state before the timeline.
		full := roomSync(t, srv, alice, url.Values{"since": {since}, "filter": {limit2}, "full_state": {"true"}})
		if got := eventsOf(t, section(t, full, "join", roomID), "state"); len(got) != 9 || got[0] != "m.room.create|" {
			t.Fatalf("full state %q", got)
		}
		since = gap["next_batch"].(string)

		// A stored filter works like an inline one.
		filterID := srv.Must(t, "POST", v3+"/user/"+url.PathEscape(alice.UserID)+"/filter", alice.Token,
			map[string]any{"room": map[string]any{"timeline": map[string]any{"limit": 1}}, "event_format": "client"})["filter_id"].(string)
		sendMessage(t, srv, alice, roomID, "f1", "f1")
		sendMessage(t, srv, alice, roomID, "f2", "f2")
		room = section(t, roomSync(t, srv, alice, url.Values{"since": {since}, "filter": {filterID}}), "join", roomID)
		expectEvents(t, "timeline with a stored filter", eventsOf(t, room, "timeline"), "m.room.message|f2")

		// Room account data goes under its room, and wakes a waiting sync.
		since = roomSync(t, srv, alice, url.Values{"since": {since}})["next_batch"].(string)
		ch = syncAsync(t, srv, alice, since, 1)
		srv.Must(t, "PUT", accountDataPath(alice.UserID, roomID, "m.tag"), alice.Token, map[string]any{"tags": map[string]any{}})
		room = section(t, receive(t, ch).Body, "join", roomID)
		if data := testutil.Canonical(t, room["account_data"]); data != `{"events":[{"content":{"tags":{}},"type":"m.tag"}]}` {
			t.Fatalf("room account data %s", data)
		}

		// An invite: stripped state with the invite itself.
		carolSince := roomSync(t, srv, carol, nil)["next_batch"].(string)
		srv.Must(t, "POST", roomPath(roomID, "/invite"), alice.Token, map[string]any{"user_id": carol.UserID})
		inv := section(t, roomSync(t, srv, carol, url.Values{"since": {carolSince}}), "invite", roomID)
		if inv == nil {
			t.Fatal("no invite in carol's sync")
		}
		stripped := inv["invite_state"].(map[string]any)["events"].([]any)
		var kinds []string
		for _, e := range stripped {
			ev := e.(map[string]any)
			// Stripped, but for the create event, shown whole with its
			// ID, room and timestamp (MSC4311).
			for k := range ev {
				if k != "type" && k != "state_key" && k != "content" && k != "sender" && ev["type"] != "m.room.create" {
					t.Fatalf("stripped state has %q: %v", k, ev)
				}
			}
			if ev["type"] == "m.room.create" && (ev["room_id"] != roomID || ev["origin_server_ts"] == nil || ev["event_id"] == nil) {
				t.Fatalf("the create event in stripped state: %v", ev)
			}
			kinds = append(kinds, ev["type"].(string)+"|"+ev["state_key"].(string))
		}
		expectEvents(t, "invite state", kinds, "m.room.create|", "m.room.join_rules|", "m.room.name|", "m.room.topic|", "m.room.member|"+carol.UserID)
		if section(t, roomSync(t, srv, carol, nil), "invite", roomID) == nil {
			t.Fatal("no invite in carol's initial sync")
		}

		// Joining, then leaving: the leave in rooms.leave, not in join.
		srv.Must(t, "POST", roomPath(roomID, "/join"), carol.Token, nil)
		joined := roomSync(t, srv, carol, url.Values{"since": {carolSince}})
		if section(t, joined, "join", roomID) == nil || section(t, joined, "invite", roomID) != nil {
			t.Fatalf("carol joined: %v", joined["rooms"])
		}
		// Having joined since the token, carol gets the whole state before
		// her timeline (from the create on), not only what changed since.
		if got := eventsOf(t, section(t, joined, "join", roomID), "state"); len(got) == 0 || got[0] != "m.room.create|" {
			t.Fatalf("state for a new member: %q", got)
		}
		carolSince = joined["next_batch"].(string)
		srv.Must(t, "POST", roomPath(roomID, "/leave"), carol.Token, nil)
		sendMessage(t, srv, alice, roomID, "after", "after carol left")
		left := roomSync(t, srv, carol, url.Values{"since": {carolSince}})
		if section(t, left, "join", roomID) != nil {
			t.Fatal("a left room is still joined")
		}
		expectEvents(t, "leave timeline", eventsOf(t, section(t, left, "leave", roomID), "timeline"), "m.room.member|"+carol.UserID+"|leave")
		if section(t, roomSync(t, srv, carol, nil), "leave", roomID) != nil {
			t.Fatal("an initial sync shows left rooms without include_leave")
		}
		withLeave := roomSync(t, srv, carol, url.Values{"filter": {`{"room":{"include_leave":true}}`}})
		if tl := eventsOf(t, section(t, withLeave, "leave", roomID), "timeline"); tl[len(tl)-1] != "m.room.member|"+carol.UserID+"|leave" {
			t.Fatalf("include_leave timeline %q", tl)
		}
		// rooms / not_rooms.
		if section(t, roomSync(t, srv, alice, url.Values{"filter": {`{"room":{"not_rooms":["` + roomID + `"]}}`}}), "join", roomID) != nil {
			t.Fatal("not_rooms ignored")
		}
	})
}

func TestSyncFilters(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		path := v3 + "/user/" + url.PathEscape(alice.UserID) + "/filter"
		body := map[string]any{"room": map[string]any{"timeline": map[string]any{"limit": 5}}, "presence": map[string]any{"not_types": []string{"*"}}}
		id := srv.Must(t, "POST", path, alice.Token, body)["filter_id"].(string)
		got := srv.Must(t, "GET", path+"/"+id, alice.Token, nil)
		if testutil.Canonical(t, got) != testutil.Canonical(t, body) {
			t.Fatalf("filter %v, want %v", got, body)
		}
		if other := srv.Must(t, "POST", path, alice.Token, body)["filter_id"]; other == id {
			t.Fatal("two filters got one ID")
		}
		expectError(t, srv, "GET", path+"/999", alice.Token, nil, 404, "M_NOT_FOUND")
		expectError(t, srv, "GET", path+"/nonsense", alice.Token, nil, 404, "M_NOT_FOUND")
		expectError(t, srv, "GET", path+"/"+id, bob.Token, nil, 403, "M_FORBIDDEN")
		expectError(t, srv, "POST", path, bob.Token, body, 403, "M_FORBIDDEN")
		expectError(t, srv, "POST", path, alice.Token, map[string]any{"room": map[string]any{"timeline": map[string]any{"limit": "ten"}}}, 400, "M_BAD_JSON")
		expectError(t, srv, "POST", path, alice.Token, `[]`, 400, "M_BAD_JSON")
		expectError(t, srv, "GET", v3+"/sync?filter="+url.QueryEscape(`{"room":{"timeline":{"limit":"x"}}}`), alice.Token, nil, 400, "M_BAD_JSON")
		expectError(t, srv, "GET", v3+"/sync?filter=12345", alice.Token, nil, 400, "M_BAD_JSON")
		// Tokens handed out before rooms existed stay valid.
		srv.Must(t, "GET", v3+"/sync?timeout=0&since=s0", alice.Token, nil)
	})
}

func TestSyncRoomSummary(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "private_chat", "invite": []string{bob.UserID, carol.UserID}})
		summary := func(sync map[string]any) map[string]any {
			t.Helper()
			s, _ := section(t, sync, "join", roomID)["summary"].(map[string]any)
			return s
		}
		expectSummary := func(what string, s map[string]any, joined, invited float64, heroes ...string) {
			t.Helper()
			var got []string
			for _, h := range s["m.heroes"].([]any) {
				got = append(got, h.(string))
			}
			if s["m.joined_member_count"] != joined || s["m.invited_member_count"] != invited || !slices.Equal(got, heroes) {
				t.Fatalf("%s: summary %v, want %v joined, %v invited, heroes %q", what, s, joined, invited, heroes)
			}
		}

		initial := roomSync(t, srv, alice, nil)
		expectSummary("alice's initial sync", summary(initial), 1, 2, bob.UserID, carol.UserID)
		since := initial["next_batch"].(string)

		// A message changes nothing: no summary.
		sendMessage(t, srv, alice, roomID, "1", "hi")
		next := roomSync(t, srv, alice, url.Values{"since": {since}})
		if s := summary(next); s != nil {
			t.Fatalf("a summary after a message alone: %v", s)
		}
		since = next["next_batch"].(string)

		// bob joins: alice's next sync has the new counts, bob's first the
		// others in the order they came.
		srv.Must(t, "POST", roomPath(roomID, "/join"), bob.Token, nil)
		expectSummary("after bob joined", summary(roomSync(t, srv, alice, url.Values{"since": {since}})), 2, 1, carol.UserID, bob.UserID)
		expectSummary("bob's initial sync", summary(roomSync(t, srv, bob, nil)), 2, 1, alice.UserID, carol.UserID)

		// Everyone else gone: the heroes are those who left.
		srv.Must(t, "POST", roomPath(roomID, "/leave"), bob.Token, nil)
		srv.Must(t, "POST", roomPath(roomID, "/kick"), alice.Token, map[string]any{"user_id": carol.UserID})
		expectSummary("alone", summary(roomSync(t, srv, alice, nil)), 1, 0, bob.UserID, carol.UserID)
	})
}

func TestSyncTimelineFilter(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "public_chat"})
		srv.Must(t, "POST", roomPath(roomID, "/join"), bob.Token, nil)
		sendMessage(t, srv, alice, roomID, "1", "a1")
		sendMessage(t, srv, bob, roomID, "1", "b1")
		srv.Must(t, "PUT", roomPath(roomID, "/state/m.room.topic/"), alice.Token, map[string]any{"topic": "t1"})
		sendMessage(t, srv, alice, roomID, "2", "a2")
		sendMessage(t, srv, bob, roomID, "2", "b2")

		filter := func(f string) url.Values { return url.Values{"filter": {`{"room":{"timeline":` + f + `}}`}} }
		// The newest two messages, limited; the state before them whole.
		initial := roomSync(t, srv, alice, filter(`{"limit":2,"types":["m.room.message"]}`))
		room := section(t, initial, "join", roomID)
		expectEvents(t, "messages only", eventsOf(t, room, "timeline"), "m.room.message|a2", "m.room.message|b2")
		if room["timeline"].(map[string]any)["limited"] != true {
			t.Fatalf("a timeline with more messages before it is not limited")
		}
		state := eventsOf(t, room, "state")
		if !slices.Contains(state, "m.room.topic|") || !slices.Contains(state, "m.room.member|@bob:test.local|join") {
			t.Fatalf("state before the timeline: %q", state)
		}
		// Everything there is, by sender.
		room = section(t, roomSync(t, srv, alice, filter(`{"limit":10,"senders":["@bob:test.local"]}`)), "join", roomID)
		expectEvents(t, "bob's events", eventsOf(t, room, "timeline"), "m.room.member|@bob:test.local|join", "m.room.message|b1", "m.room.message|b2")
		if room["timeline"].(map[string]any)["limited"] != false {
			t.Fatalf("every event of bob's is there, yet limited")
		}
		// A filter that lets nothing through: the room is still there, with
		// its whole state.
		room = section(t, roomSync(t, srv, alice, filter(`{"types":["m.nothing"]}`)), "join", roomID)
		if len(eventsOf(t, room, "timeline")) != 0 || !slices.Contains(eventsOf(t, room, "state"), "m.room.topic|") {
			t.Fatalf("an empty filtered timeline: %v", room)
		}

		// Incremental: a topic change the filter hides comes as state.
		since := initial["next_batch"].(string)
		srv.Must(t, "PUT", roomPath(roomID, "/state/m.room.topic/"), alice.Token, map[string]any{"topic": "t2"})
		sendMessage(t, srv, alice, roomID, "3", "a3")
		q := filter(`{"types":["m.room.message"]}`)
		q.Set("since", since)
		room = section(t, roomSync(t, srv, alice, q), "join", roomID)
		expectEvents(t, "new messages", eventsOf(t, room, "timeline"), "m.room.message|a3")
		expectEvents(t, "the hidden change as state", eventsOf(t, room, "state"), "m.room.topic|")
	})
}
