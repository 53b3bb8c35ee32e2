// Package authrules holds the authorization rules of rooms.
//
// Room versions 1 to 11 are authorised by gomatrixserverlib.Allowed,
// unchanged. Room version 12 is room version 11 with:
//
//   - MSC4289, privileged creators: the sender of the create event and the
//     users of its content.additional_creators have an infinite power
//     level, and may not be listed in the power levels event;
//   - MSC4291, room IDs as hashes: the room ID is the create event's ID with
//     the sigil "!", the create event has no room_id and is not listed in
//     auth_events;
//   - MSC4307: every auth event is of the event's own room.
//
// The rule numbers in comments and errors are those of the room version 12
// authorization rules of the specification.
//
// What the caller checks, and what these rules check:
//
//   - Rule 2 wants the create event to be accepted (not rejected); the caller
//     gives only accepted events to the provider. Allowed checks that the
//     provider's create event is the one the event's room ID names.
//   - Rules 3.1 to 3.3 (duplicate, unselected and rejected auth events) look at
//     the event's auth_events list, which the provider does not give: the
//     caller checks them, CheckAuthEvents does 3.1, 3.2 and 3.4 for a list of
//     events. Allowed rejects an auth_events list that names the create event
//     and checks the room of every event the provider gives it (3.4); the
//     caller checks that the listed auth event IDs are events of the event's
//     room.
//   - Rule 5.2 (an event with join_authorised_via_users_server must be signed
//     by that user's server) is a signature check, done with the other
//     signature checks of the event before authorization.
package authrules

import (
	"fmt"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// RoomVersion12 is the room version whose rules this package implements.
const RoomVersion12 gomatrixserverlib.RoomVersion = "12"

// Allowed checks ev against the authorization rules of its room version, given the auth events
// in provider. Versions 1-11: gomatrixserverlib.Allowed unchanged. Version "12": our rules.
//
// For version 12 the provider must hold the room's create event (provider.Create()) even
// though the event's auth_events do not list it. A refusal is a *gomatrixserverlib.NotAllowed
// whose message names the rule that failed.
func Allowed(ev gomatrixserverlib.PDU, provider gomatrixserverlib.AuthEventProvider, userIDForSender spec.UserIDForSender) error {
	if ev.Version() != RoomVersion12 {
		return gomatrixserverlib.Allowed(ev, provider, userIDForSender)
	}
	return allowedV12(ev, provider, userIDForSender)
}

// notAllowed is the error of a failed rule: rule is its number, e.g. "5.3.2".
func notAllowed(rule, format string, args ...any) error {
	return &gomatrixserverlib.NotAllowed{Message: "rule " + rule + ": " + fmt.Sprintf(format, args...)}
}

// allowedV12 applies the room version 12 rules in their order.
func allowedV12(ev gomatrixserverlib.PDU, provider gomatrixserverlib.AuthEventProvider, userIDForSender spec.UserIDForSender) error {
	// Rule 1: the create event is judged on its own.
	if ev.Type() == spec.MRoomCreate {
		return createAllowed(ev)
	}

	// Rules 2 and 3 (what can be checked here): the room is the create
	// event's, and the auth events are of that room.
	st, err := loadState(ev, provider, userIDForSender)
	if err != nil {
		return err
	}

	// Rule 4: m.federate.
	if err := st.federateAllowed(); err != nil {
		return err
	}

	// Rule 5: membership events have rules of their own.
	if ev.Type() == spec.MRoomMember {
		return st.memberAllowed()
	}

	// Rule 6: the sender must be joined.
	senderMembership, err := st.membership(string(ev.SenderID()))
	if err != nil {
		return err
	}
	if senderMembership != spec.Join {
		return notAllowed("6", "sender %s is not joined to the room (membership %q)", ev.SenderID(), senderMembership)
	}

	senderLevel := st.userLevel(string(ev.SenderID()))

	// Rule 7: third-party invites need the invite level, and nothing else.
	if ev.Type() == spec.MRoomThirdPartyInvite {
		if invite := st.levels.invite(); !senderLevel.atLeast(invite) {
			return notAllowed("7", "sender %s has power level %s, inviting needs %d", ev.SenderID(), senderLevel, invite)
		}
		return nil
	}

	// Rule 8: the level required to send the event type.
	required := st.levels.eventLevel(ev.Type(), ev.StateKey() != nil)
	if !senderLevel.atLeast(required) {
		return notAllowed("8", "sender %s has power level %s, sending %s needs %d", ev.SenderID(), senderLevel, ev.Type(), required)
	}

	// Rule 9: state keys that are user IDs belong to that user.
	if sk := ev.StateKey(); sk != nil && len(*sk) > 0 && (*sk)[0] == '@' && *sk != string(ev.SenderID()) {
		return notAllowed("9", "sender %s may not set state with the state key %q of another user", ev.SenderID(), *sk)
	}

	// Rule 10: power levels changes.
	if ev.Type() == spec.MRoomPowerLevels {
		return st.powerLevelsAllowed(senderLevel)
	}

	// Rule 11: otherwise, allow.
	return nil
}
