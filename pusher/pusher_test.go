package pusher_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
)

const v3 = "/_matrix/client/v3"

// startNode starts a daemon whose push deliveries retry within
// milliseconds.
func startNode(t *testing.T, db testutil.Database) *testutil.Node {
	return testutil.StartNode(t, db, func(c *config.Config) {
		c.Push.MinBackoff = config.Duration(10 * time.Millisecond)
		c.Push.MaxBackoff = config.Duration(time.Second)
	})
}

func pusherBody(appID, pushkey, url string, extra map[string]any) map[string]any {
	b := map[string]any{
		"kind": "http", "app_id": appID, "pushkey": pushkey,
		"app_display_name": "App", "device_display_name": "Phone", "lang": "en",
		"data": map[string]any{"url": url},
	}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

// pushers lists a user's pushers as "app_id|pushkey|device_display_name".
func pushers(t *testing.T, n *testutil.Node, token string) []string {
	t.Helper()
	var out []string
	for _, p := range n.Must(t, "GET", v3+"/pushers", token, nil)["pushers"].([]any) {
		m := p.(map[string]any)
		out = append(out, m["app_id"].(string)+"|"+m["pushkey"].(string)+"|"+m["device_display_name"].(string))
	}
	return out
}

func expectList(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("%s: got %q, want %q", what, got, want)
	}
}

func expectErr(t *testing.T, r testutil.Response, status int, errcode string) {
	t.Helper()
	if r.Status != status || r.Errcode() != errcode {
		t.Fatalf("got %d %s, want %d %s", r.Status, r.Raw, status, errcode)
	}
	if msg, _ := r.Body["error"].(string); msg == "" {
		t.Fatalf("no error message: %s", r.Raw)
	}
}

// withPassword completes a user-interactive auth request with the user's
// password.
func withPassword(t *testing.T, n *testutil.Node, u *testutil.User, path string, body map[string]any) {
	t.Helper()
	r := n.Do(t, "POST", path, u.Token, body)
	if r.Status != http.StatusUnauthorized {
		t.Fatalf("%s: %d %s", path, r.Status, r.Raw)
	}
	body["auth"] = map[string]any{"type": "m.login.password", "session": r.Body["session"],
		"identifier": map[string]any{"type": "m.id.user", "user": u.UserID}, "password": u.Password}
	n.Must(t, "POST", path, u.Token, body)
}

const gw = "https://push.example.org" + "/_matrix/push/v1/notify"

func TestPushersSet(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := startNode(t, db)
		alice := n.Register(t, "alice", "")
		bob := n.Register(t, "bob", "")
		set := v3 + "/pushers/set"
		expectList(t, "no pushers", pushers(t, n, alice.Token))

		// Bad requests change nothing.
		for _, c := range []struct {
			body    any
			status  int
			errcode string
		}{
			{map[string]any{"kind": "http", "app_id": "a"}, 400, "M_MISSING_PARAM"},
			{pusherBody("a", "k", gw, map[string]any{"lang": nil}), 400, "M_MISSING_PARAM"},
			{pusherBody("a", "k", gw, map[string]any{"data": map[string]any{}}), 400, "M_MISSING_PARAM"},
			{pusherBody("a", "k", gw, map[string]any{"data": map[string]any{"format": "event_id_only"}}), 400, "M_MISSING_PARAM"},
			{pusherBody("a", "k", "https://push.example.org/notify", nil), 400, "M_INVALID_PARAM"},
			{pusherBody("a", "k", "/_matrix/push/v1/notify", nil), 400, "M_INVALID_PARAM"},
			{pusherBody("a", "k", "ftp://push.example.org/_matrix/push/v1/notify", nil), 400, "M_INVALID_PARAM"},
			{pusherBody("a", "k", gw, map[string]any{"data": map[string]any{"url": 5}}), 400, "M_INVALID_PARAM"},
			{pusherBody("a", "k", gw, map[string]any{"data": "https://x"}), 400, "M_INVALID_PARAM"},
			{pusherBody(strings.Repeat("a", 65), "k", gw, nil), 400, "M_INVALID_PARAM"},
			{pusherBody("a", strings.Repeat("k", 513), gw, nil), 400, "M_INVALID_PARAM"},
			{pusherBody("a", "", gw, nil), 400, "M_INVALID_PARAM"},
			{pusherBody("a", "k", gw, map[string]any{"kind": "email"}), 400, "M_INVALID_PARAM"},
			{pusherBody("a", "k", gw, map[string]any{"app_id": 7}), 400, "M_INVALID_PARAM"},
			{pusherBody("a", "k", gw, map[string]any{"append": "yes"}), 400, "M_INVALID_PARAM"},
			{`[1]`, 400, "M_BAD_JSON"},
			{`{"kind":`, 400, "M_NOT_JSON"},
		} {
			expectErr(t, n.Do(t, "POST", set, alice.Token, c.body), c.status, c.errcode)
		}
		expectErr(t, n.Do(t, "POST", set, "", pusherBody("a", "k", gw, nil)), 401, "M_MISSING_TOKEN")
		expectList(t, "after bad requests", pushers(t, n, alice.Token))

		// Added, with what GET shows of it.
		n.Must(t, "POST", set, alice.Token, pusherBody("com.example.app", "key1", gw,
			map[string]any{"profile_tag": "tag", "data": map[string]any{"url": gw, "format": "event_id_only"}}))
		got := n.Must(t, "GET", v3+"/pushers", alice.Token, nil)["pushers"].([]any)
		want := map[string]any{"kind": "http", "app_id": "com.example.app", "pushkey": "key1", "app_display_name": "App",
			"device_display_name": "Phone", "lang": "en", "profile_tag": "tag",
			"data": map[string]any{"url": gw, "format": "event_id_only"}}
		if len(got) != 1 || testutil.Canonical(t, got[0]) != testutil.Canonical(t, want) {
			t.Fatalf("GET /pushers: %v", got)
		}
		// Replaced by (app_id, pushkey); another pushkey is another pusher.
		n.Must(t, "POST", set, alice.Token, pusherBody("com.example.app", "key1", gw, map[string]any{"device_display_name": "Tablet"}))
		n.Must(t, "POST", set, alice.Token, pusherBody("com.example.app", "key2", gw, nil))
		expectList(t, "replaced", pushers(t, n, alice.Token), "com.example.app|key1|Tablet", "com.example.app|key2|Phone")

		// Another user taking the pushkey takes it from alice, unless
		// appending.
		n.Must(t, "POST", set, bob.Token, pusherBody("com.example.app", "key1", gw, nil))
		expectList(t, "taken", pushers(t, n, alice.Token), "com.example.app|key2|Phone")
		expectList(t, "bob's", pushers(t, n, bob.Token), "com.example.app|key1|Phone")
		n.Must(t, "POST", set, alice.Token, pusherBody("com.example.app", "key1", gw, map[string]any{"append": true}))
		expectList(t, "appended", pushers(t, n, alice.Token), "com.example.app|key1|Phone", "com.example.app|key2|Phone")
		expectList(t, "bob's kept", pushers(t, n, bob.Token), "com.example.app|key1|Phone")

		// kind null deletes; deleting what is not there is fine.
		n.Must(t, "POST", set, alice.Token, map[string]any{"kind": nil, "app_id": "com.example.app", "pushkey": "key2"})
		n.Must(t, "POST", set, alice.Token, map[string]any{"kind": nil, "app_id": "com.example.app", "pushkey": "nothing"})
		expectList(t, "deleted", pushers(t, n, alice.Token), "com.example.app|key1|Phone")

		// A password change removes the pushers of the other devices
		// (logged out), keeps the caller's.
		phone := n.Login(t, alice, "PHONE")
		n.Must(t, "POST", set, phone.Token, pusherBody("com.example.app", "phonekey", gw, nil))
		expectList(t, "two devices", pushers(t, n, alice.Token), "com.example.app|key1|Phone", "com.example.app|phonekey|Phone")
		withPassword(t, n, alice, v3+"/account/password", map[string]any{"new_password": "new secret"})
		expectList(t, "after the password change", pushers(t, n, alice.Token), "com.example.app|key1|Phone")
		alice.Password = "new secret"
		// Without logging the others out, theirs stay.
		phone = n.Login(t, alice, "PHONE")
		n.Must(t, "POST", set, phone.Token, pusherBody("com.example.app", "phonekey", gw, nil))
		withPassword(t, n, alice, v3+"/account/password", map[string]any{"new_password": "newer", "logout_devices": false})
		expectList(t, "kept", pushers(t, n, alice.Token), "com.example.app|key1|Phone", "com.example.app|phonekey|Phone")

		// A deactivated user's pushers go.
		withPassword(t, n, bob, v3+"/account/deactivate", map[string]any{})
		if left, err := n.Store.Pushers(context.Background(), bob.UserID); err != nil || len(left) != 0 {
			t.Fatalf("deactivated user's pushers: %v %v", left, err)
		}
	})
}

// gateway is a push gateway on loopback recording what it receives.
type gateway struct {
	*httptest.Server
	mu       sync.Mutex
	received []map[string]any // the notifications, in order
	answer   func(n map[string]any) (int, string)
}

func newGateway(t *testing.T) *gateway {
	g := &gateway{}
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var body struct {
			Notification map[string]any `json:"notification"`
		}
		if r.Method != http.MethodPost || r.URL.Path != "/_matrix/push/v1/notify" || json.Unmarshal(raw, &body) != nil ||
			r.Header.Get("Content-Type") != "application/json" {
			t.Errorf("gateway: %s %s %s", r.Method, r.URL, raw)
			w.WriteHeader(400)
			return
		}
		g.mu.Lock()
		g.received = append(g.received, body.Notification)
		answer := g.answer
		g.mu.Unlock()
		status, reply := 200, `{"rejected":[]}`
		if answer != nil {
			status, reply = answer(body.Notification)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		io.WriteString(w, reply)
	}))
	t.Cleanup(g.Close)
	return g
}

func (g *gateway) url() string { return g.URL + "/_matrix/push/v1/notify" }

// waitFor waits until the gateway received a notification for pushkey
// about eventID, and returns it; count is how many it must have received.
func (g *gateway) waitFor(t *testing.T, pushkey, eventID string, count int) map[string]any {
	t.Helper()
	var found map[string]any
	testutil.Eventually(t, "notification of "+eventID+" for "+pushkey, func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		seen := 0
		for _, n := range g.received {
			dev := n["devices"].([]any)[0].(map[string]any)
			if n["event_id"] == eventID && dev["pushkey"] == pushkey {
				seen++
				found = n
			}
		}
		return seen >= count
	})
	return found
}

func createRoom(t *testing.T, n *testutil.Node, u *testutil.User) string {
	t.Helper()
	return n.Must(t, "POST", v3+"/createRoom", u.Token, map[string]any{"preset": "public_chat"})["room_id"].(string)
}

func send(t *testing.T, n *testutil.Node, u *testutil.User, roomID, txn, body string) string {
	t.Helper()
	return n.Must(t, "PUT", v3+"/rooms/"+url.PathEscape(roomID)+"/send/m.room.message/"+txn, u.Token,
		map[string]any{"msgtype": "m.text", "body": body})["event_id"].(string)
}

func TestPushDelivery(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := startNode(t, db)
		g := newGateway(t)
		alice := n.Register(t, "alice", "")
		bob := n.Register(t, "bob", "")
		roomID := createRoom(t, n, alice)
		n.Must(t, "POST", v3+"/join/"+url.PathEscape(roomID), bob.Token, map[string]any{})
		set := v3 + "/pushers/set"
		n.Must(t, "POST", set, alice.Token, pusherBody("com.example.app", "idonly", g.url(),
			map[string]any{"data": map[string]any{"url": g.url(), "format": "event_id_only", "extra": "kept"}}))
		n.Must(t, "POST", set, alice.Token, pusherBody("com.example.app", "full", g.url(), nil))

		// A message from bob reaches both of alice's pushers, each in its
		// format; the URL is not handed back.
		ev1 := send(t, n, bob, roomID, "1", "hello")
		idOnly := g.waitFor(t, "idonly", ev1, 1)
		want := map[string]any{"event_id": ev1, "room_id": roomID, "counts": map[string]any{"unread": 1}, "prio": "high",
			"devices": []any{map[string]any{"app_id": "com.example.app", "pushkey": "idonly",
				"pushkey_ts": idOnly["devices"].([]any)[0].(map[string]any)["pushkey_ts"],
				"data":       map[string]any{"format": "event_id_only", "extra": "kept"}, "tweaks": map[string]any{"sound": "default"}}}}
		if testutil.Canonical(t, idOnly) != testutil.Canonical(t, want) {
			t.Fatalf("event_id_only notification:\n got %s\nwant %s", testutil.Canonical(t, idOnly), testutil.Canonical(t, want))
		}
		if ts := idOnly["devices"].([]any)[0].(map[string]any)["pushkey_ts"].(float64); ts < float64(time.Now().Add(-time.Hour).Unix()) || ts > float64(time.Now().Unix()+1) {
			t.Fatalf("pushkey_ts %v is not in seconds", ts)
		}
		full := g.waitFor(t, "full", ev1, 1)
		if full["type"] != "m.room.message" || full["sender"] != bob.UserID || full["content"].(map[string]any)["body"] != "hello" ||
			full["event_id"] != ev1 || full["room_id"] != roomID || full["prio"] != "high" {
			t.Fatalf("full notification: %v", full)
		}
		if d := full["devices"].([]any)[0].(map[string]any)["data"].(map[string]any); len(d) != 0 {
			t.Fatalf("full notification's data: %v", d)
		}

		// The sender's own messages notify nobody of theirs; bob has no
		// pushers, alice's own message is not pushed to her: the next
		// notification alice gets is bob's next message.
		own := send(t, n, alice, roomID, "2", "mine")
		// A gateway failing with 500 gets the notification again.
		var failed sync.Once
		g.mu.Lock()
		g.answer = func(nt map[string]any) (int, string) {
			dev := nt["devices"].([]any)[0].(map[string]any)
			fail := false
			if dev["pushkey"] == "idonly" {
				failed.Do(func() { fail = true })
			}
			if fail {
				return 500, `{"errcode":"M_UNKNOWN","error":"down"}`
			}
			return 200, `{}`
		}
		g.mu.Unlock()
		ev3 := send(t, n, bob, roomID, "3", "again")
		g.waitFor(t, "idonly", ev3, 2)
		g.waitFor(t, "full", ev3, 1)
		g.mu.Lock()
		for _, nt := range g.received {
			if nt["event_id"] == own {
				t.Errorf("alice's own message was pushed to her: %v", nt)
			}
		}
		g.mu.Unlock()
		expectList(t, "after a failure", pushers(t, n, alice.Token), "com.example.app|full|Phone", "com.example.app|idonly|Phone")

		// A gateway naming the pushkey rejected removes the pusher; the
		// other stays.
		g.mu.Lock()
		g.answer = func(nt map[string]any) (int, string) {
			dev := nt["devices"].([]any)[0].(map[string]any)
			if dev["pushkey"] == "idonly" {
				return 200, `{"rejected":["idonly"]}`
			}
			return 200, `{"rejected":[]}`
		}
		g.mu.Unlock()
		ev4 := send(t, n, bob, roomID, "4", "once more")
		g.waitFor(t, "idonly", ev4, 1)
		testutil.Eventually(t, "the rejected pusher removed", func() bool {
			return len(pushers(t, n, alice.Token)) == 1
		})
		expectList(t, "after rejection", pushers(t, n, alice.Token), "com.example.app|full|Phone")
		// Later notifications reach only the pusher left.
		ev5 := send(t, n, bob, roomID, "5", "last")
		g.waitFor(t, "full", ev5, 1)
	})
}

// syncCounts returns a room's unread counts in a /sync answer
// (notification, highlight), and the answer's next_batch.
func syncCounts(t *testing.T, n *testutil.Node, u *testutil.User, since, roomID string) (int, int, string) {
	t.Helper()
	q := url.Values{"timeout": {"0"}}
	if since != "" {
		q.Set("since", since)
	}
	s := n.Must(t, "GET", v3+"/sync?"+q.Encode(), u.Token, nil)
	join, _ := s["rooms"].(map[string]any)["join"].(map[string]any)
	room, ok := join[roomID].(map[string]any)
	if !ok {
		t.Fatalf("room %s not in /sync: %v", roomID, s["rooms"])
	}
	un, ok := room["unread_notifications"].(map[string]any)
	if !ok {
		t.Fatalf("no unread_notifications: %v", room)
	}
	return int(un["notification_count"].(float64)), int(un["highlight_count"].(float64)), s["next_batch"].(string)
}

func TestUnreadCounts(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := startNode(t, db)
		alice := n.Register(t, "alice", "")
		bob := n.Register(t, "bob", "")
		carol := n.Register(t, "carol", "")
		roomID := createRoom(t, n, alice)
		for _, u := range []*testutil.User{bob, carol} {
			n.Must(t, "POST", v3+"/join/"+url.PathEscape(roomID), u.Token, map[string]any{})
		}
		expect := func(u *testutil.User, since string, notes, highlights int) string {
			t.Helper()
			gotN, gotH, next := syncCounts(t, n, u, since, roomID)
			if gotN != notes || gotH != highlights {
				t.Fatalf("%s: unread %d/%d, want %d/%d", u.UserID, gotN, gotH, notes, highlights)
			}
			return next
		}
		since := expect(alice, "", 0, 0)

		// Bob's messages count for alice and carol, a mention of alice
		// highlights for her alone; bob's own count nothing for him.
		send(t, n, bob, roomID, "1", "hello")
		since = expect(alice, since, 1, 0)
		send(t, n, bob, roomID, "2", "alice: look")
		since = expect(alice, since, 2, 1)
		expect(carol, "", 2, 0)
		expect(bob, "", 0, 0)
		// Messages with no notify action (a notice) do not count.
		n.Must(t, "PUT", v3+"/rooms/"+url.PathEscape(roomID)+"/send/m.room.message/3", bob.Token,
			map[string]any{"msgtype": "m.notice", "body": "beep"})
		since = expect(alice, since, 2, 1)

		// Alice's own message resets hers, not carol's.
		send(t, n, alice, roomID, "4", "read it")
		since = expect(alice, since, 0, 0)
		expect(carol, "", 3, 0)
		send(t, n, bob, roomID, "5", "and now")
		expect(alice, since, 1, 0)
		// Alice muting the room stops the counting.
		n.Must(t, "PUT", v3+"/pushrules/global/room/"+url.PathEscape(roomID), alice.Token, map[string]any{"actions": []any{}})
		muted := send(t, n, bob, roomID, "6", "muted")
		expect(alice, "", 1, 0)
		expect(carol, "", 5, 0)

		// A read receipt's position resets the counts up to it; an older
		// one changes nothing.
		svc := n.Parts.Pushers
		ctx := context.Background()
		pos := func(eventID string) storage.StreamPos {
			ev, err := n.Store.RoomEvent(ctx, eventID)
			if err != nil {
				t.Fatal(err)
			}
			return ev.Pos
		}
		later := send(t, n, bob, roomID, "7", "later")
		if err := svc.MarkRead(ctx, carol.UserID, roomID, pos(later)); err != nil {
			t.Fatal(err)
		}
		expect(carol, "", 0, 0)
		send(t, n, bob, roomID, "8", "after the receipt")
		if err := svc.MarkRead(ctx, carol.UserID, roomID, pos(muted)); err != nil {
			t.Fatal(err)
		}
		expect(carol, "", 1, 0)
	})
}

// A message from a user of another server, arriving over federation,
// notifies the local user: pushed to the gateway and counted in /sync.
func TestPushFromAnotherServer(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a, b := startNode(t, db), startNode(t, testutil.SQLite(t))
		g := newGateway(t)
		alice := a.Register(t, "alice", "")
		bob := b.Register(t, "bob", "")
		roomID := createRoom(t, a, alice)
		b.Must(t, "POST", v3+"/join/"+url.PathEscape(roomID)+"?server_name="+url.QueryEscape(a.ServerName), bob.Token, map[string]any{})
		a.Must(t, "POST", v3+"/pushers/set", alice.Token, pusherBody("com.example.app", "idonly", g.url(),
			map[string]any{"data": map[string]any{"url": g.url(), "format": "event_id_only"}}))

		ev := send(t, b, bob, roomID, "1", "hello from afar")
		nt := g.waitFor(t, "idonly", ev, 1)
		if nt["room_id"] != roomID || nt["prio"] != "high" {
			t.Fatalf("notification: %v", nt)
		}
		if notes, _, _ := syncCounts(t, a, alice, "", roomID); notes != 1 {
			t.Fatalf("alice's unread count: %d, want 1", notes)
		}
	})
}

// An invite from a user of another server notifies the invitee.
func TestPushRemoteInvite(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a, b := startNode(t, db), startNode(t, testutil.SQLite(t))
		g := newGateway(t)
		alice := a.Register(t, "alice", "")
		bob := b.Register(t, "bob", "")
		a.Must(t, "POST", v3+"/pushers/set", alice.Token, pusherBody("com.example.app", "full", g.url(), nil))
		roomID := createRoom(t, b, bob)
		b.Must(t, "POST", v3+"/rooms/"+url.PathEscape(roomID)+"/invite", bob.Token, map[string]any{"user_id": alice.UserID})
		testutil.Eventually(t, "the invite pushed", func() bool {
			g.mu.Lock()
			defer g.mu.Unlock()
			for _, n := range g.received {
				if n["type"] == "m.room.member" && n["membership"] == "invite" && n["user_is_target"] == true && n["room_id"] == roomID {
					return true
				}
			}
			return false
		})
	})
}

// In a room of version 12 the creator, listed in no power levels, holds
// the power to notify the whole room with @room; a member at the
// default level does not. In a version 11 room the same creator, listed
// at 100, does too, and a member at 0 does not.
func TestRoomNotificationByCreator(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := startNode(t, db)
		alice := n.Register(t, "alice", "")
		bob := n.Register(t, "bob", "")
		carol := n.Register(t, "carol", "")
		for i, version := range []string{"12", "11"} {
			roomID := n.Must(t, "POST", v3+"/createRoom", alice.Token, map[string]any{"preset": "public_chat", "room_version": version})["room_id"].(string)
			for _, u := range []*testutil.User{bob, carol} {
				n.Must(t, "POST", v3+"/join/"+url.PathEscape(roomID), u.Token, map[string]any{})
			}
			_, _, since := syncCounts(t, n, bob, "", roomID)
			send(t, n, carol, roomID, fmt.Sprintf("c%d", i), "@room from carol")
			if notes, highlights, _ := syncCounts(t, n, bob, since, roomID); notes != 1 || highlights != 0 {
				t.Fatalf("v%s: carol's @room: %d/%d, want 1/0", version, notes, highlights)
			}
			send(t, n, alice, roomID, fmt.Sprintf("a%d", i), "@room from alice")
			if notes, highlights, _ := syncCounts(t, n, bob, since, roomID); notes != 2 || highlights != 1 {
				t.Fatalf("v%s: the creator's @room: %d/%d, want 2/1", version, notes, highlights)
			}
		}
	})
}
