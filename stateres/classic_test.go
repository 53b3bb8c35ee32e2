package stateres

import (
	"testing"

	"github.com/matrix-org/gomatrixserverlib/spec"
)

func pl(users map[string]any, extra ...any) map[string]any {
	c := map[string]any{"users": users}
	for i := 0; i+1 < len(extra); i += 2 {
		c[extra[i].(string)] = extra[i+1]
	}
	return c
}

func topic(name, sender string) evSpec {
	return state(name, sender, spec.MRoomTopic, map[string]any{"topic": name})
}

// Bob's power levels event races Alice's ban of Bob: the ban, being by the
// more powerful sender, is ordered first and Bob's event then fails.
func TestBanVsPowerLevels(t *testing.T) {
	classic(t, []evSpec{
		state("PA", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50})),
		member("MA", alice, alice, spec.Join),
		member("MB", alice, bob, spec.Ban),
		state("PB", bob, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50})),
	}, [][]string{
		{"END", "MB", "MA", "PA", "START"},
		{"END", "PB", "PA"},
	}, []string{"PA", "MA", "MB"})
}

// A join made concurrently with the room becoming private does not survive:
// the join rules event is replayed first and the join fails against it.
func TestJoinRuleEvasion(t *testing.T) {
	classic(t, []evSpec{
		state("JR", alice, spec.MRoomJoinRules, map[string]any{"join_rule": spec.Invite}),
		member("ME", evelyn, evelyn, spec.Join),
	}, [][]string{
		{"END", "JR", "START"},
		{"END", "ME", "START"},
	}, []string{"JR"})
}

// Power levels changes built on each other are replayed in auth order.
func TestOfftopicPowerLevels(t *testing.T) {
	classic(t, []evSpec{
		state("PA", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50})),
		state("PB", bob, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50, charlie: 50})),
		state("PC", charlie, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50, charlie: 0})),
	}, [][]string{
		{"END", "PC", "PB", "PA", "START"},
		{"END", "PA"},
	}, []string{"PC"})
}

// Bob's topic, sent under power he lost on the other fork, is dropped.
func TestTopicBasic(t *testing.T) {
	classic(t, []evSpec{
		topic("T1", alice),
		state("PA1", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50})),
		topic("T2", alice),
		state("PA2", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 0})),
		state("PB", bob, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50})),
		topic("T3", bob),
	}, [][]string{
		{"END", "PA2", "T2", "PA1", "T1", "START"},
		{"END", "T3", "PB", "PA1"},
	}, []string{"PA2", "T2"})
}

// The ban of Bob removes his topic, and the topic falls back to the one
// both forks had rather than vanishing.
func TestTopicResetWithBan(t *testing.T) {
	classic(t, []evSpec{
		topic("T1", alice),
		state("PA", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50})),
		topic("T2", bob),
		member("MB", alice, bob, spec.Ban),
	}, [][]string{
		{"END", "MB", "T2", "PA", "T1", "START"},
		{"END", "T1"},
	}, []string{"T1", "MB", "PA"})
}

// Alice's later topic on top of a message that merged both forks wins.
func TestTopic(t *testing.T) {
	classic(t, []evSpec{
		topic("T1", alice),
		state("PA1", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50})),
		topic("T2", alice),
		state("PA2", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 0})),
		state("PB", bob, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50})),
		topic("T3", bob),
		message("MZ1", zara),
		topic("T4", alice),
	}, [][]string{
		{"END", "T4", "MZ1", "PA2", "T2", "PA1", "T1", "START"},
		{"END", "MZ1", "T3", "PB", "PA1"},
	}, []string{"T4", "PA2"})
}

// T3 wins although T4 was sent later: T4 was sent under an older power
// levels event of the mainline, so it is replayed first.
func TestMainlineSort(t *testing.T) {
	classic(t, []evSpec{
		topic("T1", alice),
		state("PA1", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50})),
		topic("T2", alice),
		state("PA2", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50}, "events", map[string]any{spec.MRoomPowerLevels: 100})),
		state("PB", bob, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50})),
		topic("T3", bob),
		topic("T4", alice),
	}, [][]string{
		{"END", "T3", "PA2", "T2", "PA1", "T1", "START"},
		{"END", "T4", "PB", "PA1"},
	}, []string{"T3", "PA2"})
}

// An event only one fork's auth chain holds is replayed: Bob's power levels
// event PB needs Alice's PA (on Bob's fork only) to be applied after Alice's
// concurrent PQ, which came first and gives Bob nothing.
func TestAuthDifferenceIsReplayed(t *testing.T) {
	classic(t, []evSpec{
		state("PQ", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, zara: 10})),
		state("PA", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50})),
		state("PB", bob, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50, charlie: 50})),
	}, [][]string{
		{"END", "PQ", "START"},
		{"END", "PB", "PA", "START"},
	}, []string{"PB"})
}

// Power events are replayed after the events of their auth chains even when
// tie-breaks would put them first: Alice's PC builds on Bob's PB, so it is
// replayed after it and wins.
func TestPowerOrderFollowsAuthChain(t *testing.T) {
	classic(t, []evSpec{
		state("PA", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50})),
		state("PB", bob, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50, charlie: 50})),
		state("PC", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50, charlie: 0})),
	}, [][]string{
		{"END", "PC", "PB", "PA", "START"},
		{"END", "START"},
	}, []string{"PC"})
}

// Events of a power event's auth chain are replayed with the power events:
// Bob, kicked (K), rejoins (J) and bans Zara (B). A fork that still has the
// kick must not undo the ban, which needs the rejoin replayed before it.
func TestPowerEventsBringTheirAuthChain(t *testing.T) {
	classic(t, []evSpec{
		state("PA", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50})),
		member("K", alice, bob, spec.Leave),
		member("J", bob, bob, spec.Join),
		member("B", bob, zara, spec.Ban),
	}, [][]string{
		{"END", "B", "J", "K", "PA", "START"},
		{"END", "K"},
	}, []string{"PA", "J", "B"})
}

// Before room version 12, a sender whose event cites no power levels event
// has 100 if they created the room and 0 otherwise: Alice's join rules JRA,
// sent before the room had power levels, rank with Alice's power levels
// event P and above Bob's JRB (Bob has 50), so JRB is replayed last.
func TestCreatorRanksAt100WithoutPowerLevels(t *testing.T) {
	r := newTestRoom(t)
	r.add(state("CREATE", alice, spec.MRoomCreate, map[string]any{"room_version": "11"}))
	r.add(member("IMA", alice, alice, spec.Join), "CREATE")
	r.add(state("IJR", alice, spec.MRoomJoinRules, map[string]any{"join_rule": spec.Public}), "IMA")
	r.add(member("IMB", bob, bob, spec.Join), "IJR")
	r.add(state("P", alice, spec.MRoomPowerLevels, pl(map[string]any{alice: 100, bob: 50})), "IMB")
	r.add(state("JRA", alice, spec.MRoomJoinRules, map[string]any{"join_rule": spec.Knock}), "IMB")
	r.add(state("JRB", bob, spec.MRoomJoinRules, map[string]any{"join_rule": spec.Invite}), "P")
	r.add(message("END", bob), "JRA", "JRB")
	if jr := r.nameAt(stateList(r.stateAfter["END"]), spec.MRoomJoinRules, ""); jr != "JRB" {
		t.Fatalf("join rules %q, want JRB", jr)
	}
	for _, n := range []string{"JRA", "P"} {
		for _, id := range r.byName[n].AuthEventIDs() {
			if r.names[id] == "P" {
				t.Fatalf("%s cites a power levels event", n)
			}
		}
	}
}
