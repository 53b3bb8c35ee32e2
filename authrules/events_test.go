package authrules

import (
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// Rules 6 to 9, for events other than memberships and power levels.
func TestEventRules(t *testing.T) {
	topic := func(sender string) func(r *room) gomatrixserverlib.PDU {
		return func(r *room) gomatrixserverlib.PDU {
			return r.state_(sender, "m.room.topic", "", map[string]any{"topic": "t"})
		}
	}
	msg := func(sender string) func(r *room) gomatrixserverlib.PDU {
		return func(r *room) gomatrixserverlib.PDU { return r.message(sender) }
	}
	typed := func(sender, typ string, stateKey *string) func(r *room) gomatrixserverlib.PDU {
		return func(r *room) gomatrixserverlib.PDU { return r.event(sender, typ, stateKey, map[string]any{"x": 1}) }
	}
	tpiEvent := func(sender string) func(r *room) gomatrixserverlib.PDU {
		return func(r *room) gomatrixserverlib.PDU {
			return r.state_(sender, spec.MRoomThirdPartyInvite, "tok", map[string]any{"display_name": "x", "public_key": "AAAA"})
		}
	}
	base := map[string]int{admin: 100, mod: 50}
	runMemberCases(t, []memberCase{
		// Rule 6.
		{name: "message by a member", event: msg(user)},
		{name: "message by someone never in the room", event: msg(stranger), rule: "6"},
		{name: "message by someone who left", setup: seq([3]string{user, user, spec.Leave}), event: msg(user), rule: "6"},
		{name: "message by someone invited", setup: seq([3]string{user, stranger, spec.Invite}), event: msg(stranger), rule: "6"},
		{name: "message by someone banned", setup: seq([3]string{mod, user, spec.Ban}), event: msg(user), rule: "6"},
		{name: "message by a creator who left", setup: seq([3]string{coCreate, coCreate, spec.Leave}), event: msg(coCreate), rule: "6"},
		// Rule 7: the invite level decides, not the event's own level.
		{name: "third-party invite at the invite level", event: tpiEvent(user)},
		{name: "third-party invite below the invite level", setup: setPL(map[string]any{"users": base, "invite": 50}), event: tpiEvent(user), rule: "7"},
		{name: "third-party invite above its event level", setup: setPL(map[string]any{"users": base, "events": map[string]int{spec.MRoomThirdPartyInvite: 100}}), event: tpiEvent(user)},
		{name: "third-party invite by someone not joined", event: tpiEvent(stranger), rule: "6"},
		// Rule 8.
		{name: "message below events_default", setup: setPL(map[string]any{"users": base, "events_default": 10}), event: msg(user), rule: "8"},
		{name: "message at events_default", setup: setPL(map[string]any{"users": base, "events_default": 50}), event: msg(mod)},
		{name: "message type above the sender", setup: setPL(map[string]any{"users": base, "events": map[string]int{"m.room.message": 60}}), event: msg(mod), rule: "8"},
		{name: "state below state_default", event: topic(user), rule: "8"},
		{name: "state at state_default", event: topic(mod)},
		{name: "state type above the sender", setup: setPL(map[string]any{"users": base, "events": map[string]int{"m.room.topic": 100}}), event: topic(mod), rule: "8"},
		{name: "tombstone by an admin", event: typed(admin, "m.room.tombstone", ptr("")), rule: "8"},
		// Creators send anything, whatever the level.
		{name: "tombstone by the creator", event: typed(creator, "m.room.tombstone", ptr(""))},
		{name: "state at the maximum level by an additional creator", setup: setPL(map[string]any{"users": base, "state_default": 9007199254740991}), event: topic(coCreate)},
		{name: "state at the maximum level by a user at the maximum", setup: setPL(map[string]any{"users": map[string]int{admin: 9007199254740991}, "state_default": 9007199254740991}), event: topic(admin)},
		// Rule 9.
		{name: "state keyed by the sender's ID", event: typed(mod, "m.custom", ptr(mod))},
		{name: "state keyed by another user's ID", event: typed(mod, "m.custom", ptr(user)), rule: "9"},
		{name: "a creator sets state keyed by another user", event: typed(creator, "m.custom", ptr(user)), rule: "9"},
		{name: "state key with @ not a user ID", event: typed(mod, "m.custom", ptr("@notes")), rule: "9"},
		{name: "state key without @", event: typed(mod, "m.custom", ptr("notes"+user))},
	})
}

// Without a power levels event, creators may do anything, others send
// messages only (state needs 50).
func TestNoPowerLevelsEvent(t *testing.T) {
	r := newRoom(t, nil)
	r.mustApply(r.state_(creator, spec.MRoomJoinRules, "", map[string]any{"join_rule": spec.Public}))
	r.mustApply(r.member(user, user, spec.Join, nil))
	expectRule(t, r.allowed(r.message(user)), "")
	expectRule(t, r.allowed(r.state_(user, "m.room.topic", "", map[string]any{"topic": "t"})), "8")
	expectRule(t, r.allowed(r.state_(creator, "m.room.topic", "", map[string]any{"topic": "t"})), "")
	expectRule(t, r.allowed(r.member(user, creator, spec.Leave, nil)), "5.5.5")
	expectRule(t, r.allowed(r.member(creator, user, spec.Ban, nil)), "")
}
