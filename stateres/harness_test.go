package stateres

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/authrules"
	"github.com/keyserver/keyserver/roomversion"
)

const (
	alice   = "@alice:example.com"
	bob     = "@bob:example.com"
	charlie = "@charlie:example.com"
	evelyn  = "@evelyn:example.com"
	zara    = "@zara:example.com"

	testRoomID = "!test:example.com"
)

func userIDForSender(_ spec.RoomID, senderID spec.SenderID) (*spec.UserID, error) {
	return spec.NewUserID(string(senderID), true)
}

// allowedV11 is the auth function for the test rooms: room version 11's
// authorization rules.
func allowedV11(ev gomatrixserverlib.PDU, provider gomatrixserverlib.AuthEventProvider) error {
	return gomatrixserverlib.Allowed(ev, provider, userIDForSender)
}

// allowedV12 is the auth function of room version 12 rooms.
func allowedV12(ev gomatrixserverlib.PDU, provider gomatrixserverlib.AuthEventProvider) error {
	return authrules.Allowed(ev, provider, userIDForSender)
}

func noneRejected(string) bool { return false }

func strPtr(s string) *string { return &s }

// spec of one event of a test room.
type evSpec struct {
	name     string
	sender   string
	typ      string
	stateKey *string
	content  any
	// auth lists the names of the event's auth events; when nil they are
	// chosen from the state before the event, as a server would.
	auth []string
}

func member(name, sender, target, membership string) evSpec {
	return evSpec{name: name, sender: sender, typ: spec.MRoomMember, stateKey: strPtr(target), content: map[string]any{"membership": membership}}
}

func state(name, sender, typ string, content any) evSpec {
	return evSpec{name: name, sender: sender, typ: typ, stateKey: strPtr(""), content: content}
}

func message(name, sender string) evSpec {
	return evSpec{name: name, sender: sender, typ: "m.room.message", content: map[string]any{}}
}

// testRoom builds a room's DAG of signed room version 11 (or 12) events. The state
// after each event is computed as a server does: the state before the event
// is the state after its single prev event, or the resolution (ResolveV21)
// of the states after its prev events.
type testRoom struct {
	t          *testing.T
	version    gomatrixserverlib.RoomVersion
	roomID     string
	allowed    AuthFunc
	key        ed25519.PrivateKey
	ts         int64
	byName     map[string]gomatrixserverlib.PDU
	names      map[string]string
	stateAfter map[string]map[stateKey]gomatrixserverlib.PDU
	all        []gomatrixserverlib.PDU
}

func newTestRoom(t *testing.T) *testRoom {
	t.Helper()
	seed := make([]byte, ed25519.SeedSize)
	copy(seed, "stateres test signing key seed!!")
	return &testRoom{
		t:          t,
		version:    gomatrixserverlib.RoomVersionV11,
		roomID:     testRoomID,
		allowed:    allowedV11,
		key:        ed25519.NewKeyFromSeed(seed),
		byName:     map[string]gomatrixserverlib.PDU{},
		names:      map[string]string{},
		stateAfter: map[string]map[stateKey]gomatrixserverlib.PDU{},
	}
}

// newTestRoomV12 starts a room version 12 room; its ID is known once the
// create event is added.
func newTestRoomV12(t *testing.T) *testRoom {
	r := newTestRoom(t)
	r.version, r.roomID, r.allowed = roomversion.V12, "", allowedV12
	return r
}

// add builds the event with the given prev events (names) and records it.
func (r *testRoom) add(s evSpec, prev ...string) gomatrixserverlib.PDU {
	r.t.Helper()
	before := map[stateKey]gomatrixserverlib.PDU{}
	switch len(prev) {
	case 0:
	case 1:
		for k, v := range r.stateAfter[prev[0]] {
			before[k] = v
		}
	default:
		sets := make([][]gomatrixserverlib.PDU, 0, len(prev))
		for _, p := range prev {
			sets = append(sets, stateList(r.stateAfter[p]))
		}
		resolved, err := ResolveV21(sets, r.all, r.allowed, noneRejected)
		if err != nil {
			r.t.Fatalf("resolving the state before %s: %v", s.name, err)
		}
		for _, ev := range resolved {
			k, _ := keyOf(ev)
			before[k] = ev
		}
	}

	content, err := json.Marshal(s.content)
	if err != nil {
		r.t.Fatal(err)
	}
	prevIDs := make([]string, 0, len(prev))
	for _, p := range prev {
		prevIDs = append(prevIDs, r.id(p))
	}
	proto := gomatrixserverlib.ProtoEvent{
		SenderID:   s.sender,
		RoomID:     r.roomID,
		Type:       s.typ,
		StateKey:   s.stateKey,
		Content:    content,
		PrevEvents: prevIDs,
		Depth:      int64(len(r.all) + 1),
	}
	if s.auth != nil {
		ids := make([]string, 0, len(s.auth))
		for _, a := range s.auth {
			ids = append(ids, r.id(a))
		}
		proto.AuthEvents = ids
	} else {
		needed, err := gomatrixserverlib.StateNeededForProtoEvent(&proto)
		if roomversion.Is12(r.version) {
			// The create event is implied by the room ID.
			needed, err = authrules.AuthEventsNeededForProto(&proto)
		}
		if err != nil {
			r.t.Fatalf("auth events of %s: %v", s.name, err)
		}
		provider := gomatrixserverlib.NewAuthEvents(stateList(before))
		if proto.AuthEvents, err = needed.AuthEventReferences(&provider); err != nil {
			r.t.Fatalf("auth events of %s: %v", s.name, err)
		}
	}
	r.ts++
	ev, err := roomversion.Build(r.version, &proto, time.UnixMilli(r.ts), "example.com", "ed25519:1", r.key)
	if err != nil {
		r.t.Fatalf("building %s: %v", s.name, err)
	}
	if r.roomID == "" {
		r.roomID = ev.RoomID().String()
	}
	if _, dup := r.byName[s.name]; dup {
		r.t.Fatalf("two events named %s", s.name)
	}
	r.byName[s.name] = ev
	r.names[ev.EventID()] = s.name
	r.all = append(r.all, ev)
	after := before
	if k, ok := keyOf(ev); ok {
		after[k] = ev
	}
	r.stateAfter[s.name] = after
	return ev
}

func (r *testRoom) id(name string) string {
	r.t.Helper()
	ev, ok := r.byName[name]
	if !ok {
		r.t.Fatalf("no event named %s", name)
	}
	return ev.EventID()
}

// events returns the named events.
func (r *testRoom) events(names ...string) []gomatrixserverlib.PDU {
	r.t.Helper()
	out := make([]gomatrixserverlib.PDU, 0, len(names))
	for _, n := range names {
		r.id(n)
		out = append(out, r.byName[n])
	}
	return out
}

// describe renders a state as "type|state_key=NAME" lines, sorted.
func (r *testRoom) describe(evs []gomatrixserverlib.PDU) string {
	lines := make([]string, 0, len(evs))
	for _, ev := range evs {
		name, ok := r.names[ev.EventID()]
		if !ok {
			name = ev.EventID()
		}
		lines = append(lines, fmt.Sprintf("%s|%s=%s", ev.Type(), *ev.StateKey(), name))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func stateList(m map[stateKey]gomatrixserverlib.PDU) []gomatrixserverlib.PDU {
	return sortedState(m)
}

// nameAt returns the name of the event the state holds for the key, or "".
func (r *testRoom) nameAt(evs []gomatrixserverlib.PDU, typ, sk string) string {
	for _, ev := range evs {
		if ev.Type() == typ && ev.StateKeyEquals(sk) {
			return r.names[ev.EventID()]
		}
	}
	return ""
}

// resolveV2 resolves the state sets with gomatrixserverlib's state
// resolution v2 (room version 11), for comparison.
func (r *testRoom) resolveV2(sets [][]gomatrixserverlib.PDU, isRejected func(string) bool) []gomatrixserverlib.PDU {
	r.t.Helper()
	var union []gomatrixserverlib.PDU
	for _, s := range sets {
		union = append(union, s...)
	}
	out, err := gomatrixserverlib.ResolveConflicts(gomatrixserverlib.RoomVersionV11, union, r.all, userIDForSender, isRejected)
	if err != nil {
		r.t.Fatalf("v2 resolution: %v", err)
	}
	return out
}

// resolveV21 resolves the state sets with ResolveV21 and the whole DAG as
// the auth chain.
func (r *testRoom) resolveV21(sets [][]gomatrixserverlib.PDU, isRejected func(string) bool) []gomatrixserverlib.PDU {
	r.t.Helper()
	out, err := ResolveV21(sets, r.all, r.allowed, isRejected)
	if err != nil {
		r.t.Fatalf("v2.1 resolution: %v", err)
	}
	return out
}

// classic runs one of the state resolution v2 scenarios: a room whose
// initial events are followed by the scenario's events, linked by edges
// (chains of prev_events, [A, B, C] meaning A follows B, B follows C). It
// checks the state at END: the keys of the expected events hold them, and
// no other key differs from the state at START.
func classic(t *testing.T, scenario []evSpec, edges [][]string, expected []string) {
	t.Helper()
	initial := []evSpec{
		state("CREATE", alice, spec.MRoomCreate, map[string]any{"room_version": "11"}),
		member("IMA", alice, alice, spec.Join),
		state("IPOWER", alice, spec.MRoomPowerLevels, map[string]any{"users": map[string]any{alice: 100}}),
		state("IJR", alice, spec.MRoomJoinRules, map[string]any{"join_rule": spec.Public}),
		member("IMB", bob, bob, spec.Join),
		member("IMC", charlie, charlie, spec.Join),
		member("IMZ", zara, zara, spec.Join),
		message("START", zara),
	}
	all := append(append(append([]evSpec{}, initial...), scenario...), message("END", zara))
	edges = append([][]string{{"START", "IMZ", "IMC", "IMB", "IJR", "IPOWER", "IMA", "CREATE"}}, edges...)
	prevs := map[string][]string{}
	for _, chain := range edges {
		for i := 0; i+1 < len(chain); i++ {
			prevs[chain[i]] = append(prevs[chain[i]], chain[i+1])
		}
	}
	r := newTestRoom(t)
	for _, s := range all {
		r.add(s, prevs[s.name]...)
	}

	want := map[stateKey]string{}
	for _, name := range expected {
		k, _ := keyOf(r.byName[name])
		want[k] = name
	}
	start := r.stateAfter["START"]
	got := map[stateKey]string{}
	for k, ev := range r.stateAfter["END"] {
		_, expectedKey := want[k]
		if expectedKey || start[k] == nil || start[k].EventID() != ev.EventID() {
			got[k] = r.names[ev.EventID()]
		}
	}
	for k, name := range start {
		if _, still := r.stateAfter["END"][k]; !still {
			got[k] = "(gone, was " + r.names[name.EventID()] + ")"
		}
	}
	if fmt.Sprint(sortedNames(got)) != fmt.Sprint(sortedNames(want)) {
		t.Fatalf("state at END:\n got  %v\n want %v", sortedNames(got), sortedNames(want))
	}
}

func sortedNames(m map[stateKey]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, fmt.Sprintf("%s|%s=%s", k.evType, k.stateKey, v))
	}
	sort.Strings(out)
	return out
}
