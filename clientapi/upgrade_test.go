package clientapi_test

import (
	"net/url"
	"slices"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

// A room upgrade as clients and the suites drive it: a version 10 room
// with a name, topic, encryption, an alias in the directory, a ban and
// users' push rules becomes a version 11 room with the same, the old room
// tombstoned and closed to ordinary members.
func TestRoomUpgrade(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		mallory := srv.Register(t, "mallory", "")
		old := createRoom(t, srv, alice, map[string]any{"preset": "public_chat", "visibility": "public", "room_version": "10",
			"name": "the room", "topic": "things", "room_alias_name": "up",
			"initial_state": []any{map[string]any{"type": "m.room.encryption", "content": map[string]any{"algorithm": "m.megolm.v1.aes-sha2"}}}})
		srv.Must(t, "POST", roomPath(old, "/join"), bob.Token, map[string]any{})
		srv.Must(t, "POST", roomPath(old, "/join"), mallory.Token, map[string]any{})
		srv.Must(t, "POST", roomPath(old, "/ban"), alice.Token, map[string]any{"user_id": mallory.UserID})
		for _, u := range []*testutil.User{alice, bob} {
			srv.Must(t, "PUT", v3+"/pushrules/global/room/"+url.PathEscape(old), u.Token, map[string]any{"actions": []any{}})
		}
		alias := "#up:" + srv.ServerName

		// Who may and what.
		for _, c := range []struct {
			who    *testutil.User
			body   map[string]any
			status int
			code   string
		}{
			{bob, map[string]any{"new_version": "11"}, 403, "M_FORBIDDEN"},
			{alice, map[string]any{"new_version": "9999"}, 400, "M_UNSUPPORTED_ROOM_VERSION"},
			{alice, map[string]any{}, 400, "M_BAD_JSON"},
		} {
			if r := srv.Do(t, "POST", roomPath(old, "/upgrade"), c.who.Token, c.body); r.Status != c.status || r.Errcode() != c.code {
				t.Fatalf("%v by %s: %d %s", c.body, c.who.UserID, r.Status, r.Raw)
			}
		}
		if r := srv.Do(t, "POST", roomPath("!nowhere:"+srv.ServerName, "/upgrade"), alice.Token, map[string]any{"new_version": "11"}); r.Status != 404 {
			t.Fatalf("an unknown room: %d %s", r.Status, r.Raw)
		}

		repl := srv.Must(t, "POST", roomPath(old, "/upgrade"), alice.Token, map[string]any{"new_version": "11"})["replacement_room"].(string)
		if repl == "" || repl == old {
			t.Fatalf("replacement_room %q", repl)
		}
		state := func(u *testutil.User, roomID, evType, key string) map[string]any {
			return srv.Must(t, "GET", roomPath(roomID, "/state/"+evType+"/"+url.PathEscape(key)), u.Token, nil)
		}
		create := state(alice, repl, "m.room.create", "")
		pred, _ := create["predecessor"].(map[string]any)
		if create["room_version"] != "11" || pred["room_id"] != old || pred["event_id"] == nil || create["creator"] != nil {
			t.Fatalf("the new room's create content %v", create)
		}
		if n := state(alice, repl, "m.room.name", ""); n["name"] != "the room" {
			t.Fatalf("name %v", n)
		}
		if n := state(alice, repl, "m.room.topic", ""); n["topic"] != "things" {
			t.Fatalf("topic %v", n)
		}
		if n := state(alice, repl, "m.room.encryption", ""); n["algorithm"] != "m.megolm.v1.aes-sha2" {
			t.Fatalf("encryption %v", n)
		}
		if n := state(alice, repl, "m.room.join_rules", ""); n["join_rule"] != "public" {
			t.Fatalf("join rules %v", n)
		}
		if n := state(alice, repl, "m.room.member", mallory.UserID); n["membership"] != "ban" {
			t.Fatalf("mallory in the new room %v", n)
		}
		if n := state(alice, repl, "m.room.canonical_alias", ""); n["alias"] != alias {
			t.Fatalf("canonical alias %v", n)
		}
		if got, want := state(alice, repl, "m.room.power_levels", "")["users"], state(alice, old, "m.room.power_levels", "")["users"]; testutil.Canonical(t, got) != testutil.Canonical(t, want) {
			t.Fatalf("power levels' users %v, want %v", got, want)
		}

		// The old room: tombstoned, closed to ordinary members.
		if ts := state(alice, old, "m.room.tombstone", ""); ts["replacement_room"] != repl || ts["body"] == nil {
			t.Fatalf("tombstone %v", ts)
		}
		pl := state(alice, old, "m.room.power_levels", "")
		if pl["events_default"].(float64) < 50 || pl["invite"].(float64) < 50 {
			t.Fatalf("the old room's power levels %v", pl)
		}
		if r := srv.Do(t, "PUT", roomPath(old, "/send/m.room.message/late"), bob.Token, map[string]any{"msgtype": "m.text", "body": "hi"}); r.Status != 403 {
			t.Fatalf("bob talking in the old room: %d %s", r.Status, r.Raw)
		}
		if ca := state(alice, old, "m.room.canonical_alias", ""); ca["alias"] != nil {
			t.Fatalf("the old room keeps the alias %v", ca)
		}

		// The alias and the directory entry moved.
		if got := srv.Must(t, "GET", v3+"/directory/room/"+url.PathEscape(alias), alice.Token, nil)["room_id"]; got != repl {
			t.Fatalf("%s names %v", alias, got)
		}
		var listed []string
		for _, r := range srv.Must(t, "GET", publicRoomsPath, alice.Token, nil)["chunk"].([]any) {
			listed = append(listed, r.(map[string]any)["room_id"].(string))
		}
		if !slices.Contains(listed, repl) || slices.Contains(listed, old) {
			t.Fatalf("directory lists %v", listed)
		}

		// Push rules: alice's at once, bob's when he joins.
		hasRule := func(u *testutil.User) bool {
			return srv.Do(t, "GET", v3+"/pushrules/global/room/"+url.PathEscape(repl), u.Token, nil).Status == 200
		}
		if !hasRule(alice) || hasRule(bob) {
			t.Fatalf("rules for the new room before bob joined: alice %v, bob %v", hasRule(alice), hasRule(bob))
		}
		srv.Must(t, "POST", roomPath(repl, "/join"), bob.Token, map[string]any{})
		if !hasRule(bob) {
			t.Fatal("bob's rule of the old room was not copied when he joined the new one")
		}
		if r := srv.Do(t, "POST", roomPath(repl, "/join"), mallory.Token, map[string]any{}); r.Status != 403 {
			t.Fatalf("mallory joining the new room: %d %s", r.Status, r.Raw)
		}
	})
}
