package pushrules

import (
	"encoding/json"
	"strings"
)

// The server-default rules every user has, in the spec's order of
// priority within each kind. A user may enable, disable and change the
// actions of these, never delete them or add rules whose ID starts with
// a dot. Where the spec's current list and Synapse's differ (the
// highlight:false tweak on notifying underride rules), Synapse's is used,
// as clients are tested against it.

// Actions the default rules use.
var (
	notify         = json.RawMessage(`"notify"`)
	soundDefault   = json.RawMessage(`{"set_tweak":"sound","value":"default"}`)
	soundRing      = json.RawMessage(`{"set_tweak":"sound","value":"ring"}`)
	highlight      = json.RawMessage(`{"set_tweak":"highlight"}`)
	highlightFalse = json.RawMessage(`{"set_tweak":"highlight","value":false}`)
)

func eventMatch(key, pattern string) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"kind": "event_match", "key": key, "pattern": pattern})
	return b
}

func cond(s string) json.RawMessage { return json.RawMessage(s) }

func defaultRule(id string, enabled bool, conditions []json.RawMessage, actions ...json.RawMessage) Rule {
	if conditions == nil {
		conditions = []json.RawMessage{}
	}
	if actions == nil {
		actions = []json.RawMessage{}
	}
	return Rule{RuleID: id, Default: true, Enabled: enabled, Conditions: conditions, Actions: actions}
}

// prependOverride are the default override rules that come before the
// user's own (the master switch); the rest of the defaults of each kind
// come after the user's rules of that kind, as Synapse orders them.
func prependOverride() []Rule {
	return []Rule{defaultRule(".m.rule.master", false, nil)}
}

func appendOverride(userID string) []Rule {
	userIDJSON, _ := json.Marshal(userID)
	return []Rule{
		defaultRule(".m.rule.suppress_notices", true,
			[]json.RawMessage{eventMatch("content.msgtype", "m.notice")}),
		defaultRule(".m.rule.invite_for_me", true,
			[]json.RawMessage{
				eventMatch("type", "m.room.member"),
				eventMatch("content.membership", "invite"),
				eventMatch("state_key", userID),
			}, notify, soundDefault, highlightFalse),
		defaultRule(".m.rule.member_event", true,
			[]json.RawMessage{eventMatch("type", "m.room.member")}),
		defaultRule(".m.rule.is_user_mention", true,
			[]json.RawMessage{cond(`{"kind":"event_property_contains","key":"content.m\\.mentions.user_ids","value":` + string(userIDJSON) + `}`)},
			notify, soundDefault, highlight),
		defaultRule(".m.rule.contains_display_name", true,
			[]json.RawMessage{cond(`{"kind":"contains_display_name"}`)},
			notify, soundDefault, highlight),
		defaultRule(".m.rule.is_room_mention", true,
			[]json.RawMessage{
				cond(`{"kind":"event_property_is","key":"content.m\\.mentions.room","value":true}`),
				cond(`{"kind":"sender_notification_permission","key":"room"}`),
			}, notify, highlight),
		defaultRule(".m.rule.roomnotif", true,
			[]json.RawMessage{
				cond(`{"kind":"sender_notification_permission","key":"room"}`),
				eventMatch("content.body", "@room"),
			}, notify, highlight),
		defaultRule(".m.rule.tombstone", true,
			[]json.RawMessage{eventMatch("type", "m.room.tombstone"), eventMatch("state_key", "")},
			notify, highlight),
		defaultRule(".m.rule.reaction", true,
			[]json.RawMessage{eventMatch("type", "m.reaction")}),
		defaultRule(".m.rule.server_acl", true,
			[]json.RawMessage{eventMatch("type", "m.room.server_acl"), eventMatch("state_key", "")}),
		defaultRule(".m.rule.suppress_edits", true,
			[]json.RawMessage{cond(`{"kind":"event_property_is","key":"content.m\\.relates_to.rel_type","value":"m.replace"}`)}),
	}
}

func appendContent(userID string) []Rule {
	localpart := strings.TrimPrefix(userID, "@")
	if i := strings.IndexByte(localpart, ':'); i >= 0 {
		localpart = localpart[:i]
	}
	pattern := localpart
	return []Rule{{
		RuleID: ".m.rule.contains_user_name", Default: true, Enabled: true, Pattern: &pattern,
		Actions: []json.RawMessage{notify, soundDefault, highlight},
	}}
}

func appendUnderride() []Rule {
	return []Rule{
		defaultRule(".m.rule.call", true,
			[]json.RawMessage{eventMatch("type", "m.call.invite")},
			notify, soundRing, highlightFalse),
		defaultRule(".m.rule.encrypted_room_one_to_one", true,
			[]json.RawMessage{cond(`{"kind":"room_member_count","is":"2"}`), eventMatch("type", "m.room.encrypted")},
			notify, soundDefault, highlightFalse),
		defaultRule(".m.rule.room_one_to_one", true,
			[]json.RawMessage{cond(`{"kind":"room_member_count","is":"2"}`), eventMatch("type", "m.room.message")},
			notify, soundDefault, highlightFalse),
		defaultRule(".m.rule.message", true,
			[]json.RawMessage{eventMatch("type", "m.room.message")},
			notify, highlightFalse),
		defaultRule(".m.rule.encrypted", true,
			[]json.RawMessage{eventMatch("type", "m.room.encrypted")},
			notify, highlightFalse),
	}
}

// defaults are a user's server-default rules by kind, split into those
// before the user's own rules and those after.
type defaults struct {
	before, after map[string][]Rule
}

func defaultsFor(userID string) defaults {
	return defaults{
		before: map[string][]Rule{KindOverride: prependOverride()},
		after: map[string][]Rule{
			KindOverride:  appendOverride(userID),
			KindContent:   appendContent(userID),
			KindUnderride: appendUnderride(),
		},
	}
}
