package federationapi_test

import (
	"encoding/json"
	"net/url"
	"regexp"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

// hashRoomID is a version 12 room ID: "!" and the create event's
// reference hash, with no server name.
var hashRoomID = regexp.MustCompile(`^![A-Za-z0-9_-]{43}$`)

// A version 12 room between two daemons: its ID is the hash of its
// create event, the invite carries the create event as a full PDU, the
// invited user joins over federation, the creators (alice, and bob as an
// additional creator of a trusted private chat) act above every power
// level without being listed in the power levels, and encrypted messages
// and state flow both ways.
func TestRoomVersion12BetweenDaemons(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a, b := testutil.StartNode(t, db, nil), testutil.StartNode(t, testutil.SQLite(t), nil)
		alice := a.Register(t, "alice", "")
		carol := a.Register(t, "carol", "")
		bob := b.Register(t, "bob", "")
		dan := b.Register(t, "dan", "")

		room := a.Must(t, "POST", clientV3+"/createRoom", alice.Token, map[string]any{
			"preset": "trusted_private_chat", "room_version": "12", "invite": []string{bob.UserID},
			"initial_state": []any{map[string]any{"type": "m.room.encryption", "state_key": "",
				"content": map[string]any{"algorithm": "m.megolm.v1.aes-sha2"}}},
		})["room_id"].(string)
		if !hashRoomID.MatchString(room) {
			t.Fatalf("version 12 room ID %q", room)
		}
		create := a.Must(t, "GET", rpath(room, "/state/m.room.create/"), alice.Token, nil)
		if create["room_version"] != "12" || create["creator"] != nil {
			t.Fatalf("create content %v", create)
		}
		if extra := asList(create["additional_creators"]); len(extra) != 1 || extra[0] != bob.UserID {
			t.Fatalf("additional creators %v", create["additional_creators"])
		}
		pl := a.Must(t, "GET", rpath(room, "/state/m.room.power_levels/"), alice.Token, nil)
		if users, _ := pl["users"].(map[string]any); users[alice.UserID] != nil || users[bob.UserID] != nil {
			t.Fatalf("creators listed in the power levels: %v", pl["users"])
		}

		// Bob's invite shows the room's create event.
		eventually(t, "bob's invite with the room's create event", func() bool {
			r := b.Do(t, "GET", clientV3+"/sync", bob.Token, nil)
			rooms, _ := r.Body["rooms"].(map[string]any)
			inv, _ := rooms["invite"].(map[string]any)
			ir, _ := inv[room].(map[string]any)
			st, _ := ir["invite_state"].(map[string]any)
			for _, e := range asList(st["events"]) {
				// The create event is shown whole, as it came in the
				// invite: with its ID, room ID and timestamp.
				if ev, _ := e.(map[string]any); ev["type"] == "m.room.create" && ev["sender"] == alice.UserID &&
					ev["room_id"] == room && ev["event_id"] == "$"+room[1:] && ev["origin_server_ts"] != nil {
					return true
				}
			}
			return false
		})
		joinVia(t, b, bob, room, a)

		// Alice, a creator, needs no power level entry to raise carol;
		// listing a creator in the power levels is refused.
		a.Must(t, "POST", rpath(room, "/invite"), alice.Token, map[string]any{"user_id": carol.UserID})
		// A local invite shows the create event whole too.
		r := a.Must(t, "GET", clientV3+"/sync", carol.Token, nil)
		inv := r["rooms"].(map[string]any)["invite"].(map[string]any)[room].(map[string]any)
		found := false
		for _, e := range asList(inv["invite_state"].(map[string]any)["events"]) {
			if ev, _ := e.(map[string]any); ev["type"] == "m.room.create" {
				found = ev["origin_server_ts"] != nil && ev["room_id"] == room
			}
		}
		if !found {
			t.Fatalf("carol's invite state %v", inv)
		}
		a.Must(t, "POST", rpath(room, "/join"), carol.Token, map[string]any{})
		pl["users"] = map[string]any{carol.UserID: 50}
		a.Must(t, "PUT", rpath(room, "/state/m.room.power_levels/"), alice.Token, pl)
		pl["users"] = map[string]any{carol.UserID: 50, alice.UserID: 100}
		if r := a.Do(t, "PUT", rpath(room, "/state/m.room.power_levels/"), alice.Token, pl); r.Status != 400 || r.Errcode() != "M_BAD_JSON" {
			t.Fatalf("power levels listing a creator: %d %s", r.Status, r.Raw)
		}

		// Bob, an additional creator on the other server, invites and
		// kicks above carol's level, and carol cannot kick him.
		eventually(t, "carol's power level on bob's server", func() bool {
			r := b.Do(t, "GET", rpath(room, "/state/m.room.power_levels/"), bob.Token, nil)
			users, _ := r.Body["users"].(map[string]any)
			return r.Status == 200 && users[carol.UserID] == float64(50)
		})
		if r := a.Do(t, "POST", rpath(room, "/kick"), carol.Token, map[string]any{"user_id": bob.UserID}); r.Status != 403 {
			t.Fatalf("carol kicking a creator: %d %s", r.Status, r.Raw)
		}
		b.Must(t, "POST", rpath(room, "/kick"), bob.Token, map[string]any{"user_id": carol.UserID, "reason": "test"})
		eventually(t, "bob's kick of carol on alice's server", func() bool {
			r := a.Do(t, "GET", rpath(room, "/state/m.room.member/"+url.PathEscape(carol.UserID)), alice.Token, nil)
			return r.Status == 200 && r.Body["membership"] == "leave"
		})

		// Bob invites dan, of his own server, who joins; encrypted
		// messages and a state change flow both ways.
		b.Must(t, "POST", rpath(room, "/invite"), bob.Token, map[string]any{"user_id": dan.UserID})
		b.Must(t, "POST", rpath(room, "/join"), dan.Token, map[string]any{})
		enc := map[string]any{"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AwgAEnAC", "device_id": "DEV",
			"sender_key": "c2VuZGVyIGtleQ", "session_id": "c2Vzc2lvbg"}
		b.Must(t, "PUT", rpath(room, "/send/m.room.encrypted/b1"), dan.Token, enc)
		a.Must(t, "PUT", rpath(room, "/send/m.room.encrypted/a1"), alice.Token, enc)
		b.Must(t, "PUT", rpath(room, "/state/m.room.topic/"), bob.Token, map[string]any{"topic": "twelve"})
		seen := func(n *testutil.Node, u *testutil.User, sender string) func() bool {
			return func() bool {
				r := n.Do(t, "GET", rpath(room, "/messages?dir=b&limit=20"), u.Token, nil)
				for _, e := range asList(r.Body["chunk"]) {
					ev, _ := e.(map[string]any)
					if ev["type"] == "m.room.encrypted" && ev["sender"] == sender {
						return true
					}
				}
				return false
			}
		}
		eventually(t, "dan's encrypted message on alice's server", seen(a, alice, dan.UserID))
		eventually(t, "alice's encrypted message on bob's server", seen(b, dan, alice.UserID))
		eventually(t, "bob's topic on alice's server", func() bool {
			r := a.Do(t, "GET", rpath(room, "/state/m.room.topic/"), alice.Token, nil)
			return r.Status == 200 && r.Body["topic"] == "twelve"
		})
		// Both servers hold the same state.
		for _, n := range []struct {
			node *testutil.Node
			user *testutil.User
		}{{a, alice}, {b, bob}} {
			r := n.node.Must(t, "GET", rpath(room, "/joined_members"), n.user.Token, nil)
			joined, _ := r["joined"].(map[string]any)
			if len(joined) != 3 || joined[alice.UserID] == nil || joined[bob.UserID] == nil || joined[dan.UserID] == nil {
				raw, _ := json.Marshal(joined)
				t.Fatalf("%s: joined members %s", n.node.ServerName, raw)
			}
		}

		// Once bob's server has left the room, made public, dan rejoins
		// with the room ID alone: it names no server, the create event B
		// kept does (its sender's).
		a.Must(t, "PUT", rpath(room, "/state/m.room.join_rules/"), alice.Token, map[string]any{"join_rule": "public"})
		b.Must(t, "POST", rpath(room, "/leave"), bob.Token, map[string]any{})
		b.Must(t, "POST", rpath(room, "/leave"), dan.Token, map[string]any{})
		eventually(t, "bob and dan to have left on alice's server", func() bool {
			r := a.Must(t, "GET", rpath(room, "/joined_members"), alice.Token, nil)
			joined, _ := r["joined"].(map[string]any)
			return len(joined) == 1
		})
		b.Must(t, "POST", clientV3+"/join/"+url.PathEscape(room), dan.Token, map[string]any{})
		eventually(t, "dan's rejoin on alice's server", func() bool {
			r := a.Do(t, "GET", rpath(room, "/state/m.room.member/"+url.PathEscape(dan.UserID)), alice.Token, nil)
			return r.Status == 200 && r.Body["membership"] == "join"
		})
	})
}

// A version 11 room upgraded to version 12 with an additional creator on
// the other server: the new room's ID is its create event's hash, its
// creators are the upgrading user and bob, neither is listed in its
// power levels (where the old room listed alice), and bob follows the
// tombstone and acts as a creator there.
func TestUpgradeToRoomVersion12BetweenDaemons(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a, b := testutil.StartNode(t, db, nil), testutil.StartNode(t, testutil.SQLite(t), nil)
		alice := a.Register(t, "alice", "")
		bob := b.Register(t, "bob", "")
		old := a.Must(t, "POST", clientV3+"/createRoom", alice.Token, map[string]any{"preset": "public_chat", "room_version": "11", "name": "before"})["room_id"].(string)
		joinVia(t, b, bob, old, a)
		if r := a.Do(t, "POST", rpath(old, "/upgrade"), alice.Token, map[string]any{"new_version": "11", "additional_creators": []string{bob.UserID}}); r.Status != 400 {
			t.Fatalf("additional creators for a version 11 room: %d %s", r.Status, r.Raw)
		}
		if r := a.Do(t, "POST", rpath(old, "/upgrade"), alice.Token, map[string]any{"new_version": "12", "additional_creators": []string{"bob"}}); r.Status != 400 {
			t.Fatalf("an additional creator that is not a user ID: %d %s", r.Status, r.Raw)
		}
		repl := a.Must(t, "POST", rpath(old, "/upgrade"), alice.Token, map[string]any{"new_version": "12", "additional_creators": []string{bob.UserID}})["replacement_room"].(string)
		if !hashRoomID.MatchString(repl) {
			t.Fatalf("replacement room ID %q", repl)
		}
		if pl := a.Must(t, "GET", rpath(old, "/state/m.room.power_levels/"), alice.Token, nil); pl["users"].(map[string]any)[alice.UserID] == nil {
			t.Fatalf("the old room's power levels lost alice: %v", pl)
		}
		eventually(t, "the tombstone to reach bob's server", func() bool {
			r := b.Do(t, "GET", rpath(old, "/state/m.room.tombstone/"), bob.Token, nil)
			return r.Status == 200 && r.Body["replacement_room"] == repl
		})
		joinVia(t, b, bob, repl, a)
		create := b.Must(t, "GET", rpath(repl, "/state/m.room.create/"), bob.Token, nil)
		if pred, _ := create["predecessor"].(map[string]any); create["room_version"] != "12" || pred["room_id"] != old ||
			len(asList(create["additional_creators"])) != 1 || asList(create["additional_creators"])[0] != bob.UserID {
			t.Fatalf("the new room's create content on bob's server: %v", create)
		}
		pl := b.Must(t, "GET", rpath(repl, "/state/m.room.power_levels/"), bob.Token, nil)
		if users, _ := pl["users"].(map[string]any); users[alice.UserID] != nil || users[bob.UserID] != nil {
			t.Fatalf("creators listed in the new room's power levels: %v", pl["users"])
		}
		// Bob, a creator with no power level entry, changes a state event
		// that needs 100.
		b.Must(t, "PUT", rpath(repl, "/state/m.room.history_visibility/"), bob.Token, map[string]any{"history_visibility": "joined"})
		eventually(t, "bob's change on alice's server", func() bool {
			r := a.Do(t, "GET", rpath(repl, "/state/m.room.history_visibility/"), alice.Token, nil)
			return r.Status == 200 && r.Body["history_visibility"] == "joined"
		})
	})
}
