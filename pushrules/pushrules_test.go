package pushrules_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/pushrules"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

const alice = "@alice:local.test"

func newService(t *testing.T, db testdb.Database) (*pushrules.Service, *sqlstore.Store, *[]storage.Change) {
	t.Helper()
	store, err := sqlstore.Open(context.Background(), db.URI, "local.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	var mu sync.Mutex
	var changes []storage.Change
	svc := pushrules.New(store, func(c storage.Change) {
		mu.Lock()
		defer mu.Unlock()
		changes = append(changes, c)
	})
	return svc, store, &changes
}

func ruleset(t *testing.T, svc *pushrules.Service, userID string) pushrules.Ruleset {
	t.Helper()
	rs, err := svc.Scope(context.Background(), userID, "global")
	if err != nil {
		t.Fatal(err)
	}
	return rs.(pushrules.Ruleset)
}

func ids(rules []pushrules.Rule) []string {
	var out []string
	for _, r := range rules {
		out = append(out, r.RuleID)
	}
	return out
}

func wantCode(t *testing.T, err error, status int, code string) {
	t.Helper()
	var me *mxerr.Error
	if !errors.As(err, &me) || me.Status != status || me.Code != code {
		t.Fatalf("got %v, want %d %s", err, status, code)
	}
}

func TestDefaultRules(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		svc, _, _ := newService(t, db)
		rs := ruleset(t, svc, alice)
		wantOverride := []string{".m.rule.master", ".m.rule.suppress_notices", ".m.rule.invite_for_me",
			".m.rule.member_event", ".m.rule.is_user_mention", ".m.rule.contains_display_name",
			".m.rule.is_room_mention", ".m.rule.roomnotif", ".m.rule.tombstone", ".m.rule.reaction",
			".m.rule.server_acl", ".m.rule.suppress_edits"}
		if got := ids(rs.Override); !slices.Equal(got, wantOverride) {
			t.Fatalf("override %q", got)
		}
		wantUnderride := []string{".m.rule.call", ".m.rule.encrypted_room_one_to_one",
			".m.rule.room_one_to_one", ".m.rule.message", ".m.rule.encrypted"}
		if got := ids(rs.Underride); !slices.Equal(got, wantUnderride) {
			t.Fatalf("underride %q", got)
		}
		if len(rs.Content) != 1 || rs.Content[0].RuleID != ".m.rule.contains_user_name" || *rs.Content[0].Pattern != "alice" {
			t.Fatalf("content %+v", rs.Content)
		}
		if len(rs.Room) != 0 || len(rs.Sender) != 0 {
			t.Fatalf("room %v sender %v", rs.Room, rs.Sender)
		}
		for _, r := range append(append(rs.Override, rs.Content...), rs.Underride...) {
			if !r.Default {
				t.Fatalf("%s is not marked default", r.RuleID)
			}
			if r.Enabled != (r.RuleID != ".m.rule.master") {
				t.Fatalf("%s enabled=%v", r.RuleID, r.Enabled)
			}
		}
		// The user's own ID is in the rules that name them.
		invite, err := svc.Rule(context.Background(), alice, "global", "override", ".m.rule.invite_for_me")
		if err != nil {
			t.Fatal(err)
		}
		if string(invite.Conditions[2]) != `{"key":"state_key","kind":"event_match","pattern":"@alice:local.test"}` {
			t.Fatalf("invite_for_me conditions %s", invite.Conditions)
		}
		// The JSON shape clients read: every kind present, conditions on
		// the master rule even though it has none.
		all, _ := svc.All(context.Background(), alice)
		b, _ := json.Marshal(all)
		var doc map[string]map[string][]map[string]any
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatal(err)
		}
		for _, k := range pushrules.Kinds {
			if _, ok := doc["global"][k]; !ok {
				t.Fatalf("no %s in %s", k, b)
			}
		}
		if c, ok := doc["global"]["override"][0]["conditions"].([]any); !ok || len(c) != 0 {
			t.Fatalf("the master rule's conditions are not an empty list: %s", b)
		}
		if _, ok := doc["global"]["content"][0]["conditions"]; ok {
			t.Fatalf("a content rule has conditions: %s", b)
		}
	})
}

func TestUserRulesOrderAndChanges(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		svc, store, changes := newService(t, db)
		cond := json.RawMessage(`[{"kind":"event_match","key":"content.body","pattern":"cake*"}]`)
		notify := json.RawMessage(`["notify"]`)
		put := func(id, before, after string) {
			t.Helper()
			if err := svc.Put(ctx, alice, "global", "override", id, before, after, pushrules.NewRule{Actions: notify, Conditions: cond}); err != nil {
				t.Fatalf("put %s: %v", id, err)
			}
		}
		put("one", "", "")
		put("two", "", "")       // highest priority of the user's: before one
		put("three", "", "one")  // after one
		put("four", "three", "") // before three
		rs := ruleset(t, svc, alice)
		want := []string{".m.rule.master", "two", "one", "four", "three", ".m.rule.suppress_notices"}
		if got := ids(rs.Override)[:6]; !slices.Equal(got, want) {
			t.Fatalf("override order %q", got)
		}
		if len(*changes) != 4 {
			t.Fatalf("%d changes reported, want 4", len(*changes))
		}

		// Replacing a rule keeps its place; moving it with before works.
		if err := svc.Put(ctx, alice, "global", "override", "one", "", "", pushrules.NewRule{Actions: json.RawMessage(`["dont_notify"]`), Conditions: cond}); err != nil {
			t.Fatal(err)
		}
		r, _ := svc.Rule(ctx, alice, "global", "override", "one")
		if len(r.Actions) != 1 || string(r.Actions[0]) != `"dont_notify"` || r.Default || !r.Enabled {
			t.Fatalf("replaced rule %+v", r)
		}
		put("three", "two", "")
		if got := ids(ruleset(t, svc, alice).Override)[1:5]; !slices.Equal(got, []string{"three", "two", "one", "four"}) {
			t.Fatalf("after moving three %q", got)
		}

		// Defaults can be switched and given other actions, and that is
		// kept across reads.
		if err := svc.SetEnabled(ctx, alice, "global", "override", ".m.rule.master", true); err != nil {
			t.Fatal(err)
		}
		if err := svc.SetActions(ctx, alice, "global", "underride", ".m.rule.message", json.RawMessage(`["notify",{"set_tweak":"sound","value":"bing"}]`)); err != nil {
			t.Fatal(err)
		}
		if on, _ := svc.Enabled(ctx, alice, "global", "override", ".m.rule.master"); !on {
			t.Fatal("master not enabled after enabling it")
		}
		acts, _ := svc.Actions(ctx, alice, "global", "underride", ".m.rule.message")
		if len(acts) != 2 || string(acts[1]) != `{"set_tweak":"sound","value":"bing"}` {
			t.Fatalf("actions %s", acts)
		}

		// The stored m.push_rules account data is the whole ruleset.
		stored, err := store.AccountData(ctx, alice, "", "m.push_rules")
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Global pushrules.Ruleset `json:"global"`
		}
		if err := json.Unmarshal(stored, &doc); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ids(doc.Global.Override), ids(ruleset(t, svc, alice).Override)) || !doc.Global.Override[0].Enabled {
			t.Fatalf("stored %s", stored)
		}

		// Room, sender and content rules.
		if err := svc.Put(ctx, alice, "global", "room", "!r:local.test", "", "", pushrules.NewRule{Actions: notify}); err != nil {
			t.Fatal(err)
		}
		if err := svc.Put(ctx, alice, "global", "sender", "@bob:local.test", "", "", pushrules.NewRule{Actions: json.RawMessage(`[]`)}); err != nil {
			t.Fatal(err)
		}
		if err := svc.Put(ctx, alice, "global", "content", "nick", "", "", pushrules.NewRule{Actions: notify, Pattern: json.RawMessage(`"ally"`)}); err != nil {
			t.Fatal(err)
		}
		rs = ruleset(t, svc, alice)
		if !slices.Equal(ids(rs.Content), []string{"nick", ".m.rule.contains_user_name"}) || len(rs.Room) != 1 || len(rs.Sender) != 1 {
			t.Fatalf("content %q room %v sender %v", ids(rs.Content), rs.Room, rs.Sender)
		}

		// Deleting a user rule; a default rule cannot be deleted.
		if err := svc.Delete(ctx, alice, "global", "override", "two"); err != nil {
			t.Fatal(err)
		}
		if _, err := svc.Rule(ctx, alice, "global", "override", "two"); err == nil {
			t.Fatal("deleted rule still there")
		}
		wantCode(t, svc.Delete(ctx, alice, "global", "override", ".m.rule.master"), http.StatusNotFound, "M_NOT_FOUND")
		wantCode(t, svc.Delete(ctx, alice, "global", "override", "never"), http.StatusNotFound, "M_NOT_FOUND")

		// Another user still has only the defaults.
		if got := ids(ruleset(t, svc, "@bob:local.test").Override); len(got) != 12 {
			t.Fatalf("bob's override %q", got)
		}
	})
}

func TestBadRulesChangeNothing(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		svc, store, changes := newService(t, db)
		notify := json.RawMessage(`["notify"]`)
		cases := []struct {
			name                    string
			scope, kind, id, before string
			body                    pushrules.NewRule
			status                  int
			code                    string
		}{
			{"reserved id", "global", "override", ".m.rule.mine", "", pushrules.NewRule{Actions: notify}, 400, "M_INVALID_PARAM"},
			{"unknown scope", "device", "override", "x", "", pushrules.NewRule{Actions: notify}, 400, "M_INVALID_PARAM"},
			{"unknown kind", "global", "postride", "x", "", pushrules.NewRule{Actions: notify}, 400, "M_INVALID_PARAM"},
			{"no actions", "global", "override", "x", "", pushrules.NewRule{}, 400, "M_MISSING_PARAM"},
			{"actions not a list", "global", "override", "x", "", pushrules.NewRule{Actions: json.RawMessage(`"notify"`)}, 400, "M_BAD_JSON"},
			{"unknown action", "global", "override", "x", "", pushrules.NewRule{Actions: json.RawMessage(`["shout"]`)}, 400, "M_INVALID_PARAM"},
			{"tweak without name", "global", "override", "x", "", pushrules.NewRule{Actions: json.RawMessage(`[{"value":1}]`)}, 400, "M_INVALID_PARAM"},
			{"condition not object", "global", "override", "x", "", pushrules.NewRule{Actions: notify, Conditions: json.RawMessage(`["a"]`)}, 400, "M_BAD_JSON"},
			{"condition without kind", "global", "override", "x", "", pushrules.NewRule{Actions: notify, Conditions: json.RawMessage(`[{"key":"a"}]`)}, 400, "M_MISSING_PARAM"},
			{"content without pattern", "global", "content", "x", "", pushrules.NewRule{Actions: notify}, 400, "M_MISSING_PARAM"},
			{"before unknown rule", "global", "override", "x", "nope", pushrules.NewRule{Actions: notify}, 404, "M_NOT_FOUND"},
			{"before a default rule", "global", "override", "x", ".m.rule.master", pushrules.NewRule{Actions: notify}, 400, "M_INVALID_PARAM"},
		}
		for _, c := range cases {
			err := svc.Put(ctx, alice, c.scope, c.kind, c.id, c.before, "", c.body)
			t.Run(c.name, func(t *testing.T) { wantCode(t, err, c.status, c.code) })
		}
		wantCode(t, svc.SetEnabled(ctx, alice, "global", "override", "nope", true), 404, "M_NOT_FOUND")
		wantCode(t, svc.SetActions(ctx, alice, "global", "override", ".m.rule.master", json.RawMessage(`[42]`)), 400, "M_INVALID_PARAM")
		if _, err := store.AccountData(ctx, alice, "", "m.push_rules"); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("a refused change stored something: %v", err)
		}
		if len(*changes) != 0 {
			t.Fatalf("%d changes reported for refused requests", len(*changes))
		}
	})
}

func TestStoredCopyMergesWithCurrentDefaults(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		svc, store, _ := newService(t, db)
		// A copy stored by an older release: it lacks most of today's
		// default rules, switched one off, and has a rule of the user's.
		old := `{"global":{"override":[
			{"rule_id":".m.rule.master","default":true,"enabled":false,"conditions":[],"actions":["dont_notify"]},
			{"rule_id":"mine","default":false,"enabled":true,"conditions":[],"actions":["notify"]},
			{"rule_id":".m.rule.suppress_notices","default":true,"enabled":false,"conditions":[],"actions":["dont_notify"]}],
			"content":[],"room":[],"sender":[],"underride":[]}}`
		if _, err := store.SetAccountData(ctx, alice, "", "m.push_rules", []byte(old)); err != nil {
			t.Fatal(err)
		}
		rs := ruleset(t, svc, alice)
		if got := ids(rs.Override); len(got) != 13 || got[1] != "mine" || got[2] != ".m.rule.suppress_notices" {
			t.Fatalf("override %q", got)
		}
		if rs.Override[2].Enabled {
			t.Fatal("the user's switch on a default rule was lost")
		}
		if len(rs.Underride) != 5 || len(rs.Content) != 1 {
			t.Fatalf("defaults missing: underride %q content %q", ids(rs.Underride), ids(rs.Content))
		}
		// A copy that is not a ruleset at all counts as the defaults.
		if _, err := store.SetAccountData(ctx, alice, "", "m.push_rules", []byte(`{"global":"nonsense"}`)); err != nil {
			t.Fatal(err)
		}
		if got := ids(ruleset(t, svc, alice).Override); len(got) != 12 {
			t.Fatalf("override from a bad copy %q", got)
		}
	})
}

func TestConcurrentChangesAllStay(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		svc, _, _ := newService(t, db)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := string(rune('a' + i))
				errs <- svc.Put(ctx, alice, "global", "room", "!"+id+":local.test", "", "", pushrules.NewRule{Actions: json.RawMessage(`["notify"]`)})
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if got := ruleset(t, svc, alice).Room; len(got) != 8 {
			t.Fatalf("%d room rules after 8 concurrent puts", len(got))
		}
	})
}
