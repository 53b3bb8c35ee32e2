package pushrules

import (
	"encoding/json"
	"testing"
)

const me = "@alice:local.test"

func ev(t *testing.T, raw string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestEvaluateDefaults runs the server-default rules against events as
// clients and other servers send them.
func TestEvaluateDefaults(t *testing.T) {
	defaults := merge(me, nil)
	cases := []struct {
		name      string
		event     string
		members   int
		display   string
		power     int
		levels    map[string]int
		rule      string
		notify    bool
		highlight bool
		sound     any
	}{
		{name: "message in a group", event: `{"type":"m.room.message","sender":"@bob:other.test","content":{"msgtype":"m.text","body":"hello"}}`,
			members: 3, rule: ".m.rule.message", notify: true},
		{name: "message one to one", event: `{"type":"m.room.message","sender":"@bob:other.test","content":{"msgtype":"m.text","body":"hi"}}`,
			members: 2, rule: ".m.rule.room_one_to_one", notify: true, sound: "default"},
		{name: "encrypted one to one", event: `{"type":"m.room.encrypted","sender":"@bob:other.test","content":{"algorithm":"m.megolm.v1.aes-sha2","ciphertext":"AwgA"}}`,
			members: 2, rule: ".m.rule.encrypted_room_one_to_one", notify: true, sound: "default"},
		{name: "encrypted in a group", event: `{"type":"m.room.encrypted","sender":"@bob:other.test","content":{"ciphertext":"x"}}`,
			members: 5, rule: ".m.rule.encrypted", notify: true},
		{name: "notice", event: `{"type":"m.room.message","sender":"@bot:other.test","content":{"msgtype":"m.notice","body":"beep"}}`,
			members: 2, rule: ".m.rule.suppress_notices"},
		{name: "invite for me", event: `{"type":"m.room.member","state_key":"@alice:local.test","sender":"@bob:other.test","content":{"membership":"invite"}}`,
			members: 2, rule: ".m.rule.invite_for_me", notify: true, sound: "default"},
		{name: "other member event", event: `{"type":"m.room.member","state_key":"@carol:other.test","sender":"@carol:other.test","content":{"membership":"join"}}`,
			members: 3, rule: ".m.rule.member_event"},
		{name: "user mention", event: `{"type":"m.room.message","sender":"@bob:other.test","content":{"body":"look","m.mentions":{"user_ids":["@alice:local.test"]}}}`,
			members: 3, rule: ".m.rule.is_user_mention", notify: true, highlight: true, sound: "default"},
		{name: "display name, any case", event: `{"type":"m.room.message","sender":"@bob:other.test","content":{"body":"hey ALICE W., lunch?"}}`,
			members: 3, display: "Alice W.", rule: ".m.rule.contains_display_name", notify: true, highlight: true, sound: "default"},
		{name: "display name inside a word", event: `{"type":"m.room.message","sender":"@bob:other.test","content":{"body":"malice"}}`,
			members: 3, display: "alice", rule: ".m.rule.message", notify: true},
		{name: "user name", event: `{"type":"m.room.message","sender":"@bob:other.test","content":{"body":"where is alice?"}}`,
			members: 3, rule: ".m.rule.contains_user_name", notify: true, highlight: true, sound: "default"},
		{name: "@room by a moderator", event: `{"type":"m.room.message","sender":"@bob:other.test","content":{"body":"hello @room!"}}`,
			members: 3, power: 50, rule: ".m.rule.roomnotif", notify: true, highlight: true},
		{name: "@room without the power", event: `{"type":"m.room.message","sender":"@bob:other.test","content":{"body":"hello @room!"}}`,
			members: 3, power: 0, rule: ".m.rule.message", notify: true},
		{name: "@room with the room's lower level", event: `{"type":"m.room.message","sender":"@bob:other.test","content":{"body":"@room"}}`,
			members: 3, power: 10, levels: map[string]int{"room": 10}, rule: ".m.rule.roomnotif", notify: true, highlight: true},
		{name: "room mention", event: `{"type":"m.room.message","sender":"@bob:other.test","content":{"body":"x","m.mentions":{"room":true}}}`,
			members: 3, power: 100, rule: ".m.rule.is_room_mention", notify: true, highlight: true},
		{name: "tombstone", event: `{"type":"m.room.tombstone","state_key":"","sender":"@bob:other.test","content":{"body":"moved"}}`,
			members: 3, rule: ".m.rule.tombstone", notify: true, highlight: true},
		{name: "reaction", event: `{"type":"m.reaction","sender":"@bob:other.test","content":{"m.relates_to":{"rel_type":"m.annotation","key":"x"}}}`,
			members: 2, rule: ".m.rule.reaction"},
		{name: "edit", event: `{"type":"m.room.message","sender":"@bob:other.test","content":{"body":"* hi","m.relates_to":{"rel_type":"m.replace","event_id":"$x"}}}`,
			members: 2, rule: ".m.rule.suppress_edits"},
		{name: "call", event: `{"type":"m.call.invite","sender":"@bob:other.test","content":{}}`,
			members: 2, rule: ".m.rule.call", notify: true, sound: "ring"},
		{name: "other state", event: `{"type":"m.room.topic","state_key":"","sender":"@bob:other.test","content":{"topic":"t"}}`,
			members: 3, rule: ""},
		{name: "body not a string", event: `{"type":"m.room.message","sender":"@bob:other.test","content":{"body":42}}`,
			members: 3, rule: ".m.rule.message", notify: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Evaluate(defaults, Event{JSON: ev(t, c.event), UserDisplayName: c.display, MemberCount: c.members,
				SenderPowerLevel: c.power, NotificationLevels: c.levels})
			if got.RuleID != c.rule || got.Notify != c.notify || got.Highlight() != c.highlight || got.Tweaks["sound"] != c.sound {
				t.Fatalf("got rule %q notify %v highlight %v tweaks %v; want %q %v %v sound %v",
					got.RuleID, got.Notify, got.Highlight(), got.Tweaks, c.rule, c.notify, c.highlight, c.sound)
			}
		})
	}
}

// TestEvaluateUserRules: the user's rules, switches and the conditions'
// finer points.
func TestEvaluateUserRules(t *testing.T) {
	msg := `{"type":"m.room.message","room_id":"!r:local.test","sender":"@bob:other.test","content":{"msgtype":"m.text","body":"Cake is ready"}}`
	base := func() Ruleset { return merge(me, nil) }

	// The master rule silences everything.
	rs := base()
	rs.Override[0].Enabled = true
	if got := Evaluate(rs, Event{JSON: ev(t, msg), MemberCount: 2}); got.RuleID != ".m.rule.master" || got.Notify {
		t.Fatalf("master: %+v", got)
	}
	// A room rule muting one room, a sender rule, a content rule.
	rs = base()
	rs.Room = []Rule{{RuleID: "!r:local.test", Enabled: true, Actions: []json.RawMessage{json.RawMessage(`"dont_notify"`)}}}
	if got := Evaluate(rs, Event{JSON: ev(t, msg), MemberCount: 2}); got.RuleID != "!r:local.test" || got.Notify {
		t.Fatalf("room rule: %+v", got)
	}
	rs.Room[0].Enabled = false
	if got := Evaluate(rs, Event{JSON: ev(t, msg), MemberCount: 2}); got.RuleID != ".m.rule.room_one_to_one" {
		t.Fatalf("disabled room rule: %+v", got)
	}
	rs = base()
	rs.Sender = []Rule{{RuleID: "@bob:other.test", Enabled: true, Actions: []json.RawMessage{json.RawMessage(`"notify"`),
		json.RawMessage(`{"set_tweak":"sound","value":"bob.wav"}`)}}}
	if got := Evaluate(rs, Event{JSON: ev(t, msg), MemberCount: 3}); got.RuleID != "@bob:other.test" || got.Tweaks["sound"] != "bob.wav" {
		t.Fatalf("sender rule: %+v", got)
	}
	pattern := "c?ke*"
	rs = base()
	rs.Content = append([]Rule{{RuleID: "cake", Enabled: true, Pattern: &pattern,
		Actions: []json.RawMessage{json.RawMessage(`"notify"`), json.RawMessage(`{"set_tweak":"highlight"}`)}}}, rs.Content...)
	if got := Evaluate(rs, Event{JSON: ev(t, msg), MemberCount: 3}); got.RuleID != "cake" || !got.Highlight() {
		t.Fatalf("content rule: %+v", got)
	}

	cond := func(c string) Ruleset {
		rs := base()
		rs.Override = append([]Rule{{RuleID: "mine", Enabled: true, Conditions: []json.RawMessage{json.RawMessage(c)},
			Actions: []json.RawMessage{json.RawMessage(`"notify"`)}}}, rs.Override...)
		return rs
	}
	for _, c := range []struct {
		cond, event string
		members     int
		want        bool
	}{
		// event_match on other keys matches the whole value.
		{`{"kind":"event_match","key":"type","pattern":"m.room.*"}`, msg, 3, true},
		{`{"kind":"event_match","key":"type","pattern":"m.room"}`, msg, 3, false},
		{`{"kind":"event_match","key":"content.msgtype","pattern":"M.TEXT"}`, msg, 3, true},
		{`{"kind":"event_match","key":"content.nothing","pattern":"*"}`, msg, 3, false},
		{`{"kind":"event_match","key":"type"}`, msg, 3, false},
		// content.body is matched by words.
		{`{"kind":"event_match","key":"content.body","pattern":"ready"}`, msg, 3, true},
		{`{"kind":"event_match","key":"content.body","pattern":"read"}`, msg, 3, false},
		// Escaped dots name a key with a dot.
		{`{"kind":"event_property_is","key":"content.m\\.x","value":5}`, `{"type":"t","content":{"m.x":5}}`, 3, true},
		{`{"kind":"event_property_is","key":"content.m\\.x","value":"5"}`, `{"type":"t","content":{"m.x":5}}`, 3, false},
		{`{"kind":"event_property_is","key":"content.f","value":null}`, `{"type":"t","content":{"f":null}}`, 3, true},
		{`{"kind":"event_property_is","key":"content.f","value":false}`, `{"type":"t","content":{"f":false}}`, 3, true},
		{`{"kind":"event_property_contains","key":"content.tags","value":"b"}`, `{"type":"t","content":{"tags":["a","b"]}}`, 3, true},
		{`{"kind":"event_property_contains","key":"content.tags","value":"c"}`, `{"type":"t","content":{"tags":["a","b"]}}`, 3, false},
		{`{"kind":"event_property_contains","key":"content.tags","value":"a"}`, `{"type":"t","content":{"tags":"a"}}`, 3, false},
		{`{"kind":"room_member_count","is":"<3"}`, msg, 2, true},
		{`{"kind":"room_member_count","is":"<3"}`, msg, 3, false},
		{`{"kind":"room_member_count","is":">=3"}`, msg, 3, true},
		{`{"kind":"room_member_count","is":"==4"}`, msg, 4, true},
		{`{"kind":"room_member_count","is":"x"}`, msg, 4, false},
		{`{"kind":"a_kind_from_the_future"}`, msg, 3, false},
	} {
		got := Evaluate(cond(c.cond), Event{JSON: ev(t, c.event), MemberCount: c.members})
		if (got.RuleID == "mine") != c.want {
			t.Errorf("%s on %s (%d members): matched %q", c.cond, c.event, c.members, got.RuleID)
		}
	}
}
