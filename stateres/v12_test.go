package stateres

import (
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// In a room version 12 room the creators (the create event's sender and
// its additional_creators) are above every power level, so their power
// events are replayed before those of the room's admins. Bob, a creator
// the power levels do not list, and Charlie, an admin at 100, change the
// power levels concurrently: Bob's change is replayed first and Charlie's,
// which it allows, is applied on top. The create event is in no event's
// auth_events and has to be supplied to every auth check.
func TestV12CreatorsArePoweredAboveAdmins(t *testing.T) {
	r := newTestRoomV12(t)
	r.add(state("CREATE", alice, spec.MRoomCreate, map[string]any{"room_version": "12", "additional_creators": []string{bob}}))
	r.add(member("IMA", alice, alice, spec.Join), "CREATE")
	r.add(state("IPOWER", alice, spec.MRoomPowerLevels, pl(map[string]any{charlie: 100})), "IMA")
	r.add(state("IJR", alice, spec.MRoomJoinRules, map[string]any{"join_rule": spec.Public}), "IPOWER")
	r.add(member("IMB", bob, bob, spec.Join), "IJR")
	r.add(member("IMC", charlie, charlie, spec.Join), "IMB")
	r.add(member("IMZ", zara, zara, spec.Join), "IMC")
	r.add(state("PB", bob, spec.MRoomPowerLevels, pl(map[string]any{charlie: 100, zara: 10})), "IMZ")
	r.add(state("PC", charlie, spec.MRoomPowerLevels, pl(map[string]any{charlie: 100, evelyn: 50})), "IMZ")
	end := r.add(message("END", zara), "PB", "PC")

	if end.Version() != "12" || r.byName["IMA"].RoomID().String() != "!"+r.id("CREATE")[1:] {
		t.Fatalf("not a version 12 room: version %s, room %s", end.Version(), r.byName["IMA"].RoomID().String())
	}
	for _, ev := range r.all[1:] {
		for _, id := range ev.AuthEventIDs() {
			if id == r.id("CREATE") {
				t.Fatalf("%s lists the create event in auth_events", r.names[ev.EventID()])
			}
		}
	}

	got := stateList(r.stateAfter["END"])
	if p := r.nameAt(got, spec.MRoomPowerLevels, ""); p != "PC" {
		t.Fatalf("power levels %q, want PC; state:\n%s", p, r.describe(got))
	}
	if len(got) != 7 {
		t.Fatalf("%d state events, want 7:\n%s", len(got), r.describe(got))
	}
}

// Problem A of MSC4297 in a version 12 room: Alice, who set the join rules
// twice and left, is a creator here, and her join rules are still replayed
// from an empty state on their own auth events.
func TestV12StartsFromEmptyState(t *testing.T) {
	r := newTestRoomV12(t)
	r.add(state("CREATE", alice, spec.MRoomCreate, map[string]any{"room_version": "12"}))
	r.add(member("IMA", alice, alice, spec.Join), "CREATE")
	r.add(state("IPOWER", alice, spec.MRoomPowerLevels, pl(map[string]any{})), "IMA")
	r.add(state("JR1", alice, spec.MRoomJoinRules, map[string]any{"join_rule": spec.Public}), "IPOWER")
	r.add(member("IMB", bob, bob, spec.Join), "JR1")
	r.add(state("JR2", alice, spec.MRoomJoinRules, map[string]any{"join_rule": spec.Invite}), "IMB")
	r.add(member("ALEAVE", alice, alice, spec.Leave), "JR2")
	sets := [][]gomatrixserverlib.PDU{
		r.events("CREATE", "ALEAVE", "IPOWER", "JR2", "IMB"),
		r.events("CREATE", "ALEAVE", "IPOWER", "JR1", "IMB"),
	}
	got := r.resolveV21(sets, noneRejected)
	if jr := r.nameAt(got, spec.MRoomJoinRules, ""); jr != "JR2" {
		t.Fatalf("join rules %q, want JR2; state:\n%s", jr, r.describe(got))
	}
}

// The room's create event is the one the room ID names, even when the state
// sets disagree about it and the auth chain holds another room's create
// event; an event of another room in a state set is an error.
func TestV12CreateEventOfTheRoom(t *testing.T) {
	other := newTestRoomV12(t)
	other.add(state("CREATE", zara, spec.MRoomCreate, map[string]any{"room_version": "12"}))
	otherIMZ := other.add(member("IMZ", zara, zara, spec.Join), "CREATE")

	r := newTestRoomV12(t)
	r.add(state("CREATE", alice, spec.MRoomCreate, map[string]any{"room_version": "12"}))
	r.add(member("IMA", alice, alice, spec.Join), "CREATE")
	r.add(state("IPOWER", alice, spec.MRoomPowerLevels, pl(map[string]any{})), "IMA")
	sets := [][]gomatrixserverlib.PDU{
		r.events("CREATE", "IMA", "IPOWER"),
		r.events("IMA", "IPOWER"),
	}
	authChain := append(append([]gomatrixserverlib.PDU{}, r.all...), other.all...)
	got, err := ResolveV21(sets, authChain, allowedV12, noneRejected)
	if err != nil {
		t.Fatal(err)
	}
	if c := r.nameAt(got, spec.MRoomCreate, ""); c != "CREATE" || len(got) != 3 {
		t.Fatalf("create %q, want the room's; state:\n%s", c, r.describe(got))
	}

	sets[1] = append(sets[1], otherIMZ)
	if _, err := ResolveV21(sets, authChain, allowedV12, noneRejected); err == nil {
		t.Fatal("an event of another room in a state set: no error")
	}
}
