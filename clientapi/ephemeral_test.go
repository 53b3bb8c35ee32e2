package clientapi_test

import (
	"net/http"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/testutil"
)

// ephClock is a clock the test moves.
type ephClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *ephClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *ephClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// ephemeralOf returns a joined room's ephemeral events of a type in a
// /sync answer (nil when the room or the type is not there).
func ephemeralOf(sync map[string]any, roomID, typ string) []map[string]any {
	join, _ := sync["rooms"].(map[string]any)["join"].(map[string]any)
	room, _ := join[roomID].(map[string]any)
	eph, _ := room["ephemeral"].(map[string]any)
	evs, _ := eph["events"].([]any)
	var out []map[string]any
	for _, e := range evs {
		if ev, _ := e.(map[string]any); ev["type"] == typ {
			out = append(out, ev)
		}
	}
	return out
}

// typingIn returns who /sync says is typing in a room; ok false when the
// answer has no m.typing for it.
func typingIn(t *testing.T, sync map[string]any, roomID string) (users []string, ok bool) {
	t.Helper()
	evs := ephemeralOf(sync, roomID, "m.typing")
	if len(evs) == 0 {
		return nil, false
	}
	if len(evs) > 1 {
		t.Fatalf("%d m.typing events in one room: %v", len(evs), evs)
	}
	ids, isList := evs[0]["content"].(map[string]any)["user_ids"].([]any)
	if !isList {
		t.Fatalf("m.typing without a user_ids list: %v", evs[0])
	}
	users = []string{}
	for _, id := range ids {
		users = append(users, id.(string))
	}
	return users, true
}

// syncSince is an incremental /sync that answers at once.
func syncSince(t *testing.T, srv *testutil.Server, u *testutil.User, since string) map[string]any {
	t.Helper()
	return srv.Must(t, "GET", v3+"/sync?timeout=0&since="+url.QueryEscape(since), u.Token, nil)
}

// twoInRoom makes alice's room with bob joined, and carol outside it.
func twoInRoom(t *testing.T, srv *testutil.Server) (alice, bob, carol *testutil.User, roomID string) {
	alice, bob, carol = srv.Register(t, "alice", ""), srv.Register(t, "bob", ""), srv.Register(t, "carol", "")
	roomID = createRoom(t, srv, alice, map[string]any{"preset": "public_chat"})
	srv.Must(t, "POST", roomPath(roomID, "/join"), bob.Token, map[string]any{})
	return
}

func typingPath(roomID, userID string) string {
	return roomPath(roomID, "/typing/"+url.PathEscape(userID))
}

func TestTypingInSync(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		clock := &ephClock{t: time.Now()}
		srv := testutil.NewServer(t, db, testutil.ServerOptions{Now: clock.Now})
		alice, bob, carol, roomID := twoInRoom(t, srv)
		since := syncToken(t, srv, bob)

		// Bad requests are refused and change nothing.
		expectError(t, srv, "PUT", typingPath(roomID, bob.UserID), alice.Token, map[string]any{"typing": true}, http.StatusBadRequest, "M_FORBIDDEN")
		expectError(t, srv, "PUT", typingPath(roomID, carol.UserID), carol.Token, map[string]any{"typing": true}, http.StatusForbidden, "M_FORBIDDEN")
		expectError(t, srv, "PUT", typingPath(roomID, alice.UserID), alice.Token, map[string]any{}, http.StatusBadRequest, "M_MISSING_PARAM")
		expectError(t, srv, "PUT", typingPath(roomID, alice.UserID), alice.Token, map[string]any{"typing": "yes"}, http.StatusBadRequest, "M_INVALID_PARAM")
		expectError(t, srv, "PUT", typingPath(roomID, alice.UserID), alice.Token, map[string]any{"typing": true, "timeout": -1}, http.StatusBadRequest, "M_INVALID_PARAM")
		expectError(t, srv, "PUT", typingPath(roomID, alice.UserID), alice.Token, map[string]any{"typing": true, "timeout": "soon"}, http.StatusBadRequest, "M_INVALID_PARAM")
		expectError(t, srv, "PUT", typingPath("not-a-room", alice.UserID), alice.Token, map[string]any{"typing": true}, http.StatusBadRequest, "M_INVALID_PARAM")
		expectError(t, srv, "PUT", typingPath(roomID, "@alice:elsewhere.example"), alice.Token, map[string]any{"typing": true}, http.StatusBadRequest, "M_INVALID_PARAM")
		if r := srv.Do(t, "PUT", typingPath(roomID, alice.UserID), alice.Token, "typing"); r.Status != http.StatusBadRequest {
			t.Fatalf("a body that is not an object: %d %s", r.Status, r.Raw)
		}
		if users, ok := typingIn(t, syncSince(t, srv, bob, since), roomID); ok {
			t.Fatalf("refused requests changed typing: %v", users)
		}

		// A waiting /sync of bob's wakes for alice's typing.
		done := make(chan map[string]any, 1)
		go func() {
			r := srv.Do(t, "GET", v3+"/sync?timeout=20000&since="+url.QueryEscape(since), bob.Token, nil)
			done <- r.Body
		}()
		testutil.Eventually(t, "bob's /sync to wait", func() bool { return srv.Parts.Sync.WaitingSyncs() == 1 })
		start := time.Now()
		srv.Must(t, "PUT", typingPath(roomID, alice.UserID), alice.Token, map[string]any{"typing": true, "timeout": 10000})
		woken := <-done
		if time.Since(start) > 10*time.Second {
			t.Fatal("the waiting /sync was not woken by the typing")
		}
		if users, _ := typingIn(t, woken, roomID); !slices.Equal(users, []string{alice.UserID}) {
			t.Fatalf("woken /sync: typing %v, want alice (%v)", users, woken["rooms"])
		}
		next := woken["next_batch"].(string)
		// Typing again changes nothing anyone sees; bob types too.
		srv.Must(t, "PUT", typingPath(roomID, alice.UserID), alice.Token, map[string]any{"typing": true, "timeout": 10000})
		if users, ok := typingIn(t, syncSince(t, srv, bob, next), roomID); ok {
			t.Fatalf("typing again showed a change: %v", users)
		}
		srv.Must(t, "PUT", typingPath(roomID, bob.UserID), bob.Token, map[string]any{"typing": true})
		if users, _ := typingIn(t, syncSince(t, srv, alice, next), roomID); !slices.Equal(users, sorted(alice.UserID, bob.UserID)) {
			t.Fatalf("typing %v, want alice and bob", users)
		}
		// An initial sync shows who is typing; carol's shows nothing of a
		// room she is not in.
		if users, _ := typingIn(t, roomSync(t, srv, alice, nil), roomID); !slices.Equal(users, sorted(alice.UserID, bob.UserID)) {
			t.Fatalf("initial sync: typing %v", users)
		}
		if _, ok := typingIn(t, roomSync(t, srv, carol, nil), roomID); ok {
			t.Fatal("carol sees typing in a room she is not in")
		}

		// Alice stops; after it ends, bob's typing (the default 30 s) ends.
		next = syncToken(t, srv, bob)
		srv.Must(t, "PUT", typingPath(roomID, alice.UserID), alice.Token, map[string]any{"typing": false})
		if users, _ := typingIn(t, syncSince(t, srv, bob, next), roomID); !slices.Equal(users, []string{bob.UserID}) {
			t.Fatalf("after alice stopped: typing %v, want bob", users)
		}
		clock.Add(29 * time.Second)
		if users, _ := typingIn(t, roomSync(t, srv, alice, nil), roomID); !slices.Equal(users, []string{bob.UserID}) {
			t.Fatalf("bob's typing ended before its default 30 s: %v", users)
		}
		clock.Add(2 * time.Second)
		if users, _ := typingIn(t, roomSync(t, srv, alice, nil), roomID); len(users) != 0 {
			t.Fatalf("bob's typing did not end after 30 s: %v", users)
		}

		// A timeout beyond two minutes is cut to two minutes.
		srv.Must(t, "PUT", typingPath(roomID, alice.UserID), alice.Token, map[string]any{"typing": true, "timeout": 3600000})
		clock.Add(119 * time.Second)
		if users, _ := typingIn(t, roomSync(t, srv, bob, nil), roomID); !slices.Equal(users, []string{alice.UserID}) {
			t.Fatalf("typing ended before its timeout: %v", users)
		}
		clock.Add(2 * time.Second)
		if users, _ := typingIn(t, roomSync(t, srv, bob, nil), roomID); len(users) != 0 {
			t.Fatalf("an hour's typing was not capped at two minutes: %v", users)
		}
	})
}

// receiptsIn returns a room's m.receipt content in a /sync answer (nil
// when it has none).
func receiptsIn(t *testing.T, sync map[string]any, roomID string) map[string]any {
	t.Helper()
	evs := ephemeralOf(sync, roomID, "m.receipt")
	if len(evs) == 0 {
		return nil
	}
	if len(evs) > 1 {
		t.Fatalf("%d m.receipt events in one room", len(evs))
	}
	return evs[0]["content"].(map[string]any)
}

// receiptOf returns the data of a user's receipt of a type for an event
// in a room's m.receipt content (nil when there is none).
func receiptOf(content map[string]any, eventID, typ, userID string) map[string]any {
	byType, _ := content[eventID].(map[string]any)
	users, _ := byType[typ].(map[string]any)
	data, _ := users[userID].(map[string]any)
	return data
}

func receiptPath(roomID, typ, eventID string) string {
	return roomPath(roomID, "/receipt/"+typ+"/"+url.PathEscape(eventID))
}

func unreadCount(t *testing.T, sync map[string]any, roomID string) float64 {
	t.Helper()
	room := section(t, sync, "join", roomID)
	counts, ok := room["unread_notifications"].(map[string]any)
	if !ok {
		t.Fatalf("no unread_notifications in %v", room)
	}
	return counts["notification_count"].(float64)
}

func TestReceiptsInSync(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice, bob, carol, roomID := twoInRoom(t, srv)
		m1 := sendMessage(t, srv, alice, roomID, "1", "one")
		m2 := sendMessage(t, srv, alice, roomID, "2", "two")
		if n := unreadCount(t, roomSync(t, srv, bob, nil), roomID); n != 2 {
			t.Fatalf("bob's unread count %v, want 2", n)
		}
		since := syncToken(t, srv, alice)
		bobSince := syncToken(t, srv, bob)

		// Bad requests are refused and change nothing.
		expectError(t, srv, "POST", receiptPath(roomID, "m.unknown", m2), bob.Token, map[string]any{}, http.StatusBadRequest, "M_INVALID_PARAM")
		expectError(t, srv, "POST", receiptPath(roomID, "m.read", "not-an-event"), bob.Token, map[string]any{}, http.StatusBadRequest, "M_INVALID_PARAM")
		expectError(t, srv, "POST", receiptPath(roomID, "m.read", "$unknown"), bob.Token, map[string]any{}, http.StatusNotFound, "M_NOT_FOUND")
		expectError(t, srv, "POST", receiptPath(roomID, "m.read", m2), carol.Token, map[string]any{}, http.StatusForbidden, "M_FORBIDDEN")
		expectError(t, srv, "POST", receiptPath(roomID, "m.read", m2), bob.Token, map[string]any{"thread_id": ""}, http.StatusBadRequest, "M_INVALID_PARAM")
		expectError(t, srv, "POST", receiptPath(roomID, "m.read", m2), bob.Token, map[string]any{"thread_id": 5}, http.StatusBadRequest, "M_INVALID_PARAM")
		expectError(t, srv, "POST", receiptPath(roomID, "m.read", m2), bob.Token, map[string]any{"thread_id": "thread"}, http.StatusBadRequest, "M_INVALID_PARAM")
		expectError(t, srv, "POST", receiptPath(roomID, "m.fully_read", m2), bob.Token, map[string]any{"thread_id": "main"}, http.StatusBadRequest, "M_INVALID_PARAM")
		other := createRoom(t, srv, bob, map[string]any{})
		otherEvent := sendMessage(t, srv, bob, other, "o", "elsewhere")
		expectError(t, srv, "POST", receiptPath(roomID, "m.read", otherEvent), bob.Token, map[string]any{}, http.StatusNotFound, "M_NOT_FOUND")
		if c := receiptsIn(t, syncSince(t, srv, alice, since), roomID); c != nil {
			t.Fatalf("refused receipts were stored: %v", c)
		}

		// A waiting /sync of alice's wakes for bob's receipt (sent without
		// a body, as older clients do).
		done := make(chan map[string]any, 1)
		go func() {
			done <- srv.Do(t, "GET", v3+"/sync?timeout=20000&since="+url.QueryEscape(since), alice.Token, nil).Body
		}()
		testutil.Eventually(t, "alice's /sync to wait", func() bool { return srv.Parts.Sync.WaitingSyncs() == 1 })
		if r := srv.Do(t, "POST", receiptPath(roomID, "m.read", m2), bob.Token, nil); r.Status != http.StatusOK {
			t.Fatalf("receipt: %d %s", r.Status, r.Raw)
		}
		woken := <-done
		content := receiptsIn(t, woken, roomID)
		if d := receiptOf(content, m2, "m.read", bob.UserID); d == nil || d["ts"] == nil {
			t.Fatalf("alice's /sync: receipts %v, want bob's m.read of %s with ts", content, m2)
		}
		// Bob's receipt reset his unread count.
		bobSync := syncSince(t, srv, bob, bobSince)
		if n := unreadCount(t, bobSync, roomID); n != 0 {
			t.Fatalf("bob's unread count after his receipt: %v", n)
		}

		// A receipt for an earlier event changes nothing.
		next := woken["next_batch"].(string)
		srv.Must(t, "POST", receiptPath(roomID, "m.read", m1), bob.Token, map[string]any{})
		if c := receiptsIn(t, syncSince(t, srv, alice, next), roomID); c != nil {
			t.Fatalf("a receipt going back was shown: %v", c)
		}

		// A private receipt is the owner's alone.
		m3 := sendMessage(t, srv, alice, roomID, "3", "three")
		next, bobNext := syncToken(t, srv, alice), syncToken(t, srv, bob)
		srv.Must(t, "POST", receiptPath(roomID, "m.read.private", m3), bob.Token, map[string]any{})
		if c := receiptsIn(t, syncSince(t, srv, alice, next), roomID); c != nil {
			t.Fatalf("alice sees bob's private receipt: %v", c)
		}
		if d := receiptOf(receiptsIn(t, syncSince(t, srv, bob, bobNext), roomID), m3, "m.read.private", bob.UserID); d == nil {
			t.Fatal("bob does not see his private receipt")
		}
		if n := unreadCount(t, roomSync(t, srv, bob, nil), roomID); n != 0 {
			t.Fatalf("a private receipt did not reset the unread count: %v", n)
		}

		// Threaded receipts: for the main timeline, and for a thread.
		root := sendMessage(t, srv, alice, roomID, "4", "root")
		reply := srv.Must(t, "PUT", roomPath(roomID, "/send/m.room.message/5"), alice.Token, map[string]any{"msgtype": "m.text", "body": "reply",
			"m.relates_to": map[string]any{"rel_type": "m.thread", "event_id": root}})["event_id"].(string)
		expectError(t, srv, "POST", receiptPath(roomID, "m.read", reply), bob.Token, map[string]any{"thread_id": "main"}, http.StatusBadRequest, "M_INVALID_PARAM")
		expectError(t, srv, "POST", receiptPath(roomID, "m.read", m3), bob.Token, map[string]any{"thread_id": root}, http.StatusBadRequest, "M_INVALID_PARAM")
		srv.Must(t, "POST", receiptPath(roomID, "m.read", reply), bob.Token, map[string]any{"thread_id": root})
		srv.Must(t, "POST", receiptPath(roomID, "m.read", root), bob.Token, map[string]any{"thread_id": "main"})

		// An initial /sync has the room's receipts, private ones only the
		// owner's.
		content = receiptsIn(t, roomSync(t, srv, alice, nil), roomID)
		if d := receiptOf(content, reply, "m.read", bob.UserID); d == nil || d["thread_id"] != root {
			t.Fatalf("initial sync: no threaded receipt of bob's for %s in %v", reply, content)
		}
		if d := receiptOf(content, root, "m.read", bob.UserID); d == nil || d["thread_id"] != "main" {
			t.Fatalf("initial sync: no main-timeline receipt of bob's for %s in %v", root, content)
		}
		if d := receiptOf(content, m2, "m.read", bob.UserID); d == nil || d["thread_id"] != nil {
			t.Fatalf("initial sync: no unthreaded receipt of bob's for %s in %v", m2, content)
		}
		if d := receiptOf(content, m3, "m.read.private", bob.UserID); d != nil {
			t.Fatalf("initial sync: alice sees bob's private receipt: %v", content)
		}
		if receiptsIn(t, roomSync(t, srv, carol, nil), roomID) != nil {
			t.Fatal("carol sees the receipts of a room she is not in")
		}
		if receiptsIn(t, roomSync(t, srv, alice, url.Values{"filter": {`{"room":{"not_rooms":["` + roomID + `"]}}`}}), roomID) != nil {
			t.Fatal("receipts of a room the filter leaves out")
		}
	})
}

func TestReadMarkers(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice, bob, carol, roomID := twoInRoom(t, srv)
		m1 := sendMessage(t, srv, alice, roomID, "1", "one")
		m2 := sendMessage(t, srv, alice, roomID, "2", "two")
		markers := roomPath(roomID, "/read_markers")
		fullyRead := v3 + "/user/" + url.PathEscape(bob.UserID) + "/rooms/" + url.PathEscape(roomID) + "/account_data/m.fully_read"

		expectError(t, srv, "POST", markers, bob.Token, map[string]any{"m.fully_read": 3}, http.StatusBadRequest, "M_INVALID_PARAM")
		expectError(t, srv, "POST", markers, bob.Token, map[string]any{"m.fully_read": m2, "m.read": "$unknown"}, http.StatusNotFound, "M_NOT_FOUND")
		expectError(t, srv, "POST", markers, carol.Token, map[string]any{"m.fully_read": m2}, http.StatusForbidden, "M_FORBIDDEN")
		expectError(t, srv, "GET", fullyRead, bob.Token, nil, http.StatusNotFound, "M_NOT_FOUND")
		// The marker cannot be set as account data.
		if r := srv.Do(t, "PUT", fullyRead, bob.Token, map[string]any{"event_id": m1}); r.Status < 400 {
			t.Fatalf("m.fully_read set through account data: %d", r.Status)
		}

		since := syncToken(t, srv, alice)
		srv.Must(t, "POST", markers, bob.Token, map[string]any{"m.fully_read": m2, "m.read": m2, "m.other": "ignored"})
		if got := srv.Must(t, "GET", fullyRead, bob.Token, nil)["event_id"]; got != m2 {
			t.Fatalf("m.fully_read is %v, want %s", got, m2)
		}
		if d := receiptOf(receiptsIn(t, syncSince(t, srv, alice, since), roomID), m2, "m.read", bob.UserID); d == nil {
			t.Fatal("read_markers' m.read was not a receipt alice sees")
		}
		// The marker goes only forward, also through the receipt endpoint.
		srv.Must(t, "POST", receiptPath(roomID, "m.fully_read", m1), bob.Token, map[string]any{})
		if got := srv.Must(t, "GET", fullyRead, bob.Token, nil)["event_id"]; got != m2 {
			t.Fatalf("m.fully_read moved back to %v", got)
		}
		m3 := sendMessage(t, srv, alice, roomID, "3", "three")
		srv.Must(t, "POST", receiptPath(roomID, "m.fully_read", m3), bob.Token, map[string]any{})
		if got := srv.Must(t, "GET", fullyRead, bob.Token, nil)["event_id"]; got != m3 {
			t.Fatalf("m.fully_read is %v, want %s", got, m3)
		}
		// It comes to bob's /sync as the room's account data.
		room := section(t, roomSync(t, srv, bob, nil), "join", roomID)
		if !slices.Contains(eventsOf(t, room, "account_data"), "m.fully_read") {
			t.Fatalf("no m.fully_read in the room's account data: %v", room["account_data"])
		}
	})
}
