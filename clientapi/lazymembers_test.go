package clientapi_test

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

// members keeps the m.room.member entries of eventsOf's list, sorted.
func members(evs []string) []string {
	var out []string
	for _, e := range evs {
		if strings.HasPrefix(e, "m.room.member|") {
			out = append(out, e)
		}
	}
	slices.Sort(out)
	return out
}

// lazySync is a /sync with a lazy-loading filter (and extra filter JSON
// inside "room.state") and its answer's next_batch.
func lazySync(t *testing.T, srv *testutil.Server, u *testutil.User, since, stateExtra string, limit string, more url.Values) map[string]any {
	t.Helper()
	q := url.Values{"filter": {`{"room":{"state":{"lazy_load_members":true` + stateExtra + `},"timeline":{"limit":` + limit + `}}}`}}
	for k, v := range more {
		q[k] = v
	}
	if since != "" {
		q.Set("since", since)
	}
	return roomSync(t, srv, u, q)
}

// Lazy-loaded members in /sync: the state carries the member events of
// the timeline's senders and the user's own, not the others'; an
// incremental sync sends a member event once per device (unless
// include_redundant_members), again to a device that syncs from a token
// older than the answer that carried it, and to another device; a
// full_state sync sends them again.
func TestSyncLazyLoadMembers(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		dave := srv.Register(t, "dave", "")
		// Named: the heroes' member events are not needed (see
		// TestSyncLazyLoadHeroes).
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "public_chat", "name": "R"})
		for _, u := range []*testutil.User{bob, carol, dave} {
			srv.Must(t, "POST", roomPath(roomID, "/join"), u.Token, nil)
		}
		srv.Must(t, "PUT", roomPath(roomID, "/state/m.room.topic/"), alice.Token, map[string]any{"topic": "t"})
		sendMessage(t, srv, bob, roomID, "1", "b1")

		// Without lazy loading: every member.
		room := section(t, roomSync(t, srv, alice, url.Values{"filter": {`{"room":{"timeline":{"limit":1}}}`}}), "join", roomID)
		expectEvents(t, "all members", members(eventsOf(t, room, "state")),
			"m.room.member|@alice:test.local|join", "m.room.member|@bob:test.local|join", "m.room.member|@carol:test.local|join", "m.room.member|@dave:test.local|join")

		// Initial, lazy: bob (the sender) and alice (the user); the rest of
		// the state as it is.
		initial := lazySync(t, srv, alice, "", "", "1", nil)
		room = section(t, initial, "join", roomID)
		state := eventsOf(t, room, "state")
		expectEvents(t, "initial lazy members", members(state), "m.room.member|@alice:test.local|join", "m.room.member|@bob:test.local|join")
		if !slices.Contains(state, "m.room.topic|") || !slices.Contains(state, "m.room.create|") {
			t.Fatalf("the state without members: %q", state)
		}
		next := initial["next_batch"].(string)

		// carol speaks: her member event only; bob's and alice's were sent.
		sendMessage(t, srv, carol, roomID, "1", "c1")
		sendMessage(t, srv, bob, roomID, "2", "b2")
		sync := lazySync(t, srv, alice, next, "", "10", nil)
		room = section(t, sync, "join", roomID)
		expectEvents(t, "timeline", eventsOf(t, room, "timeline"), "m.room.message|c1", "m.room.message|b2")
		expectEvents(t, "carol's member event, once", eventsOf(t, room, "state"), "m.room.member|@carol:test.local|join")
		afterCarol := sync["next_batch"].(string)

		// The same sync again from the older token (its answer lost): carol's
		// member event again.
		room = section(t, lazySync(t, srv, alice, next, "", "10", nil), "join", roomID)
		expectEvents(t, "repeated from the older token", eventsOf(t, room, "state"), "m.room.member|@carol:test.local|join")

		// From the newer token: nobody new speaks, no member event.
		sendMessage(t, srv, carol, roomID, "2", "c2")
		sync = lazySync(t, srv, alice, afterCarol, "", "10", nil)
		room = section(t, sync, "join", roomID)
		expectEvents(t, "timeline", eventsOf(t, room, "timeline"), "m.room.message|c2")
		expectEvents(t, "carol again, not sent", eventsOf(t, room, "state"))
		afterC2 := sync["next_batch"].(string)

		// include_redundant_members: sent all the same.
		sendMessage(t, srv, bob, roomID, "3", "b3")
		room = section(t, lazySync(t, srv, alice, afterC2, `,"include_redundant_members":true`, "10", nil), "join", roomID)
		expectEvents(t, "redundant members", members(eventsOf(t, room, "state")), "m.room.member|@alice:test.local|join", "m.room.member|@bob:test.local|join")

		// full_state: the whole state again, members of the senders and the
		// user.
		room = section(t, lazySync(t, srv, alice, afterC2, "", "1", url.Values{"full_state": {"true"}}), "join", roomID)
		state = eventsOf(t, room, "state")
		expectEvents(t, "full_state lazy members", members(state), "m.room.member|@alice:test.local|join", "m.room.member|@bob:test.local|join")
		if !slices.Contains(state, "m.room.create|") {
			t.Fatalf("full_state without the room's state: %q", state)
		}

		// Another device of alice's has been sent nothing.
		other := srv.Login(t, alice, "OTHER")
		room = section(t, lazySync(t, srv, other, afterC2, "", "10", nil), "join", roomID)
		expectEvents(t, "another device", members(eventsOf(t, room, "state")), "m.room.member|@alice:test.local|join", "m.room.member|@bob:test.local|join")

		// A member event in the timeline counts as sent: dave changes his
		// name and speaks; the next sync of his has no state for him.
		since := roomSync(t, srv, alice, nil)["next_batch"].(string)
		sync = lazySync(t, srv, alice, since, "", "10", nil)
		srv.Must(t, "PUT", roomPath(roomID, "/state/m.room.member/"+url.PathEscape(dave.UserID)), dave.Token, map[string]any{"membership": "join", "displayname": "D"})
		sync = lazySync(t, srv, alice, sync["next_batch"].(string), "", "10", nil)
		room = section(t, sync, "join", roomID)
		expectEvents(t, "dave's new member event", eventsOf(t, room, "timeline"), "m.room.member|@dave:test.local|join")
		sendMessage(t, srv, dave, roomID, "1", "d1")
		room = section(t, lazySync(t, srv, alice, sync["next_batch"].(string), "", "10", nil), "join", roomID)
		expectEvents(t, "dave speaks", eventsOf(t, room, "timeline"), "m.room.message|d1")
		expectEvents(t, "dave's member event was in the timeline", eventsOf(t, room, "state"))

		// A gap (the limit) with lazy loading: of the members that changed
		// in it, none (carol's is not a sender's); bob's, the sender's, not
		// sent since the initial sync, as it was before the timeline.
		since = lazySync(t, srv, alice, "", "", "1", nil)["next_batch"].(string)
		srv.Must(t, "PUT", roomPath(roomID, "/state/m.room.member/"+url.PathEscape(carol.UserID)), carol.Token, map[string]any{"membership": "join", "displayname": "C"})
		srv.Must(t, "PUT", roomPath(roomID, "/state/m.room.topic/"), alice.Token, map[string]any{"topic": "t2"})
		sendMessage(t, srv, bob, roomID, "4", "b4")
		room = section(t, lazySync(t, srv, alice, since, "", "1", nil), "join", roomID)
		if room["timeline"].(map[string]any)["limited"] != true {
			t.Fatalf("a gap, not limited: %v", room["timeline"])
		}
		expectEvents(t, "state in the gap", eventsOf(t, room, "state"), "m.room.topic|", "m.room.member|@bob:test.local|join")
	})
}

// Lazy loading in a room without a name or canonical alias: the state
// also carries the member events of the summary's heroes, which clients
// name the room after (as Synapse sends them); once the room has a name,
// not.
func TestSyncLazyLoadHeroes(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "public_chat"})
		// The first five to join are the heroes; bob and carol come after.
		want := []string{"m.room.member|@alice:test.local|join", "m.room.member|@bob:test.local|join"}
		for i := range 5 {
			h := srv.Register(t, fmt.Sprint("hero", i), "")
			srv.Must(t, "POST", roomPath(roomID, "/join"), h.Token, nil)
			want = append(want, "m.room.member|"+h.UserID+"|join")
		}
		srv.Must(t, "POST", roomPath(roomID, "/join"), bob.Token, nil)
		srv.Must(t, "POST", roomPath(roomID, "/join"), carol.Token, nil)
		sendMessage(t, srv, bob, roomID, "1", "b1")

		sync := lazySync(t, srv, alice, "", "", "1", nil)
		room := section(t, sync, "join", roomID)
		heroes := room["summary"].(map[string]any)["m.heroes"].([]any)
		if len(heroes) != 5 || slices.Contains(heroes, any(carol.UserID)) {
			t.Fatalf("heroes %v", heroes)
		}
		slices.Sort(want)
		expectEvents(t, "sender, user and heroes", members(eventsOf(t, room, "state")), want...)
		// carol, neither sender nor hero, is not there.

		srv.Must(t, "PUT", roomPath(roomID, "/state/m.room.name/"), alice.Token, map[string]any{"name": "N"})
		other := srv.Login(t, alice, "NAMED")
		room = section(t, lazySync(t, srv, other, "", "", "1", nil), "join", roomID)
		expectEvents(t, "named: the sender's and the user's", members(eventsOf(t, room, "state")), "m.room.member|@alice:test.local|join")
	})
}

// Lazy-loaded members in /messages: the answer's state holds the member
// events of its events' senders; without the filter there is none.
func TestMessagesLazyLoadMembers(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "public_chat"})
		srv.Must(t, "POST", roomPath(roomID, "/join"), bob.Token, nil)
		srv.Must(t, "POST", roomPath(roomID, "/join"), carol.Token, nil)
		sendMessage(t, srv, bob, roomID, "1", "b1")
		sendMessage(t, srv, carol, roomID, "1", "c1")
		sendMessage(t, srv, bob, roomID, "2", "b2")

		lazy := url.Values{"dir": {"b"}, "limit": {"2"}, "filter": {`{"lazy_load_members":true}`}}
		page, evs := messagesPage(t, srv, alice, roomID, lazy)
		expectEvents(t, "page", evs, "m.room.message|b2", "m.room.message|c1")
		if _, ok := page["state"].([]any); !ok {
			t.Fatalf("a lazy-loading page without state: %v", page)
		}
		expectEvents(t, "the senders' member events", members(eventList(t, page["state"])),
			"m.room.member|@bob:test.local|join", "m.room.member|@carol:test.local|join")

		lazy.Set("filter", `{"lazy_load_members":true,"types":["m.room.message"],"senders":["@bob:test.local"]}`)
		page, evs = messagesPage(t, srv, alice, roomID, lazy)
		expectEvents(t, "bob's page", evs, "m.room.message|b2", "m.room.message|b1")
		expectEvents(t, "bob's member event", members(eventList(t, page["state"])), "m.room.member|@bob:test.local|join")

		page, _ = messagesPage(t, srv, alice, roomID, url.Values{"dir": {"b"}, "limit": {"2"}})
		if _, ok := page["state"]; ok {
			t.Fatalf("state without lazy loading: %v", page["state"])
		}
	})
}

// The timeline's default limit (no filter), and a room joined in the
// range with more history than the limit: the newest events, limited,
// with a prev_batch /messages pages back from without a gap or a repeat.
func TestSyncDefaultLimitAndJoinedRoomHistory(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "public_chat"})
		for i := range 15 {
			sendMessage(t, srv, alice, roomID, "m"+string(rune('a'+i)), "m"+string(rune('a'+i)))
		}
		since := roomSync(t, srv, bob, nil)["next_batch"].(string)
		srv.Must(t, "POST", roomPath(roomID, "/join"), bob.Token, nil)
		whole, _ := allMessages(t, srv, alice, roomID, "b", "", 100)

		for _, c := range []struct {
			name string
			q    url.Values
		}{{"joined in the range", url.Values{"since": {since}}}, {"initial", nil}} {
			room := section(t, roomSync(t, srv, bob, c.q), "join", roomID)
			tl := room["timeline"].(map[string]any)
			evs := eventsOf(t, room, "timeline")
			if len(evs) != 10 || tl["limited"] != true || evs[9] != "m.room.member|@bob:test.local|join" {
				t.Fatalf("%s: timeline %q limited %v", c.name, evs, tl["limited"])
			}
			if !slices.Contains(eventsOf(t, room, "state"), "m.room.create|") {
				t.Fatalf("%s: state %q", c.name, eventsOf(t, room, "state"))
			}
			back, _ := allMessages(t, srv, bob, roomID, "b", tl["prev_batch"].(string), 4)
			expectEvents(t, c.name+": back from prev_batch", back, whole[10:]...)
		}
	})
}
