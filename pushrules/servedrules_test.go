package pushrules_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/pushrules"
)

// The rules the service serves are evaluated here as the client-server
// specification defines it (and as clients and push gateways do): the
// kinds in order override, content, room, sender, underride, each list in
// its order; the first enabled rule whose conditions all hold decides the
// actions. Each case is an event and what the spec's default rules do
// with it, so a default rule with a wrong key, pattern, condition or
// place gives a wrong outcome.

// pushContext is what conditions read besides the event.
type pushContext struct {
	userID      string
	displayName string
	members     int
	powers      map[string]int // sender -> power level
	roomNotif   int            // notifications.room
}

// outcome is what the rules decide: the rule, and what its actions say.
type outcome struct {
	rule      string
	notify    bool
	highlight bool
	sound     string
}

func evaluate(t *testing.T, rs pushrules.Ruleset, pc pushContext, event map[string]any) outcome {
	t.Helper()
	kinds := []struct {
		kind  string
		rules []pushrules.Rule
	}{{"override", rs.Override}, {"content", rs.Content}, {"room", rs.Room}, {"sender", rs.Sender}, {"underride", rs.Underride}}
	for _, k := range kinds {
		for _, r := range k.rules {
			if r.Enabled && ruleMatches(t, k.kind, r, pc, event) {
				return actionsOutcome(t, r)
			}
		}
	}
	return outcome{}
}

func ruleMatches(t *testing.T, kind string, r pushrules.Rule, pc pushContext, event map[string]any) bool {
	switch kind {
	case "content":
		body, ok := property(event, "content.body").(string)
		return ok && r.Pattern != nil && globMatches(*r.Pattern, body, true)
	case "room":
		return event["room_id"] == r.RuleID
	case "sender":
		return event["sender"] == r.RuleID
	}
	for _, raw := range r.Conditions {
		if !conditionHolds(t, raw, pc, event) {
			return false
		}
	}
	return true
}

func conditionHolds(t *testing.T, raw json.RawMessage, pc pushContext, event map[string]any) bool {
	t.Helper()
	var c struct {
		Kind    string          `json:"kind"`
		Key     string          `json:"key"`
		Pattern *string         `json:"pattern"`
		Value   json.RawMessage `json:"value"`
		Is      string          `json:"is"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatalf("condition %s: %v", raw, err)
	}
	switch c.Kind {
	case "event_match":
		v, ok := property(event, c.Key).(string)
		return ok && c.Pattern != nil && globMatches(*c.Pattern, v, c.Key == "content.body")
	case "contains_display_name":
		body, ok := property(event, "content.body").(string)
		return ok && pc.displayName != "" &&
			regexp.MustCompile(`(?is)(^|\W)`+regexp.QuoteMeta(pc.displayName)+`(\W|$)`).MatchString(body)
	case "room_member_count":
		return memberCountIs(c.Is, pc.members)
	case "sender_notification_permission":
		if c.Key != "room" {
			t.Fatalf("notification permission %q", c.Key)
		}
		return pc.powers[event["sender"].(string)] >= pc.roomNotif
	case "event_property_is":
		var want any
		_ = json.Unmarshal(c.Value, &want)
		got := property(event, c.Key)
		return got != nil && fmt.Sprint(got) == fmt.Sprint(want) && fmt.Sprintf("%T", got) == fmt.Sprintf("%T", want)
	case "event_property_contains":
		var want any
		_ = json.Unmarshal(c.Value, &want)
		list, _ := property(event, c.Key).([]any)
		for _, v := range list {
			if v == want {
				return true
			}
		}
		return false
	}
	t.Fatalf("a default rule has a condition of unknown kind %q", c.Kind)
	return false
}

// property reads a dotted key of the event, "\." being a dot in a name.
func property(event map[string]any, key string) any {
	var parts []string
	cur := ""
	for i := 0; i < len(key); i++ {
		switch {
		case key[i] == '\\' && i+1 < len(key):
			i++
			cur += string(key[i])
		case key[i] == '.':
			parts = append(parts, cur)
			cur = ""
		default:
			cur += string(key[i])
		}
	}
	parts = append(parts, cur)
	var v any = event
	for _, p := range parts {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

// globMatches matches a glob (* and ?) without regard to case: the whole
// value, or for content.body any run of whole words in it.
func globMatches(pattern, value string, words bool) bool {
	var re strings.Builder
	for _, r := range pattern {
		switch r {
		case '*':
			re.WriteString(".*?")
		case '?':
			re.WriteString(".")
		default:
			re.WriteString(regexp.QuoteMeta(string(r)))
		}
	}
	expr := "(?is)^" + re.String() + "$"
	if words {
		expr = `(?is)(^|\W)` + re.String() + `(\W|$)`
	}
	return regexp.MustCompile(expr).MatchString(value)
}

func memberCountIs(is string, n int) bool {
	op := strings.TrimRight(is, "0123456789")
	want, err := strconv.Atoi(is[len(op):])
	if err != nil {
		return false
	}
	switch op {
	case "", "==":
		return n == want
	case "<":
		return n < want
	case ">":
		return n > want
	case "<=":
		return n <= want
	case ">=":
		return n >= want
	}
	return false
}

func actionsOutcome(t *testing.T, r pushrules.Rule) outcome {
	t.Helper()
	o := outcome{rule: r.RuleID}
	for _, a := range r.Actions {
		var s string
		if json.Unmarshal(a, &s) == nil {
			o.notify = o.notify || s == "notify"
			continue
		}
		var tweak struct {
			SetTweak string `json:"set_tweak"`
			Value    any    `json:"value"`
		}
		if err := json.Unmarshal(a, &tweak); err != nil {
			t.Fatalf("action %s: %v", a, err)
		}
		switch tweak.SetTweak {
		case "highlight":
			o.highlight = tweak.Value == nil || tweak.Value == true
		case "sound":
			o.sound, _ = tweak.Value.(string)
		}
	}
	return o
}

const (
	roomID = "!room:local.test"
	bob    = "@bob:local.test"
	mod    = "@mod:local.test"
)

func message(sender string, content map[string]any) map[string]any {
	if _, ok := content["msgtype"]; !ok {
		content["msgtype"] = "m.text"
	}
	return map[string]any{"type": "m.room.message", "room_id": roomID, "sender": sender, "content": content}
}

// The default rules give each kind of event the spec's outcome.
func TestDefaultRulesOutcomes(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		svc, _, _ := newService(t, db)
		rs := ruleset(t, svc, alice)
		group := pushContext{userID: alice, displayName: "Alice Liddell", members: 5,
			powers: map[string]int{mod: 50, bob: 0}, roomNotif: 50}
		oneToOne := group
		oneToOne.members = 2
		empty := ""
		for _, c := range []struct {
			name  string
			pc    pushContext
			event map[string]any
			want  outcome
		}{
			{"a message", group, message(bob, map[string]any{"body": "hello"}), outcome{".m.rule.message", true, false, ""}},
			{"a message between two", oneToOne, message(bob, map[string]any{"body": "hello"}), outcome{".m.rule.room_one_to_one", true, false, "default"}},
			{"encrypted between two", oneToOne, map[string]any{"type": "m.room.encrypted", "sender": bob, "content": map[string]any{}},
				outcome{".m.rule.encrypted_room_one_to_one", true, false, "default"}},
			{"encrypted in a group", group, map[string]any{"type": "m.room.encrypted", "sender": bob, "content": map[string]any{}},
				outcome{".m.rule.encrypted", true, false, ""}},
			{"a notice", oneToOne, message(bob, map[string]any{"body": "alice", "msgtype": "m.notice"}), outcome{".m.rule.suppress_notices", false, false, ""}},
			{"the display name", group, message(bob, map[string]any{"body": "hi ALICE LIDDELL!"}), outcome{".m.rule.contains_display_name", true, true, "default"}},
			{"the user name", group, message(bob, map[string]any{"body": "ping alice?"}), outcome{".m.rule.contains_user_name", true, true, "default"}},
			{"the user name in a word", group, message(bob, map[string]any{"body": "malicerie"}), outcome{".m.rule.message", true, false, ""}},
			{"a mention", group, message(bob, map[string]any{"body": "x", "m.mentions": map[string]any{"user_ids": []any{alice}}}),
				outcome{".m.rule.is_user_mention", true, true, "default"}},
			{"another's mention", group, message(bob, map[string]any{"body": "x", "m.mentions": map[string]any{"user_ids": []any{bob}}}),
				outcome{".m.rule.message", true, false, ""}},
			{"@room by a moderator", group, message(mod, map[string]any{"body": "@room look"}), outcome{".m.rule.roomnotif", true, true, ""}},
			{"@room by anyone", group, message(bob, map[string]any{"body": "@room look"}), outcome{".m.rule.message", true, false, ""}},
			{"a room mention by a moderator", group, message(mod, map[string]any{"body": "x", "m.mentions": map[string]any{"room": true}}),
				outcome{".m.rule.is_room_mention", true, true, ""}},
			{"a room mention by anyone", group, message(bob, map[string]any{"body": "x", "m.mentions": map[string]any{"room": true}}),
				outcome{".m.rule.message", true, false, ""}},
			{"an invite for me", group, map[string]any{"type": "m.room.member", "sender": bob, "state_key": alice, "content": map[string]any{"membership": "invite"}},
				outcome{".m.rule.invite_for_me", true, false, "default"}},
			{"an invite for another", group, map[string]any{"type": "m.room.member", "sender": bob, "state_key": mod, "content": map[string]any{"membership": "invite"}},
				outcome{".m.rule.member_event", false, false, ""}},
			{"an edit naming me", group, message(bob, map[string]any{"body": "alice", "m.relates_to": map[string]any{"rel_type": "m.replace", "event_id": "$e"}}),
				outcome{".m.rule.suppress_edits", false, false, ""}},
			{"a reaction", oneToOne, map[string]any{"type": "m.reaction", "sender": bob, "content": map[string]any{}}, outcome{".m.rule.reaction", false, false, ""}},
			{"a call", group, map[string]any{"type": "m.call.invite", "sender": bob, "content": map[string]any{}}, outcome{".m.rule.call", true, false, "ring"}},
			{"a tombstone", group, map[string]any{"type": "m.room.tombstone", "sender": mod, "state_key": empty, "content": map[string]any{}},
				outcome{".m.rule.tombstone", true, true, ""}},
			{"a server ACL", group, map[string]any{"type": "m.room.server_acl", "sender": mod, "state_key": empty, "content": map[string]any{}},
				outcome{".m.rule.server_acl", false, false, ""}},
			{"another event", group, map[string]any{"type": "org.example", "sender": bob, "content": map[string]any{}}, outcome{}},
		} {
			if got := evaluate(t, rs, c.pc, c.event); got != c.want {
				t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
			}
		}
	})
}

// A user's changes take effect in the order of the kinds and of each
// list: the master switch silences everything, a disabled rule is
// skipped, changed actions apply, and a user's rule of a kind comes
// before the defaults of that kind.
func TestUserChangesToOutcomes(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		svc, _, _ := newService(t, db)
		pc := pushContext{userID: alice, displayName: "Alice", members: 5, powers: map[string]int{}, roomNotif: 50}
		hello := message(bob, map[string]any{"body": "hello"})
		notice := message(bob, map[string]any{"body": "hello", "msgtype": "m.notice"})
		named := message(bob, map[string]any{"body": "hello alice"})
		check := func(what string, event map[string]any, want string, notify bool) {
			t.Helper()
			if got := evaluate(t, ruleset(t, svc, alice), pc, event); got.rule != want || got.notify != notify {
				t.Fatalf("%s: %+v, want %s notify %v", what, got, want, notify)
			}
		}

		must := func(err error) {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
		}
		must(svc.SetEnabled(ctx, alice, "global", "override", ".m.rule.suppress_notices", false))
		check("a notice with suppress_notices off", notice, ".m.rule.message", true)

		// A room rule silences the room's messages but not a mention.
		must(svc.Put(ctx, alice, "global", "room", roomID, "", "", pushrules.NewRule{Actions: json.RawMessage(`[]`)}))
		check("a message in a silenced room", hello, roomID, false)
		check("the name in a silenced room", named, ".m.rule.contains_display_name", true)

		// A sender rule comes after the room rule.
		must(svc.Put(ctx, alice, "global", "sender", bob, "", "", pushrules.NewRule{Actions: json.RawMessage(`["notify"]`)}))
		check("bob in a silenced room", hello, roomID, false)
		must(svc.Delete(ctx, alice, "global", "room", roomID))
		check("bob's message", hello, bob, true)

		// A user's override rule comes before the default overrides.
		must(svc.Put(ctx, alice, "global", "override", "quiet-bob", "", "", pushrules.NewRule{Actions: json.RawMessage(`["dont_notify"]`),
			Conditions: json.RawMessage(`[{"kind":"event_match","key":"sender","pattern":"@bob:*"}]`)}))
		check("bob naming alice, quieted", named, "quiet-bob", false)
		must(svc.SetEnabled(ctx, alice, "global", "override", "quiet-bob", false))
		check("bob naming alice, the quieting off", named, ".m.rule.contains_display_name", true)

		// Changed actions of a default rule.
		must(svc.Delete(ctx, alice, "global", "sender", bob))
		must(svc.SetActions(ctx, alice, "global", "underride", ".m.rule.message", json.RawMessage(`["dont_notify"]`)))
		check("a message with .m.rule.message changed", hello, ".m.rule.message", false)

		// The master switch (an override before every other rule).
		must(svc.SetEnabled(ctx, alice, "global", "override", ".m.rule.master", true))
		check("a mention under the master switch", named, ".m.rule.master", false)
	})
}
