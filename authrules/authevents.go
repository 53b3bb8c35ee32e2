package authrules

import (
	"fmt"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// AuthEventsNeeded returns the state that goes in the auth_events of v12
// events: the selection of room version 11 without the create event, which
// the room ID stands for. To authorise the events, the provider given to
// Allowed must still hold the create event (StateNeeded.Tuples() omits it:
// load it besides).
func AuthEventsNeeded(events []gomatrixserverlib.PDU) gomatrixserverlib.StateNeeded {
	needed := gomatrixserverlib.StateNeededForAuth(events)
	needed.Create = false
	return needed
}

// AuthEventsNeededForProto is AuthEventsNeeded for an event being built.
func AuthEventsNeededForProto(proto *gomatrixserverlib.ProtoEvent) (gomatrixserverlib.StateNeeded, error) {
	needed, err := gomatrixserverlib.StateNeededForProtoEvent(proto)
	needed.Create = false
	return needed, err
}

// CheckAuthEvents checks a v12 event's auth events (the events its
// auth_events list names, as the caller has them) against rules 3.1, 3.2
// and 3.4: no two for one (type, state_key), only the selection of
// AuthEventsNeeded (so never the create event), all of the event's room.
// Rule 3.3 (none of them rejected) is the caller's, who knows which are.
func CheckAuthEvents(ev gomatrixserverlib.PDU, authEvents []gomatrixserverlib.PDU) error {
	allowed := map[gomatrixserverlib.StateKeyTuple]bool{}
	for _, t := range AuthEventsNeeded([]gomatrixserverlib.PDU{ev}).Tuples() {
		allowed[t] = true
	}
	roomID := ev.RoomID().String()
	seen := map[gomatrixserverlib.StateKeyTuple]string{}
	for _, a := range authEvents {
		if a.StateKey() == nil {
			return notAllowed("3.2", "auth event %s is not a state event", a.EventID())
		}
		t := gomatrixserverlib.StateKeyTuple{EventType: a.Type(), StateKey: *a.StateKey()}
		// Rule 3.1.
		if other, ok := seen[t]; ok {
			return notAllowed("3.1", "auth events %s and %s are both %s", other, a.EventID(), describe(t))
		}
		seen[t] = a.EventID()
		// Rule 3.2.
		if !allowed[t] {
			return notAllowed("3.2", "auth event %s (%s) is not one the event's auth events may be", a.EventID(), describe(t))
		}
		// Rule 3.4.
		if a.Type() != spec.MRoomCreate && a.RoomID().String() != roomID {
			return notAllowed("3.4", "auth event %s is of room %s, not %s", a.EventID(), a.RoomID().String(), roomID)
		}
	}
	return nil
}

func describe(t gomatrixserverlib.StateKeyTuple) string {
	return fmt.Sprintf("(%s, %q)", t.EventType, t.StateKey)
}
