package clientapi_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

const v3 = "/_matrix/client/v3"

func roomPath(roomID, rest string) string { return v3 + "/rooms/" + url.PathEscape(roomID) + rest }

func createRoom(t *testing.T, srv *testutil.Server, u *testutil.User, body map[string]any) string {
	t.Helper()
	return srv.Must(t, "POST", v3+"/createRoom", u.Token, body)["room_id"].(string)
}

// expectError sends a request and checks its error status and code.
func expectError(t *testing.T, srv *testutil.Server, method, path, token string, body any, status int, errcode string) {
	t.Helper()
	r := srv.Do(t, method, path, token, body)
	if r.Status != status || r.Errcode() != errcode {
		t.Fatalf("%s %s: %d %s, want %d %s", method, path, r.Status, r.Raw, status, errcode)
	}
}

// roomState returns a room's current state as the client API shows it.
func roomState(t *testing.T, srv *testutil.Server, u *testutil.User, roomID string) []map[string]any {
	t.Helper()
	var evs []map[string]any
	getJSON(t, srv, roomPath(roomID, "/state"), u.Token, &evs)
	return evs
}

// getJSON gets an answer that is not an object (srv.Do reads objects).
func getJSON(t *testing.T, srv *testutil.Server, path, token string, v any) {
	t.Helper()
	req, _ := http.NewRequest("GET", srv.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, raw)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatal(err)
	}
}

func stateTypes(evs []map[string]any) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev["type"].(string)+"|"+ev["state_key"].(string))
	}
	return out
}

func membershipOf(t *testing.T, srv *testutil.Server, u *testutil.User, roomID, userID string) string {
	t.Helper()
	r := srv.Do(t, "GET", roomPath(roomID, "/state/m.room.member/"+url.PathEscape(userID)), u.Token, nil)
	if r.Status == http.StatusNotFound {
		return ""
	}
	if r.Status != http.StatusOK {
		t.Fatalf("member state: %d %s", r.Status, r.Raw)
	}
	return r.Body["membership"].(string)
}

func TestCreateRoomEveryVersion(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")

		caps := srv.Must(t, "GET", v3+"/capabilities", alice.Token, nil)["capabilities"].(map[string]any)["m.room_versions"].(map[string]any)
		if caps["default"] != "11" {
			t.Fatalf("default room version %v", caps["default"])
		}
		available := caps["available"].(map[string]any)
		for v := 1; v <= 12; v++ {
			if available[strconv.Itoa(v)] != "stable" {
				t.Fatalf("version %d not available: %v", v, available)
			}
		}

		for v := 1; v <= 12; v++ {
			version := strconv.Itoa(v)
			roomID := createRoom(t, srv, alice, map[string]any{"room_version": version, "preset": "public_chat"})
			create := srv.Must(t, "GET", roomPath(roomID, "/state/m.room.create/"), alice.Token, nil)
			if create["room_version"] != version {
				t.Fatalf("v%s: create content %v", version, create)
			}
			if _, hasCreator := create["creator"]; hasCreator != (v < 11) {
				t.Fatalf("v%s: creator in create content: %v", version, create)
			}
			// Joinable and writable in every version.
			srv.Must(t, "POST", roomPath(roomID, "/join"), bob.Token, map[string]any{})
			id := srv.Must(t, "PUT", roomPath(roomID, "/send/m.room.message/t1"), bob.Token, map[string]any{"body": "hi"})["event_id"].(string)
			ev := srv.Must(t, "GET", roomPath(roomID, "/event/"+url.PathEscape(id)), alice.Token, nil)
			if ev["sender"] != bob.UserID || ev["content"].(map[string]any)["body"] != "hi" {
				t.Fatalf("v%s: event %v", version, ev)
			}
			if v <= 2 && !strings.HasSuffix(id, ":test.local") || v > 2 && strings.Contains(id, ":") {
				t.Fatalf("v%s: event ID %s has the wrong format", version, id)
			}
			// The stored events are read back with their version's rules
			// and pass gomatrixserverlib's checks of their own signatures.
			stored, err := srv.Store.RoomEvent(context.Background(), id)
			if err != nil || stored.RoomVersion != version {
				t.Fatalf("v%s: stored %+v %v", version, stored, err)
			}
			impl := gomatrixserverlib.MustGetRoomVersion(gomatrixserverlib.RoomVersion(version))
			pdu, err := impl.NewEventFromUntrustedJSON(stored.JSON)
			if err != nil || pdu.EventID() != id {
				t.Fatalf("v%s: the stored event does not read back as untrusted JSON: %v", version, err)
			}
		}

		for _, bad := range []string{"13", "0", "org.matrix.msc4014", "banana"} {
			expectError(t, srv, "POST", v3+"/createRoom", alice.Token, map[string]any{"room_version": bad}, 400, "M_UNSUPPORTED_ROOM_VERSION")
		}
		expectError(t, srv, "POST", v3+"/createRoom", alice.Token, `{"preset": 1}`, 400, "M_BAD_JSON")
		expectError(t, srv, "POST", v3+"/createRoom", alice.Token, map[string]any{"preset": "nonsense"}, 400, "M_BAD_JSON")
		expectError(t, srv, "POST", v3+"/createRoom", alice.Token, map[string]any{"invite": []string{"not-a-user"}}, 400, "M_BAD_JSON")
		if rooms := strs(t, srv.Must(t, "GET", v3+"/joined_rooms", alice.Token, nil)["joined_rooms"]); len(rooms) != 12 {
			t.Fatalf("the refused creations left rooms: %v", rooms)
		}
	})
}

func TestCreateRoomInitialEvents(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		roomID := createRoom(t, srv, alice, map[string]any{
			"preset":          "private_chat",
			"room_alias_name": "lobby",
			"name":            "The lobby",
			"topic":           "Talk",
			"invite":          []string{bob.UserID},
			"is_direct":       true,
			"initial_state": []any{
				map[string]any{"type": "m.room.encryption", "content": map[string]any{"algorithm": "m.megolm.v1.aes-sha2"}},
				map[string]any{"type": "m.room.name", "content": map[string]any{"name": "overridden by name"}},
			},
			"power_level_content_override": map[string]any{"events_default": 10},
			"creation_content":             map[string]any{"m.federate": false},
		})
		want := []string{
			"m.room.create|", "m.room.member|" + alice.UserID, "m.room.power_levels|", "m.room.canonical_alias|",
			"m.room.join_rules|", "m.room.history_visibility|", "m.room.guest_access|", "m.room.encryption|",
			"m.room.name|", "m.room.topic|", "m.room.member|" + bob.UserID,
		}
		if got := stateTypes(roomState(t, srv, alice, roomID)); !slices.Equal(got, want) {
			t.Fatalf("initial state in order:\n got %v\nwant %v", got, want)
		}
		// Each event's prev_events is the one before it, and depth counts up.
		stored, err := srv.Store.RoomCurrentState(context.Background(), roomID)
		if err != nil {
			t.Fatal(err)
		}
		for i, ev := range stored {
			var pdu struct {
				PrevEvents []string `json:"prev_events"`
				Depth      int64    `json:"depth"`
			}
			if err := json.Unmarshal(ev.JSON, &pdu); err != nil {
				t.Fatal(err)
			}
			if pdu.Depth != int64(i+1) || (i == 0 && len(pdu.PrevEvents) != 0) || (i > 0 && !slices.Equal(pdu.PrevEvents, []string{stored[i-1].EventID})) {
				t.Fatalf("event %d (%s): depth %d prev %v", i, ev.Type, pdu.Depth, pdu.PrevEvents)
			}
		}
		check := func(path string, key string, want any) {
			t.Helper()
			got := srv.Must(t, "GET", roomPath(roomID, path), alice.Token, nil)
			if testutil.Canonical(t, got[key]) != testutil.Canonical(t, want) {
				t.Fatalf("%s: %v, want %s=%v", path, got, key, want)
			}
		}
		check("/state/m.room.name/", "name", "The lobby")
		check("/state/m.room.topic", "topic", "Talk")
		check("/state/m.room.join_rules/", "join_rule", "invite")
		check("/state/m.room.history_visibility/", "history_visibility", "shared")
		check("/state/m.room.guest_access/", "guest_access", "can_join")
		check("/state/m.room.canonical_alias/", "alias", "#lobby:test.local")
		check("/state/m.room.power_levels/", "events_default", 10)
		check("/state/m.room.power_levels/", "users", map[string]any{alice.UserID: 100})
		check("/state/m.room.create/", "m.federate", false)
		check("/state/m.room.member/"+url.PathEscape(bob.UserID), "is_direct", true)
		check("/state/m.room.encryption/", "algorithm", "m.megolm.v1.aes-sha2")
		alias := srv.Must(t, "GET", v3+"/directory/room/"+url.PathEscape("#lobby:test.local"), alice.Token, nil)
		if alias["room_id"] != roomID {
			t.Fatalf("alias: %v", alias)
		}
		// The alias is taken now.
		expectError(t, srv, "POST", v3+"/createRoom", alice.Token, map[string]any{"room_alias_name": "lobby"}, 400, "M_ROOM_IN_USE")

		// public_chat and trusted_private_chat; visibility picks the preset.
		pub := createRoom(t, srv, alice, map[string]any{"visibility": "public"})
		check2 := func(roomID, path, key string, want any) {
			t.Helper()
			if got := srv.Must(t, "GET", roomPath(roomID, path), alice.Token, nil); got[key] != want {
				t.Fatalf("%s: %v, want %s=%v", path, got, key, want)
			}
		}
		check2(pub, "/state/m.room.join_rules/", "join_rule", "public")
		check2(pub, "/state/m.room.guest_access/", "guest_access", "forbidden")
		trusted := createRoom(t, srv, alice, map[string]any{"preset": "trusted_private_chat", "invite": []string{bob.UserID}})
		users := srv.Must(t, "GET", roomPath(trusted, "/state/m.room.power_levels/"), alice.Token, nil)["users"].(map[string]any)
		if users[bob.UserID] != float64(100) {
			t.Fatalf("trusted_private_chat: invitee's level %v", users)
		}
		// An initial state the auth rules refuse creates nothing.
		expectError(t, srv, "POST", v3+"/createRoom", alice.Token, map[string]any{
			"power_level_content_override": map[string]any{"users": map[string]any{alice.UserID: 0}},
			"initial_state":                []any{map[string]any{"type": "m.room.encryption", "content": map[string]any{}}},
		}, 400, "M_INVALID_ROOM_STATE")
		if rooms := strs(t, srv.Must(t, "GET", v3+"/joined_rooms", alice.Token, nil)["joined_rooms"]); len(rooms) != 3 {
			t.Fatalf("joined rooms: %v", rooms)
		}
	})
}

func TestRoomSendAndState(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "public_chat"})
		srv.Must(t, "POST", v3+"/join/"+url.PathEscape(roomID), bob.Token, nil)

		// Idempotent per device and transaction ID.
		send := func(u *testutil.User, txn string, body any) string {
			t.Helper()
			return srv.Must(t, "PUT", roomPath(roomID, "/send/m.room.message/"+txn), u.Token, body)["event_id"].(string)
		}
		first := send(alice, "txn1", map[string]any{"body": "one"})
		if again := send(alice, "txn1", map[string]any{"body": "one"}); again != first {
			t.Fatalf("a retried transaction made a new event: %s, %s", first, again)
		}
		alice2 := srv.Login(t, alice, "")
		if other := send(alice2, "txn1", map[string]any{"body": "one"}); other == first {
			t.Fatal("another device's transaction got the first device's event")
		}
		if other := send(alice, "txn2", map[string]any{"body": "one"}); other == first {
			t.Fatal("another transaction ID got the same event")
		}
		otherType := srv.Must(t, "PUT", roomPath(roomID, "/send/m.custom/txn1"), alice.Token, map[string]any{})["event_id"]
		if otherType == first {
			t.Fatal("another path got the same event")
		}

		// Bad input: nothing is stored.
		before := len(roomState(t, srv, alice, roomID))
		expectError(t, srv, "PUT", roomPath(roomID, "/send/m.room.message/bad1"), alice.Token, `[1]`, 400, "M_BAD_JSON")
		expectError(t, srv, "PUT", roomPath(roomID, "/send/m.room.message/bad2"), alice.Token, `{`, 400, "M_NOT_JSON")
		big := map[string]any{"body": strings.Repeat("x", 65536)}
		expectError(t, srv, "PUT", roomPath(roomID, "/send/m.room.message/bad3"), alice.Token, big, 413, "M_TOO_LARGE")
		// Just under the limit as content, over it as a whole event.
		near := map[string]any{"body": strings.Repeat("x", 65400)}
		expectError(t, srv, "PUT", roomPath(roomID, "/send/m.room.message/bad4"), alice.Token, near, 413, "M_TOO_LARGE")
		expectError(t, srv, "PUT", roomPath("!nowhere:test.local", "/send/m.room.message/x"), alice.Token, map[string]any{}, 404, "M_NOT_FOUND")
		expectError(t, srv, "PUT", roomPath(roomID, "/send/m.room.message/x"), carol.Token, map[string]any{}, 403, "M_FORBIDDEN")

		// State: set by the creator, refused to a user without the level.
		id := srv.Must(t, "PUT", roomPath(roomID, "/state/m.room.topic/"), alice.Token, map[string]any{"topic": "t"})["event_id"].(string)
		if c := srv.Must(t, "GET", roomPath(roomID, "/state/m.room.topic/"), bob.Token, nil); c["topic"] != "t" {
			t.Fatalf("topic %v", c)
		}
		expectError(t, srv, "PUT", roomPath(roomID, "/state/m.room.topic/"), bob.Token, map[string]any{"topic": "mine"}, 403, "M_FORBIDDEN")
		expectError(t, srv, "PUT", roomPath(roomID, "/state/m.room.power_levels/"), bob.Token,
			map[string]any{"users": map[string]any{bob.UserID: 100}}, 403, "M_FORBIDDEN")
		// A state key that is another user's ID is theirs alone.
		expectError(t, srv, "PUT", roomPath(roomID, "/state/m.custom/"+url.PathEscape(bob.UserID)), alice.Token, map[string]any{}, 403, "M_FORBIDDEN")
		srv.Must(t, "PUT", roomPath(roomID, "/state/m.custom/"+url.PathEscape(alice.UserID)), alice.Token, map[string]any{"x": 1})
		if c := srv.Must(t, "GET", roomPath(roomID, "/state/m.room.topic"), bob.Token, nil); c["topic"] != "t" {
			t.Fatalf("a refused event changed the topic: %v", c)
		}
		if after := len(roomState(t, srv, alice, roomID)); after != before+2 {
			t.Fatalf("state has %d events, want %d", after, before+2)
		}
		expectError(t, srv, "GET", roomPath(roomID, "/state/m.room.avatar/"), alice.Token, nil, 404, "M_NOT_FOUND")
		expectError(t, srv, "GET", roomPath(roomID, "/state"), carol.Token, nil, 403, "M_FORBIDDEN")
		expectError(t, srv, "GET", roomPath("!nowhere:test.local", "/state"), carol.Token, nil, 404, "M_NOT_FOUND")
		expectError(t, srv, "PUT", roomPath(roomID, "/state/m.room.create/"), alice.Token, map[string]any{}, 400, "M_BAD_JSON")

		ev := srv.Must(t, "GET", roomPath(roomID, "/event/"+url.PathEscape(id)), bob.Token, nil)
		if ev["type"] != "m.room.topic" || ev["state_key"] != "" || ev["room_id"] != roomID || ev["sender"] != alice.UserID {
			t.Fatalf("event %v", ev)
		}
		expectError(t, srv, "GET", roomPath(roomID, "/event/$nope"), bob.Token, nil, 404, "M_NOT_FOUND")
		expectError(t, srv, "GET", roomPath(roomID, "/event/"+url.PathEscape(id)), carol.Token, nil, 403, "M_FORBIDDEN")

		// Members.
		members := srv.Must(t, "GET", roomPath(roomID, "/members"), alice.Token, nil)["chunk"].([]any)
		if len(members) != 2 {
			t.Fatalf("members %v", members)
		}
		joined := srv.Must(t, "GET", roomPath(roomID, "/joined_members"), alice.Token, nil)["joined"].(map[string]any)
		if len(joined) != 2 || joined[alice.UserID] == nil || joined[bob.UserID] == nil {
			t.Fatalf("joined members %v", joined)
		}
	})
}

func TestRoomMembership(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "private_chat"})
		joinedRooms := func(u *testutil.User) []string {
			return strs(t, srv.Must(t, "GET", v3+"/joined_rooms", u.Token, nil)["joined_rooms"])
		}

		// A private room needs an invite; unknown rooms are 404.
		expectError(t, srv, "POST", roomPath(roomID, "/join"), bob.Token, nil, 403, "M_FORBIDDEN")
		expectError(t, srv, "POST", roomPath("!nowhere:test.local", "/join"), bob.Token, nil, 404, "M_NOT_FOUND")
		expectError(t, srv, "POST", v3+"/join/"+url.PathEscape("#nowhere:test.local"), bob.Token, nil, 404, "M_NOT_FOUND")
		expectError(t, srv, "POST", v3+"/join/nonsense", bob.Token, nil, 400, "M_INVALID_PARAM")
		if m := membershipOf(t, srv, alice, roomID, bob.UserID); m != "" {
			t.Fatalf("a refused join left membership %q", m)
		}
		// Only members invite.
		expectError(t, srv, "POST", roomPath(roomID, "/invite"), carol.Token, map[string]any{"user_id": bob.UserID}, 403, "M_FORBIDDEN")
		expectError(t, srv, "POST", roomPath(roomID, "/invite"), alice.Token, map[string]any{}, 400, "M_BAD_JSON")
		srv.Must(t, "POST", roomPath(roomID, "/invite"), alice.Token, map[string]any{"user_id": bob.UserID})
		srv.Must(t, "POST", roomPath(roomID, "/invite"), alice.Token, map[string]any{"user_id": bob.UserID}) // again: 200
		if m := membershipOf(t, srv, alice, roomID, bob.UserID); m != "invite" {
			t.Fatalf("bob is %q", m)
		}
		if got := srv.Must(t, "POST", v3+"/join/"+url.PathEscape(roomID), bob.Token, map[string]any{"reason": "hi"})["room_id"]; got != roomID {
			t.Fatalf("join answered %v", got)
		}
		expectUsers(t, "bob's rooms", joinedRooms(bob), []string{roomID})
		// Joined users cannot be invited.
		expectError(t, srv, "POST", roomPath(roomID, "/invite"), alice.Token, map[string]any{"user_id": bob.UserID}, 403, "M_FORBIDDEN")

		// Kick: the creator may, bob (level 0) may not.
		srv.Must(t, "POST", roomPath(roomID, "/invite"), alice.Token, map[string]any{"user_id": carol.UserID})
		srv.Must(t, "POST", roomPath(roomID, "/join"), carol.Token, nil)
		expectError(t, srv, "POST", roomPath(roomID, "/kick"), bob.Token, map[string]any{"user_id": carol.UserID}, 403, "M_FORBIDDEN")
		srv.Must(t, "POST", roomPath(roomID, "/kick"), alice.Token, map[string]any{"user_id": carol.UserID, "reason": "bye"})
		if m := membershipOf(t, srv, alice, roomID, carol.UserID); m != "leave" {
			t.Fatalf("kicked carol is %q", m)
		}
		expectError(t, srv, "POST", roomPath(roomID, "/kick"), alice.Token, map[string]any{"user_id": carol.UserID}, 403, "M_FORBIDDEN")

		// Ban and unban.
		expectError(t, srv, "POST", roomPath(roomID, "/ban"), bob.Token, map[string]any{"user_id": carol.UserID}, 403, "M_FORBIDDEN")
		srv.Must(t, "POST", roomPath(roomID, "/ban"), alice.Token, map[string]any{"user_id": carol.UserID})
		expectError(t, srv, "POST", roomPath(roomID, "/invite"), alice.Token, map[string]any{"user_id": carol.UserID}, 403, "M_FORBIDDEN")
		expectError(t, srv, "POST", roomPath(roomID, "/unban"), bob.Token, map[string]any{"user_id": carol.UserID}, 403, "M_FORBIDDEN")
		srv.Must(t, "POST", roomPath(roomID, "/unban"), alice.Token, map[string]any{"user_id": carol.UserID})
		if m := membershipOf(t, srv, alice, roomID, carol.UserID); m != "leave" {
			t.Fatalf("unbanned carol is %q", m)
		}
		expectError(t, srv, "POST", roomPath(roomID, "/unban"), alice.Token, map[string]any{"user_id": carol.UserID}, 403, "M_FORBIDDEN")

		// Leave, then forget; forgetting while joined is refused.
		expectError(t, srv, "POST", roomPath(roomID, "/forget"), bob.Token, nil, 400, "M_UNKNOWN")
		srv.Must(t, "POST", roomPath(roomID, "/leave"), bob.Token, nil)
		expectUsers(t, "bob's rooms after leaving", joinedRooms(bob), nil)
		expectError(t, srv, "POST", roomPath(roomID, "/leave"), bob.Token, nil, 403, "M_FORBIDDEN")
		// A user who left reads the state as it was when they left: their
		// leave, not later changes.
		srv.Must(t, "PUT", roomPath(roomID, "/state/m.room.topic/"), alice.Token, map[string]any{"topic": "after bob left"})
		var left []map[string]any
		getJSON(t, srv, roomPath(roomID, "/state"), bob.Token, &left)
		for _, ev := range left {
			if ev["type"] == "m.room.topic" && ev["content"].(map[string]any)["topic"] == "after bob left" {
				t.Fatal("bob reads state changed after he left")
			}
			if ev["type"] == "m.room.member" && ev["state_key"] == bob.UserID && ev["content"].(map[string]any)["membership"] != "leave" {
				t.Fatalf("bob's membership in the state when he left: %v", ev["content"])
			}
		}
		if len(left) == 0 {
			t.Fatal("bob gets no state of the room he left")
		}
		// Someone never in the room reads nothing.
		dave := srv.Register(t, "dave", "")
		expectError(t, srv, "GET", roomPath(roomID, "/state"), dave.Token, nil, 403, "M_FORBIDDEN")
		srv.Must(t, "POST", roomPath(roomID, "/forget"), bob.Token, nil)
		expectError(t, srv, "POST", roomPath("!nowhere:test.local", "/forget"), bob.Token, nil, 404, "M_NOT_FOUND")

		// Rejecting an invite is a leave. A new invite brings a forgotten
		// room back.
		srv.Must(t, "POST", roomPath(roomID, "/invite"), alice.Token, map[string]any{"user_id": bob.UserID})
		if section(t, roomSync(t, srv, bob, nil), "invite", roomID) == nil {
			t.Fatal("an invite into a forgotten room is not in /sync")
		}
		srv.Must(t, "POST", roomPath(roomID, "/leave"), bob.Token, nil)
		if m := membershipOf(t, srv, alice, roomID, bob.UserID); m != "leave" {
			t.Fatalf("bob rejected the invite but is %q", m)
		}

		// Public rooms are joined by ID or alias without an invite.
		pub := createRoom(t, srv, alice, map[string]any{"preset": "public_chat", "room_alias_name": "square"})
		if got := srv.Must(t, "POST", v3+"/join/"+url.PathEscape("#square:test.local"), carol.Token, nil)["room_id"]; got != pub {
			t.Fatalf("join by alias answered %v", got)
		}
		expectUsers(t, "carol's rooms", joinedRooms(carol), []string{pub})
		// Joining again succeeds and makes no event.
		before := len(roomState(t, srv, alice, pub))
		room, _ := srv.Store.Room(context.Background(), pub)
		srv.Must(t, "POST", roomPath(pub, "/join"), carol.Token, nil)
		if again, _ := srv.Store.Room(context.Background(), pub); again.Depth != room.Depth || len(roomState(t, srv, alice, pub)) != before {
			t.Fatalf("a second join made an event: depth %d -> %d", room.Depth, again.Depth)
		}
	})
}

func TestRoomAliases(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		roomID := createRoom(t, srv, alice, map[string]any{})
		path := v3 + "/directory/room/" + url.PathEscape("#den:test.local")
		expectError(t, srv, "GET", path, alice.Token, nil, 404, "M_NOT_FOUND")
		srv.Must(t, "PUT", path, alice.Token, map[string]any{"room_id": roomID})
		got := srv.Must(t, "GET", path, bob.Token, nil)
		if got["room_id"] != roomID || testutil.Canonical(t, got["servers"]) != `["test.local"]` {
			t.Fatalf("alias: %v", got)
		}
		expectError(t, srv, "PUT", path, bob.Token, map[string]any{"room_id": roomID}, 409, "M_UNKNOWN")
		// The room's aliases, for its members only (a private room).
		srv.Must(t, "PUT", v3+"/directory/room/"+url.PathEscape("#cave:test.local"), alice.Token, map[string]any{"room_id": roomID})
		aliases := srv.Must(t, "GET", roomPath(roomID, "/aliases"), alice.Token, nil)["aliases"]
		if testutil.Canonical(t, aliases) != `["#cave:test.local","#den:test.local"]` {
			t.Fatalf("the room's aliases: %v", aliases)
		}
		expectError(t, srv, "GET", roomPath(roomID, "/aliases"), bob.Token, nil, 403, "M_FORBIDDEN")
		expectError(t, srv, "GET", roomPath("!nowhere:test.local", "/aliases"), alice.Token, nil, 404, "M_NOT_FOUND")
		srv.Must(t, "DELETE", v3+"/directory/room/"+url.PathEscape("#cave:test.local"), alice.Token, nil)
		expectError(t, srv, "PUT", v3+"/directory/room/"+url.PathEscape("#other:test.local"), alice.Token,
			map[string]any{"room_id": "!nowhere:test.local"}, 404, "M_NOT_FOUND")
		expectError(t, srv, "PUT", v3+"/directory/room/nohash", alice.Token, map[string]any{"room_id": roomID}, 400, "M_INVALID_PARAM")
		expectError(t, srv, "PUT", v3+"/directory/room/"+url.PathEscape("#x:elsewhere.example"), alice.Token,
			map[string]any{"room_id": roomID}, 400, "M_INVALID_PARAM")
		expectError(t, srv, "DELETE", path, bob.Token, nil, 403, "M_FORBIDDEN")
		srv.Must(t, "DELETE", path, alice.Token, nil)
		expectError(t, srv, "GET", path, alice.Token, nil, 404, "M_NOT_FOUND")
		expectError(t, srv, "DELETE", path, alice.Token, nil, 404, "M_NOT_FOUND")
	})
}

// sendConcurrently sends n messages at once into a room, each through one
// of the servers in turn, and returns their event IDs.
func sendConcurrently(t *testing.T, servers []*testutil.Server, u *testutil.User, roomID string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	errs := make(chan string, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			srv := servers[i%len(servers)]
			r := srv.Do(t, "PUT", roomPath(roomID, "/send/m.room.message/c"+strconv.Itoa(i)), u.Token, map[string]any{"body": strconv.Itoa(i)})
			if r.Status != http.StatusOK {
				errs <- string(r.Raw)
				return
			}
			ids[i] = r.Body["event_id"].(string)
		}(i)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatalf("a concurrent send failed: %s", e)
	}
	return ids
}

// expectLinearRoom checks that a room's events form one chain: each
// event's prev_events is the event before it, depths count up, and the
// room's one extremity is the last.
func expectLinearRoom(t *testing.T, srv *testutil.Server, roomID string, sent []string) {
	t.Helper()
	room, err := srv.Store.Room(context.Background(), roomID)
	if err != nil {
		t.Fatal(err)
	}
	evs, _, err := srv.Store.RoomTimeline(context.Background(), roomID, 0, 1<<62, 1000)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i, ev := range evs {
		var pdu struct {
			PrevEvents []string `json:"prev_events"`
			Depth      int64    `json:"depth"`
		}
		if err := json.Unmarshal(ev.JSON, &pdu); err != nil {
			t.Fatal(err)
		}
		if pdu.Depth != int64(i+1) || (i > 0 && !slices.Equal(pdu.PrevEvents, []string{evs[i-1].EventID})) {
			t.Fatalf("event %d: depth %d, prev %v", i, pdu.Depth, pdu.PrevEvents)
		}
		seen[ev.EventID] = true
	}
	for _, id := range sent {
		if !seen[id] {
			t.Fatalf("event %s is not in the room", id)
		}
	}
	if !slices.Equal(room.Extremities, []string{evs[len(evs)-1].EventID}) || room.Depth != int64(len(evs)) {
		t.Fatalf("room %+v after %d events", room, len(evs))
	}
}

// Concurrent sends into one room each get their own event, one after
// the other in one chain.
func TestRoomConcurrentSends(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		roomID := createRoom(t, srv, alice, map[string]any{})
		ids := sendConcurrently(t, []*testutil.Server{srv}, alice, roomID, 16)
		expectLinearRoom(t, srv, roomID, ids)
	})
}

// Requests sent at once into one room, messages written while those
// before them are still being written: the retries of one transaction,
// arriving together, get its one event, and state events among the
// messages keep the room one chain.
func TestRoomConcurrentRetriesAndState(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		roomID := createRoom(t, srv, alice, map[string]any{})
		const txns, tries = 6, 4
		ids := make([][]string, txns)
		var topics []string
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range txns {
			ids[i] = make([]string, tries)
			for j := range tries {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := srv.Do(t, "PUT", roomPath(roomID, "/send/m.room.message/t"+strconv.Itoa(i)), alice.Token, map[string]any{"body": strconv.Itoa(i)})
					if r.Status != http.StatusOK {
						t.Errorf("send %d: %s", i, r.Raw)
						return
					}
					ids[i][j] = r.Body["event_id"].(string)
				}()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := srv.Do(t, "PUT", roomPath(roomID, "/state/m.room.topic/"), alice.Token, map[string]any{"topic": strconv.Itoa(i)})
				if r.Status != http.StatusOK {
					t.Errorf("topic %d: %s", i, r.Raw)
					return
				}
				mu.Lock()
				topics = append(topics, r.Body["event_id"].(string))
				mu.Unlock()
			}()
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		sent := slices.Clone(topics)
		for i, got := range ids {
			for _, id := range got {
				if id != got[0] {
					t.Fatalf("the retries of transaction %d got events %v", i, got)
				}
			}
			sent = append(sent, got[0])
		}
		expectLinearRoom(t, srv, roomID, sent)
		evs, _, err := srv.Store.RoomTimeline(context.Background(), roomID, 0, 1<<62, 1000)
		if err != nil {
			t.Fatal(err)
		}
		counts := map[string]int{}
		for _, ev := range evs {
			counts[ev.Type]++
		}
		if counts["m.room.message"] != txns || counts["m.room.topic"] != txns {
			t.Fatalf("the room holds %v, want %d messages and %d topics", counts, txns, txns)
		}
	})
}

// Two daemons sharing a PostgreSQL database write into one room at once:
// a write built on extremities the other daemon has moved is built again.
func TestRoomSendsFromTwoDaemons(t *testing.T) {
	db := testutil.Postgres(t)
	a1 := testutil.StartNode(t, db, nil)
	a2 := testutil.StartNode(t, db, func(c *config.Config) { c.ServerName = a1.ServerName })
	alice := a1.Register(t, "alice", "")
	roomID := createRoom(t, a1.Server, alice, map[string]any{})
	ids := sendConcurrently(t, []*testutil.Server{a1.Server, a2.Server}, alice, roomID, 16)
	expectLinearRoom(t, a1.Server, roomID, ids)
}

// A message sent through one daemon wakes the waiting /sync of a room
// member on another daemon sharing the PostgreSQL database (the write
// sends its stream notification before taking its position); a user not
// in the room keeps waiting.
func TestRoomMessageWakesSyncOnOtherDaemon(t *testing.T) {
	db := testutil.Postgres(t)
	a1 := testutil.StartNode(t, db, nil)
	a2 := testutil.StartNode(t, db, func(c *config.Config) { c.ServerName = a1.ServerName })
	alice := a1.Register(t, "alice", "")
	bob := a1.Register(t, "bob", "")
	carol := a1.Register(t, "carol", "")
	roomID := createRoom(t, a1.Server, alice, map[string]any{"preset": "public_chat"})
	a1.Must(t, "POST", v3+"/join/"+url.PathEscape(roomID), bob.Token, nil)
	wait := func(u *testutil.User) chan testutil.Response {
		since := a2.Must(t, "GET", v3+"/sync?timeout=0", u.Token, nil)["next_batch"].(string)
		done := make(chan testutil.Response, 1)
		go func() { done <- a2.Do(t, "GET", v3+"/sync?timeout=20000&since="+url.QueryEscape(since), u.Token, nil) }()
		return done
	}
	carolDone := wait(carol)
	testutil.Eventually(t, "carol's /sync to wait", func() bool { return a2.Parts.Sync.WaitingSyncs() == 1 })
	bobDone := wait(bob)
	testutil.Eventually(t, "bob's /sync to wait", func() bool { return a2.Parts.Sync.WaitingSyncs() == 2 })
	// a2 may not listen yet: messages go until one is heard.
	var woken testutil.Response
	for i := 0; woken.Status == 0; i++ {
		if i == 100 {
			t.Fatal("bob's /sync on a2 never woke")
		}
		a1.Must(t, "PUT", roomPath(roomID, "/send/m.room.message/m"+strconv.Itoa(i)), alice.Token, map[string]any{"body": "hi", "msgtype": "m.text"})
		select {
		case woken = <-bobDone:
		case <-time.After(200 * time.Millisecond):
		}
	}
	join, _ := woken.Body["rooms"].(map[string]any)["join"].(map[string]any)[roomID].(map[string]any)
	events, _ := join["timeline"].(map[string]any)["events"].([]any)
	if len(events) == 0 || events[len(events)-1].(map[string]any)["type"] != "m.room.message" {
		t.Fatalf("bob's woken sync: %s", woken.Raw)
	}
	select {
	case r := <-carolDone:
		t.Fatalf("carol's sync woke for a room she is not in: %s", r.Raw)
	default:
	}
	if n := a2.Parts.Sync.WaitingSyncs(); n != 1 {
		t.Fatalf("%d syncs waiting on a2, want carol's", n)
	}
}
