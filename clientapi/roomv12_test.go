package clientapi_test

import (
	"encoding/json"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

// Version 12 rooms as clients and the suites drive them: privileged
// creators (MSC4289) and room IDs that are the create event's hash
// (MSC4291).
func TestRoomVersion12Creators(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		charlie := srv.Register(t, "charlie", "")
		state := func(u *testutil.User, roomID, evType string) map[string]any {
			t.Helper()
			return srv.Must(t, "GET", roomPath(roomID, "/state/"+evType+"/"), u.Token, nil)
		}
		join := func(u *testutil.User, roomID string) {
			t.Helper()
			srv.Must(t, "POST", roomPath(roomID, "/join"), u.Token, map[string]any{})
		}

		// The creator is not in the power levels; upgrading needs 150.
		room := createRoom(t, srv, alice, map[string]any{"room_version": "12", "preset": "public_chat"})
		pl := state(alice, room, "m.room.power_levels")
		if users, _ := pl["users"].(map[string]any); len(users) != 0 {
			t.Fatalf("power levels users %v", pl["users"])
		}
		if events, _ := pl["events"].(map[string]any); events["m.room.tombstone"] != float64(150) {
			t.Fatalf("tombstone level %v", events["m.room.tombstone"])
		}
		// Listing the creator in the power levels is a bad request.
		expectError(t, srv, "PUT", roomPath(room, "/state/m.room.power_levels/"), alice.Token,
			map[string]any{"users": map[string]any{alice.UserID: 100}}, 400, "M_BAD_JSON")
		// A level beyond canonical JSON's integers cannot be set.
		join(bob, room)
		r := srv.Do(t, "PUT", roomPath(room, "/state/m.room.power_levels/"), alice.Token,
			json.RawMessage(`{"users":{"`+bob.UserID+`":9007199254740992}}`))
		if r.Status != 400 {
			t.Fatalf("a level of 2^53: %d %s", r.Status, r.Raw)
		}
		// The creator kicks an admin at the highest level there is; the
		// admin cannot kick the creator.
		srv.Must(t, "PUT", roomPath(room, "/state/m.room.power_levels/"), alice.Token,
			map[string]any{"users": map[string]any{bob.UserID: 9007199254740991}})
		expectError(t, srv, "POST", roomPath(room, "/kick"), bob.Token, map[string]any{"user_id": alice.UserID}, 403, "M_FORBIDDEN")
		srv.Must(t, "POST", roomPath(room, "/kick"), alice.Token, map[string]any{"user_id": bob.UserID})
		// Its creator leaves the room, empty then, and joins it again:
		// the room ID names no server, the create event names this one.
		alone := createRoom(t, srv, alice, map[string]any{"room_version": "12", "preset": "public_chat"})
		srv.Must(t, "POST", roomPath(alone, "/leave"), alice.Token, map[string]any{})
		srv.Must(t, "POST", v3+"/join/"+url.PathEscape(alone), alice.Token, map[string]any{})
		// No client sends a create event, in any version.
		for _, v := range []string{"11", "12"} {
			r := createRoom(t, srv, alice, map[string]any{"room_version": v})
			expectError(t, srv, "PUT", roomPath(r, "/state/m.room.create/"), alice.Token, map[string]any{"room_version": v, "entropy": 100}, 400, "M_BAD_JSON")
		}

		// power_level_content_override may list others, not the creator.
		over := createRoom(t, srv, alice, map[string]any{"room_version": "12", "invite": []string{bob.UserID},
			"power_level_content_override": map[string]any{"users": map[string]any{bob.UserID: 100}}})
		if users := state(alice, over, "m.room.power_levels")["users"].(map[string]any); len(users) != 1 || users[bob.UserID] != float64(100) {
			t.Fatalf("overridden users %v", users)
		}
		if r := srv.Do(t, "POST", v3+"/createRoom", alice.Token, map[string]any{"room_version": "12",
			"power_level_content_override": map[string]any{"users": map[string]any{alice.UserID: 100}}}); r.Status != 400 {
			t.Fatalf("override listing the creator: %d %s", r.Status, r.Raw)
		}

		// additional_creators: validated, and its members act as
		// creators.
		for _, bad := range []any{"not-an-array", []any{"@foo:example.com", 42}, []any{"@foo:example.com", "not-a-user-id"}, []any{"@invalid:dom$ain$.com"}} {
			if r := srv.Do(t, "POST", v3+"/createRoom", alice.Token, map[string]any{"room_version": "12", "preset": "public_chat",
				"creation_content": map[string]any{"additional_creators": bad}}); r.Status != 400 {
				t.Fatalf("additional_creators %v: %d %s", bad, r.Status, r.Raw)
			}
		}
		createRoom(t, srv, alice, map[string]any{"room_version": "12", "preset": "public_chat",
			"creation_content": map[string]any{"additional_creators": []string{"@foo:example.com", "@bar:baz.code"}}})
		shared := createRoom(t, srv, alice, map[string]any{"room_version": "12", "preset": "public_chat",
			"creation_content": map[string]any{"additional_creators": []string{bob.UserID}}})
		join(bob, shared)
		expectError(t, srv, "POST", roomPath(shared, "/kick"), alice.Token, map[string]any{"user_id": bob.UserID}, 403, "M_FORBIDDEN")
		srv.Must(t, "PUT", roomPath(shared, "/state/m.room.name/"), bob.Token, map[string]any{"name": "Bob's room name"})
		expectError(t, srv, "PUT", roomPath(shared, "/state/m.room.power_levels/"), alice.Token,
			map[string]any{"users": map[string]any{bob.UserID: 100}}, 400, "M_BAD_JSON")

		// A trusted private chat makes its invitees creators, beside
		// those asked for.
		dm := createRoom(t, srv, alice, map[string]any{"room_version": "12", "preset": "trusted_private_chat", "is_direct": true,
			"invite": []string{bob.UserID}, "creation_content": map[string]any{"additional_creators": []string{charlie.UserID}}})
		var extra []string
		for _, u := range state(alice, dm, "m.room.create")["additional_creators"].([]any) {
			extra = append(extra, u.(string))
		}
		slices.Sort(extra)
		if !slices.Equal(extra, []string{bob.UserID, charlie.UserID}) {
			t.Fatalf("additional creators %v", extra)
		}
	})
}

// The room ID of a version 12 room is its create event's hash, and every
// client API that shows the create event gives it that room ID, though
// the event has no room_id field.
func TestRoomVersion12RoomID(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		room := createRoom(t, srv, alice, map[string]any{"room_version": "12"})
		if strings.Contains(room, ":") || len(room) != 44 {
			t.Fatalf("room ID %q", room)
		}
		createID := "$" + room[1:]
		msg := srv.Must(t, "PUT", roomPath(room, "/send/m.room.message/1"), alice.Token, map[string]any{"msgtype": "m.text", "body": "Hello"})["event_id"].(string)
		find := func(list any) map[string]any {
			for _, e := range asAnyList(list) {
				if ev, _ := e.(map[string]any); ev["type"] == "m.room.create" {
					return ev
				}
			}
			return nil
		}
		var st []any
		getJSON(t, srv, roomPath(room, "/state"), alice.Token, &st)
		for name, ev := range map[string]map[string]any{
			"/state":              find(st),
			"/messages":           find(srv.Must(t, "GET", roomPath(room, "/messages?dir=b&limit=100"), alice.Token, nil)["chunk"]),
			"/event":              srv.Must(t, "GET", roomPath(room, "/event/"+url.PathEscape(createID)), alice.Token, nil),
			"/context direct":     srv.Must(t, "GET", roomPath(room, "/context/"+url.PathEscape(createID)), alice.Token, nil)["event"].(map[string]any),
			"/context before":     find(srv.Must(t, "GET", roomPath(room, "/context/"+url.PathEscape(msg)+"?limit=100"), alice.Token, nil)["events_before"]),
			"/context state":      find(srv.Must(t, "GET", roomPath(room, "/context/"+url.PathEscape(msg)+"?limit=100"), alice.Token, nil)["state"]),
			"/state?format=event": srv.Must(t, "GET", roomPath(room, "/state/m.room.create/?format=event"), alice.Token, nil),
		} {
			if ev == nil || ev["room_id"] != room || ev["event_id"] != createID {
				t.Errorf("%s: create event %v", name, ev)
			}
		}

		// Upgrades to version 12 from 10, 11 and 12: the new room's ID is
		// its create event's hash, its predecessor names the old room
		// alone.
		for _, v := range []string{"10", "11", "12"} {
			old := createRoom(t, srv, alice, map[string]any{"room_version": v, "preset": "public_chat"})
			repl := srv.Must(t, "POST", roomPath(old, "/upgrade"), alice.Token, map[string]any{"new_version": "12"})["replacement_room"].(string)
			create := srv.Must(t, "GET", roomPath(repl, "/state/m.room.create/?format=event"), alice.Token, nil)
			pred, _ := create["content"].(map[string]any)["predecessor"].(map[string]any)
			if create["event_id"] != "$"+repl[1:] || pred["room_id"] != old || pred["event_id"] != nil {
				t.Fatalf("from v%s: create event %v", v, create)
			}
		}
	})
}

// Upgrades to version 12 as the suites run them: the upgrading user and
// the additional creators become the new room's creators and leave its
// power levels; the other users keep their levels.
func TestUpgradeToRoomVersion12Creators(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		charlie := srv.Register(t, "charlie", "")
		for _, c := range []struct {
			name       string
			version    string
			levels     map[string]any
			upgrader   *testutil.User
			additional []string
			wantUsers  map[string]any
		}{
			{"non-creator admin, v11", "11", map[string]any{bob.UserID: 100}, bob, nil, map[string]any{}},
			{"non-creator admin, v11, a moderator", "11", map[string]any{bob.UserID: 100, charlie.UserID: 100}, bob, nil,
				map[string]any{charlie.UserID: float64(100)}},
			{"non-creator admin, v12, another creator", "12", map[string]any{bob.UserID: 150}, bob, []string{charlie.UserID}, map[string]any{}},
			{"non-creator admin, v12, a moderator made creator", "12", map[string]any{bob.UserID: 150, charlie.UserID: 50}, bob,
				[]string{charlie.UserID}, map[string]any{}},
			{"creator, v11, with an additional creator", "11", map[string]any{alice.UserID: 100, bob.UserID: 100}, alice,
				[]string{bob.UserID}, map[string]any{}},
			{"creator, v11, and a moderator", "11", map[string]any{alice.UserID: 100, bob.UserID: 100, charlie.UserID: 50}, alice,
				[]string{bob.UserID}, map[string]any{charlie.UserID: float64(50)}},
		} {
			room := createRoom(t, srv, alice, map[string]any{"room_version": c.version, "preset": "public_chat"})
			for _, u := range []*testutil.User{bob, charlie} {
				srv.Must(t, "POST", roomPath(room, "/join"), u.Token, map[string]any{})
			}
			srv.Must(t, "PUT", roomPath(room, "/state/m.room.power_levels/"), alice.Token, map[string]any{"users": c.levels})
			body := map[string]any{"new_version": "12"}
			if c.additional != nil {
				body["additional_creators"] = c.additional
			}
			repl := srv.Must(t, "POST", roomPath(room, "/upgrade"), c.upgrader.Token, body)["replacement_room"].(string)
			create := srv.Must(t, "GET", roomPath(repl, "/state/m.room.create/?format=event"), c.upgrader.Token, nil)
			content := create["content"].(map[string]any)
			if create["sender"] != c.upgrader.UserID || content["room_version"] != "12" {
				t.Fatalf("%s: create event %v", c.name, create)
			}
			gotExtra, hasExtra := content["additional_creators"]
			if len(c.additional) == 0 && hasExtra || len(c.additional) > 0 && len(asAnyList(gotExtra)) != len(c.additional) {
				t.Fatalf("%s: additional creators %v", c.name, gotExtra)
			}
			users := srv.Must(t, "GET", roomPath(repl, "/state/m.room.power_levels/"), c.upgrader.Token, nil)["users"].(map[string]any)
			if len(users) != len(c.wantUsers) {
				t.Fatalf("%s: users %v, want %v", c.name, users, c.wantUsers)
			}
			for u, l := range c.wantUsers {
				if users[u] != l {
					t.Fatalf("%s: users %v, want %v", c.name, users, c.wantUsers)
				}
			}
		}
	})
}

func asAnyList(v any) []any { l, _ := v.([]any); return l }
