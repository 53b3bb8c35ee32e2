package stateres

import (
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// problemARoom builds MSC4297's first example: Alice sets the join rules
// twice (JR1, then JR2) and later leaves. One fork's state is correct; the
// other, learnt through partial synchronisation, still holds JR1 although
// it agrees that Alice left.
func problemARoom(t *testing.T) (*testRoom, [][]gomatrixserverlib.PDU) {
	r := newTestRoom(t)
	r.add(state("CREATE", alice, spec.MRoomCreate, map[string]any{"room_version": "11"}))
	r.add(member("IMA", alice, alice, spec.Join), "CREATE")
	r.add(state("IPOWER", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100})), "IMA")
	r.add(state("JR1", alice, spec.MRoomJoinRules, map[string]any{"join_rule": spec.Public}), "IPOWER")
	r.add(member("IMB", bob, bob, spec.Join), "JR1")
	r.add(state("JR2", alice, spec.MRoomJoinRules, map[string]any{"join_rule": spec.Invite}), "IMB")
	r.add(member("ALEAVE", alice, alice, spec.Leave), "JR2")
	correct := r.events("CREATE", "ALEAVE", "IPOWER", "JR2", "IMB")
	outdated := r.events("CREATE", "ALEAVE", "IPOWER", "JR1", "IMB")
	return r, [][]gomatrixserverlib.PDU{correct, outdated}
}

// Replaying the conflicted join rules on top of the unconflicted state
// (where Alice has left) makes both fail and the room loses its join rules;
// v2.1 replays them from an empty state, on their own auth events.
func TestV21StartsFromEmptyState(t *testing.T) {
	r, sets := problemARoom(t)

	got := r.resolveV21(sets, noneRejected)
	if jr := r.nameAt(got, spec.MRoomJoinRules, ""); jr != "JR2" {
		t.Fatalf("v2.1: join rules %q, want JR2; state:\n%s", jr, r.describe(got))
	}
	if m := r.nameAt(got, spec.MRoomMember, alice); m != "ALEAVE" {
		t.Fatalf("v2.1: Alice's membership %q, want ALEAVE", m)
	}
	if len(got) != 5 {
		t.Fatalf("v2.1: %d state events, want 5:\n%s", len(got), r.describe(got))
	}

	// State resolution v2 resets the join rules here.
	v2 := r.resolveV2(sets, noneRejected)
	if jr := r.nameAt(v2, spec.MRoomJoinRules, ""); jr != "" {
		t.Fatalf("v2: join rules %q, want none (the reset v2.1 avoids); state:\n%s", jr, r.describe(v2))
	}
}

// The auth events an event is checked against never include rejected
// events: with Alice's join rejected neither join rules event passes.
func TestV21IgnoresRejectedAuthEvents(t *testing.T) {
	r, sets := problemARoom(t)
	imaID := r.id("IMA")
	got := r.resolveV21(sets, func(id string) bool { return id == imaID })
	if jr := r.nameAt(got, spec.MRoomJoinRules, ""); jr != "" {
		t.Fatalf("join rules %q, want none as Alice's join is rejected; state:\n%s", jr, r.describe(got))
	}
}

// problemBRoom builds MSC4297's second example: Alice promotes Bob (P2),
// Bob promotes Charlie (P3), Charlie sets the topic. One fork's state holds
// the power levels from before Bob's promotion although its auth chain (via
// the topic) holds all of them, so the auth difference misses P2.
func problemBRoom(t *testing.T) (*testRoom, [][]gomatrixserverlib.PDU) {
	r := newTestRoom(t)
	r.add(state("CREATE", alice, spec.MRoomCreate, map[string]any{"room_version": "11"}))
	r.add(member("IMA", alice, alice, spec.Join), "CREATE")
	r.add(state("IPOWER", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100})), "IMA")
	r.add(state("IJR", alice, spec.MRoomJoinRules, map[string]any{"join_rule": spec.Public}), "IPOWER")
	r.add(member("IMB", bob, bob, spec.Join), "IJR")
	r.add(member("IMC", charlie, charlie, spec.Join), "IMB")
	r.add(state("P1", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100}, "events", map[string]any{spec.MRoomName: 60})), "IMC")
	r.add(state("P2", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50}, "events", map[string]any{spec.MRoomName: 60})), "P1")
	r.add(state("P3", bob, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50, charlie: 50}, "events", map[string]any{spec.MRoomName: 60})), "P2")
	r.add(topic("T", charlie), "P3")
	correct := r.events("CREATE", "IMA", "P3", "IJR", "IMB", "IMC", "T")
	outdated := r.events("CREATE", "IMA", "P1", "IJR", "IMB", "IMC", "T")
	return r, [][]gomatrixserverlib.PDU{correct, outdated}
}

// P2 lies on the auth path from P3 to P1, so v2.1 replays it and Charlie's
// promotion stands; v2 replays only P1 and P3, and P3 fails against P1.
func TestV21ReplaysConflictedSubgraph(t *testing.T) {
	r, sets := problemBRoom(t)

	got := r.resolveV21(sets, noneRejected)
	if p := r.nameAt(got, spec.MRoomPowerLevels, ""); p != "P3" {
		t.Fatalf("v2.1: power levels %q, want P3; state:\n%s", p, r.describe(got))
	}
	if len(got) != 7 {
		t.Fatalf("v2.1: %d state events, want 7:\n%s", len(got), r.describe(got))
	}

	v2 := r.resolveV2(sets, noneRejected)
	if p := r.nameAt(v2, spec.MRoomPowerLevels, ""); p != "P1" {
		t.Fatalf("v2: power levels %q, want P1 (the reset v2.1 avoids); state:\n%s", p, r.describe(v2))
	}
}

// The conflicted state subgraph is exactly the events on auth paths between
// conflicted events.
func TestConflictedSubgraph(t *testing.T) {
	r, sets := problemBRoom(t)
	res := &resolver{events: map[string]gomatrixserverlib.PDU{}, chains: map[string]map[string]struct{}{}}
	for _, ev := range r.all {
		res.events[ev.EventID()] = ev
	}
	_ = sets
	sub := res.conflictedSubgraph(map[string]gomatrixserverlib.PDU{
		r.id("P1"): r.byName["P1"],
		r.id("P3"): r.byName["P3"],
	})
	want := map[string]bool{"P1": true, "P2": true, "P3": true}
	for id := range sub {
		if !want[r.names[id]] {
			t.Errorf("subgraph holds %s", r.names[id])
		}
	}
	for name := range want {
		if _, ok := sub[r.id(name)]; !ok {
			t.Errorf("subgraph misses %s", name)
		}
	}
}

// authDifferenceRoom: Alice changes the power levels (PQ) on one fork; on
// the other she promotes Bob (PA) and Bob promotes Charlie (PB).
func authDifferenceRoom(t *testing.T) (*testRoom, [][]gomatrixserverlib.PDU) {
	r := newTestRoom(t)
	r.add(state("CREATE", alice, spec.MRoomCreate, map[string]any{"room_version": "11"}))
	r.add(member("IMA", alice, alice, spec.Join), "CREATE")
	r.add(state("IPOWER", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100})), "IMA")
	r.add(state("IJR", alice, spec.MRoomJoinRules, map[string]any{"join_rule": spec.Public}), "IPOWER")
	r.add(member("IMB", bob, bob, spec.Join), "IJR")
	r.add(member("IMC", charlie, charlie, spec.Join), "IMB")
	r.add(state("PQ", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, zara: 10})), "IMC")
	r.add(state("PA", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50})), "IMC")
	r.add(state("PB", bob, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50, charlie: 50})), "PA")
	base := []string{"CREATE", "IMA", "IJR", "IMB", "IMC"}
	return r, [][]gomatrixserverlib.PDU{
		r.events(append(base, "PQ")...),
		r.events(append(base, "PB")...),
	}
}

// A rejected event is never replayed: not as a conflicted event, and not
// from the auth difference.
func TestV21NeverReplaysRejectedEvents(t *testing.T) {
	r, sets := authDifferenceRoom(t)
	if p := r.nameAt(r.resolveV21(sets, noneRejected), spec.MRoomPowerLevels, ""); p != "PB" {
		t.Fatalf("nothing rejected: power levels %q, want PB", p)
	}

	pbID := r.id("PB")
	got := r.resolveV21(sets, func(id string) bool { return id == pbID })
	if p := r.nameAt(got, spec.MRoomPowerLevels, ""); p != "PA" {
		t.Fatalf("PB rejected: power levels %q, want PA (replayed from the auth difference after PQ)", p)
	}

	paID := r.id("PA")
	got = r.resolveV21(sets, func(id string) bool { return id == paID })
	if p := r.nameAt(got, spec.MRoomPowerLevels, ""); p != "PQ" {
		t.Fatalf("PA rejected: power levels %q, want PQ (PB fails without PA)", p)
	}
}

// A key that only some state sets hold is conflicted, and its event must
// pass the auth checks to stay.
func TestKeyMissingFromASetIsConflicted(t *testing.T) {
	r := newTestRoom(t)
	r.add(state("CREATE", alice, spec.MRoomCreate, map[string]any{"room_version": "11"}))
	r.add(member("IMA", alice, alice, spec.Join), "CREATE")
	r.add(state("IPOWER", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100})), "IMA")
	r.add(state("IJR", alice, spec.MRoomJoinRules, map[string]any{"join_rule": spec.Invite}), "IPOWER")
	// Evelyn's join was never allowed (the room is invite only); one fork
	// nonetheless claims it.
	r.add(member("ME", evelyn, evelyn, spec.Join), "IJR")
	sets := [][]gomatrixserverlib.PDU{
		r.events("CREATE", "IMA", "IPOWER", "IJR"),
		r.events("CREATE", "IMA", "IPOWER", "IJR", "ME"),
	}
	got := r.resolveV21(sets, noneRejected)
	if m := r.nameAt(got, spec.MRoomMember, evelyn); m != "" {
		t.Fatalf("Evelyn's membership %q, want none; state:\n%s", m, r.describe(got))
	}
	if len(got) != 4 {
		t.Fatalf("%d state events, want 4:\n%s", len(got), r.describe(got))
	}
}

// With nothing conflicted the state is returned as is, sorted; with one
// state set too.
func TestNothingConflicted(t *testing.T) {
	r, sets := problemARoom(t)
	for _, in := range [][][]gomatrixserverlib.PDU{{sets[0]}, {sets[0], sets[0]}} {
		got := r.resolveV21(in, noneRejected)
		if r.describe(got) != r.describe(sets[0]) {
			t.Fatalf("got\n%s\nwant\n%s", r.describe(got), r.describe(sets[0]))
		}
		for i := 1; i < len(got); i++ {
			a, b := got[i-1], got[i]
			if a.Type() > b.Type() || (a.Type() == b.Type() && *a.StateKey() >= *b.StateKey()) {
				t.Fatalf("result not sorted by type and state key")
			}
		}
	}
	if got, err := ResolveV21(nil, nil, allowedV11, nil); err != nil || len(got) != 0 {
		t.Fatalf("no state sets: %v, %v", got, err)
	}
}

// Bad input is an error, not a panic.
func TestBadInput(t *testing.T) {
	r, sets := problemARoom(t)
	if _, err := ResolveV21(sets, r.all, nil, noneRejected); err == nil {
		t.Error("no auth function: no error")
	}
	bad := append(r.events("JR1"), sets[0]...)
	if _, err := ResolveV21([][]gomatrixserverlib.PDU{bad, sets[1]}, r.all, allowedV11, noneRejected); err == nil {
		t.Error("two events for one key in a state set: no error")
	}
	msg := r.add(message("M", alice), "ALEAVE")
	if _, err := ResolveV21([][]gomatrixserverlib.PDU{append([]gomatrixserverlib.PDU{msg}, sets[0]...), sets[1]}, r.all, allowedV11, noneRejected); err == nil {
		t.Error("message event in a state set: no error")
	}
	// No create event anywhere.
	noCreate := [][]gomatrixserverlib.PDU{r.events("JR1"), r.events("JR2")}
	if _, err := ResolveV21(noCreate, r.events("JR1", "JR2"), allowedV11, noneRejected); err == nil {
		t.Error("no create event: no error")
	}
}

// The auth difference: with C citing B citing A, state sets {A, B} and {C}
// differ by C alone, the state sets' events counting in their own chains.
func TestAuthDifference(t *testing.T) {
	r := newTestRoom(t)
	r.add(evSpec{name: "A", sender: alice, typ: spec.MRoomMember, stateKey: strPtr(alice), content: map[string]any{"membership": "join"}, auth: []string{}})
	r.add(evSpec{name: "B", sender: alice, typ: "b", stateKey: strPtr(""), content: map[string]any{}, auth: []string{"A"}}, "A")
	r.add(evSpec{name: "C", sender: alice, typ: "c", stateKey: strPtr(""), content: map[string]any{}, auth: []string{"B"}}, "B")
	res := &resolver{events: map[string]gomatrixserverlib.PDU{}, chains: map[string]map[string]struct{}{}}
	for _, ev := range r.all {
		res.events[ev.EventID()] = ev
	}
	toMap := func(names ...string) map[stateKey]gomatrixserverlib.PDU {
		m := map[stateKey]gomatrixserverlib.PDU{}
		for _, ev := range r.events(names...) {
			k, _ := keyOf(ev)
			m[k] = ev
		}
		return m
	}
	diff := res.authDifference([]map[stateKey]gomatrixserverlib.PDU{toMap("A", "B"), toMap("C")})
	if len(diff) != 1 {
		t.Fatalf("difference has %d events, want C alone", len(diff))
	}
	if _, ok := diff[r.id("C")]; !ok {
		t.Fatal("difference misses C")
	}
}
