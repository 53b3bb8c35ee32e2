package authrules

import (
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

func TestAuthEventsNeeded(t *testing.T) {
	r := standardRoom(t, spec.Restricted)
	join := r.member(stranger, stranger, spec.Join, map[string]any{"join_authorised_via_users_server": mod})
	needed := AuthEventsNeeded([]gomatrixserverlib.PDU{join})
	if needed.Create {
		t.Fatal("the create event is selected")
	}
	want := map[gomatrixserverlib.StateKeyTuple]bool{
		tuple(spec.MRoomPowerLevels, ""): true, tuple(spec.MRoomJoinRules, ""): true,
		tuple(spec.MRoomMember, stranger): true, tuple(spec.MRoomMember, mod): true,
	}
	got := needed.Tuples()
	if len(got) != len(want) {
		t.Fatalf("selection %v, want %v", got, want)
	}
	for _, tu := range got {
		if !want[tu] {
			t.Fatalf("selection %v, want %v", got, want)
		}
	}
	proto := &gomatrixserverlib.ProtoEvent{SenderID: user, Type: "m.room.message", Content: []byte(`{}`)}
	if n, err := AuthEventsNeededForProto(proto); err != nil || n.Create || !n.PowerLevels || len(n.Member) != 1 {
		t.Fatalf("selection for a message being built: %+v %v", n, err)
	}
	// The events the test rooms build list no create event.
	for _, id := range join.AuthEventIDs() {
		if id == r.create.EventID() {
			t.Fatal("a built event lists the create event")
		}
	}
}

// Rules 3.1, 3.2 and 3.4 on a list of auth events.
func TestCheckAuthEvents(t *testing.T) {
	a, b := standardRoom(t, spec.Public), standardRoom(t, spec.Public)
	msg := a.message(user)
	pl, member := a.state[tuple(spec.MRoomPowerLevels, "")], a.state[tuple(spec.MRoomMember, user)]
	earlierMember := a.member(user, user, spec.Join, map[string]any{"displayname": "Bob"})

	for _, tc := range []struct {
		name   string
		events []gomatrixserverlib.PDU
		rule   string
	}{
		{"the selection", []gomatrixserverlib.PDU{pl, member}, ""},
		{"part of the selection", []gomatrixserverlib.PDU{member}, ""},
		{"two of one state key", []gomatrixserverlib.PDU{pl, member, earlierMember}, "3.1"},
		{"the create event", []gomatrixserverlib.PDU{a.create, pl, member}, "3.2"},
		{"an event not selected", []gomatrixserverlib.PDU{pl, member, a.state[tuple(spec.MRoomJoinRules, "")]}, "3.2"},
		{"another user's membership", []gomatrixserverlib.PDU{pl, a.state[tuple(spec.MRoomMember, mod)]}, "3.2"},
		{"power levels of another room", []gomatrixserverlib.PDU{b.state[tuple(spec.MRoomPowerLevels, "")], member}, "3.4"},
		{"a message", []gomatrixserverlib.PDU{pl, member, a.message(mod)}, "3.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectRule(t, CheckAuthEvents(msg, tc.events), tc.rule)
		})
	}
}
