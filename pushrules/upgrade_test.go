package pushrules_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/pushrules"
)

// A user's enabled rules on a room are copied to the room that replaced
// it; disabled ones, other rooms' and the defaults are not, and a rule
// already there is kept.
func TestCopyRoomRules(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		svc, _, _ := newService(t, db)
		const old, repl = "!old:local.test", "!new:local.test"
		put := func(kind, id string, body pushrules.NewRule) {
			t.Helper()
			if err := svc.Put(ctx, alice, "global", kind, id, "", "", body); err != nil {
				t.Fatal(err)
			}
		}
		onRoom := func(room string) json.RawMessage {
			return json.RawMessage(`[{"kind":"event_match","key":"room_id","pattern":"` + room + `"}]`)
		}
		mute := json.RawMessage(`[]`)
		put("room", old, pushrules.NewRule{Actions: mute})
		put("override", "mute-"+old, pushrules.NewRule{Actions: mute, Conditions: onRoom(old)})
		put("override", "off", pushrules.NewRule{Actions: mute, Conditions: onRoom(old)})
		if err := svc.SetEnabled(ctx, alice, "global", "override", "off", false); err != nil {
			t.Fatal(err)
		}
		put("underride", "elsewhere", pushrules.NewRule{Actions: mute, Conditions: onRoom("!other:local.test")})
		if err := svc.CopyRoomRules(ctx, alice, old, repl); err != nil {
			t.Fatal(err)
		}
		rs := ruleset(t, svc, alice)
		if !slices.Contains(ids(rs.Room), repl) || !slices.Contains(ids(rs.Room), old) {
			t.Fatalf("room rules %v", ids(rs.Room))
		}
		i := slices.Index(ids(rs.Override), "mute-"+repl)
		if i < 0 || slices.Contains(ids(rs.Override), "off"+repl) || len(rs.Underride) != len(ruleset(t, svc, "@bob:local.test").Underride)+1 {
			t.Fatalf("override %v, underride %v", ids(rs.Override), ids(rs.Underride))
		}
		var cond map[string]any
		if err := json.Unmarshal(rs.Override[i].Conditions[0], &cond); err != nil || cond["pattern"] != repl {
			t.Fatalf("the copied rule's condition %s", rs.Override[i].Conditions[0])
		}
		// Copying again changes nothing; a rule already there stays.
		if err := svc.SetActions(ctx, alice, "global", "room", repl, json.RawMessage(`["notify"]`)); err != nil {
			t.Fatal(err)
		}
		if err := svc.CopyRoomRules(ctx, alice, old, repl); err != nil {
			t.Fatal(err)
		}
		again := ruleset(t, svc, alice)
		if len(again.Override) != len(rs.Override) || len(again.Room) != len(rs.Room) {
			t.Fatalf("copied twice: %v %v", ids(again.Override), ids(again.Room))
		}
		if r, err := svc.Rule(ctx, alice, "global", "room", repl); err != nil || len(r.Actions) != 1 {
			t.Fatalf("the rule already there was replaced: %+v, %v", r, err)
		}
	})
}
