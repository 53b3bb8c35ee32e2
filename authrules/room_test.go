package authrules

import (
	"strings"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/roomversion"
)

// Rule 2: the room is the one its create event names.
func TestRoomOfCreateEvent(t *testing.T) {
	a, b := standardRoom(t, spec.Public), standardRoom(t, spec.Public)
	if id := a.roomID.String(); id != roomversion.RoomIDOfCreate(a.create.EventID()) || strings.Contains(id, ":") {
		t.Fatalf("room ID %s of create event %s", id, a.create.EventID())
	}

	expectRule(t, Allowed(a.message(user), a.mapProvider(), userIDForSender), "")

	// The create event of another room, e.g. sent by a server mixing rooms.
	p := a.mapProvider()
	p[tuple(spec.MRoomCreate, "")] = b.create
	expectRule(t, Allowed(a.message(user), p, userIDForSender), "2")

	// No create event at all.
	p = a.mapProvider()
	delete(p, tuple(spec.MRoomCreate, ""))
	expectRule(t, Allowed(a.message(user), p, userIDForSender), "2")

	// Something else given as the create event.
	p = a.mapProvider()
	p[tuple(spec.MRoomCreate, "")] = a.state[tuple(spec.MRoomJoinRules, "")]
	expectRule(t, Allowed(a.message(user), p, userIDForSender), "2")
}

// Rule 3.2 (MSC4291): auth_events never list the create event.
func TestAuthEventsListingCreate(t *testing.T) {
	r := standardRoom(t, spec.Public)
	ev := r.eventWith(user, "m.room.message", nil, map[string]any{"body": "hi"}, func(p *gomatrixserverlib.ProtoEvent) {
		p.AuthEvents = append(p.AuthEvents.([]string), r.create.EventID())
	})
	expectRule(t, r.allowed(ev), "3.2")
	expectRule(t, r.allowed(r.message(user)), "")
}

// Rule 3.4 (MSC4307): auth events are of the event's room.
func TestAuthEventsOfAnotherRoom(t *testing.T) {
	a, b := standardRoom(t, spec.Public), standardRoom(t, spec.Public)

	// A provider holding events of two rooms.
	mixed := a.provider()
	if err := mixed.AddEvent(b.state[tuple(spec.MRoomMember, admin)]); err != nil {
		t.Fatal(err)
	}
	expectRule(t, Allowed(a.message(user), mixed, userIDForSender), "3.4")

	// A provider that does not look at rooms, giving the sender's membership
	// from another room: the user left a, and is joined in b.
	a.mustApply(a.member(user, user, spec.Leave, nil))
	p := a.mapProvider()
	expectRule(t, Allowed(a.message(user), p, userIDForSender), "6")
	p[tuple(spec.MRoomMember, user)] = b.state[tuple(spec.MRoomMember, user)]
	expectRule(t, Allowed(a.message(user), p, userIDForSender), "3.4")

	// Power levels of another room, where mona may send state.
	b.mustApply(b.state_(creator, spec.MRoomPowerLevels, "", map[string]any{"users": map[string]int{mod: 50}, "state_default": 10}))
	p = a.mapProvider()
	topic := a.state_(mod, "m.room.topic", "", map[string]any{"topic": "x"})
	expectRule(t, Allowed(topic, p, userIDForSender), "")
	p[tuple(spec.MRoomPowerLevels, "")] = b.state[tuple(spec.MRoomPowerLevels, "")]
	expectRule(t, Allowed(topic, p, userIDForSender), "3.4")

	// Join rules of another room.
	a.mustApply(a.state_(creator, spec.MRoomJoinRules, "", map[string]any{"join_rule": spec.Invite}))
	p = a.mapProvider()
	join := a.member(stranger, stranger, spec.Join, nil)
	expectRule(t, Allowed(join, p, userIDForSender), "5.3.4")
	p[tuple(spec.MRoomJoinRules, "")] = b.state[tuple(spec.MRoomJoinRules, "")]
	expectRule(t, Allowed(join, p, userIDForSender), "3.4")
}

// Rule 4: m.federate.
func TestFederate(t *testing.T) {
	for _, tc := range []struct {
		name     string
		federate any
		joiner   string
		rule     string
	}{
		{"not federating, creator's server", false, "@dave:creator.example", ""},
		{"not federating, other server", false, "@bob:other.example", "4"},
		{"federating", true, "@bob:other.example", ""},
		{"m.federate not a boolean", "false", "@bob:other.example", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRoom(t, map[string]any{"room_version": "12", "m.federate": tc.federate})
			r.mustApply(r.state_(creator, spec.MRoomJoinRules, "", map[string]any{"join_rule": spec.Public}))
			expectRule(t, r.allowed(r.member(tc.joiner, tc.joiner, spec.Join, nil)), tc.rule)
		})
	}
}
