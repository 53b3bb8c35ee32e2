package federationapi_test

import (
	"net/url"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

// A version 10 room upgraded to version 11 between two daemons: the
// member on the other server sees the tombstone, follows it into the new
// room through the upgrading user's server, and keeps the push rule they
// had for the old room.
func TestRoomUpgradeBetweenDaemons(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a, b := testutil.StartNode(t, db, nil), testutil.StartNode(t, testutil.SQLite(t), nil)
		alice := a.Register(t, "alice", "")
		bob := b.Register(t, "bob", "")
		old := a.Must(t, "POST", clientV3+"/createRoom", alice.Token, map[string]any{"preset": "public_chat", "room_version": "10", "name": "before"})["room_id"].(string)
		joinVia(t, b, bob, old, a)
		b.Must(t, "PUT", clientV3+"/pushrules/global/room/"+url.PathEscape(old), bob.Token, map[string]any{"actions": []any{}})

		repl := a.Must(t, "POST", rpath(old, "/upgrade"), alice.Token, map[string]any{"new_version": "11"})["replacement_room"].(string)
		eventually(t, "the tombstone to reach bob's server", func() bool {
			r := b.Do(t, "GET", rpath(old, "/state/m.room.tombstone/"), bob.Token, nil)
			return r.Status == 200 && r.Body["replacement_room"] == repl
		})
		joinVia(t, b, bob, repl, a)
		create := b.Must(t, "GET", rpath(repl, "/state/m.room.create/"), bob.Token, nil)
		if pred, _ := create["predecessor"].(map[string]any); create["room_version"] != "11" || pred["room_id"] != old {
			t.Fatalf("the new room's create content on bob's server: %v", create)
		}
		if name := b.Must(t, "GET", rpath(repl, "/state/m.room.name/"), bob.Token, nil); name["name"] != "before" {
			t.Fatalf("the new room's name on bob's server: %v", name)
		}
		if r := b.Do(t, "GET", clientV3+"/pushrules/global/room/"+url.PathEscape(repl), bob.Token, nil); r.Status != 200 {
			t.Fatalf("bob's push rule for the new room: %d %s", r.Status, r.Raw)
		}
		// Messages flow in the new room both ways.
		b.Must(t, "PUT", rpath(repl, "/send/m.room.message/1"), bob.Token, map[string]any{"msgtype": "m.text", "body": "moved"})
		eventually(t, "bob's message in the new room on alice's server", func() bool {
			r := a.Do(t, "GET", rpath(repl, "/messages?dir=b&limit=5"), alice.Token, nil)
			for _, e := range asList(r.Body["chunk"]) {
				if c, _ := e.(map[string]any)["content"].(map[string]any); c["body"] == "moved" {
					return true
				}
			}
			return false
		})
	})
}
