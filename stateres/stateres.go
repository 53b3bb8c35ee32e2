// Package stateres implements Matrix state resolution v2.1 (MSC4297), the
// algorithm room version 12 uses to merge the states of forks of a room.
//
// Compared with state resolution v2 it makes two changes, both about which
// events get replayed:
//   - the first round of iterative auth checks starts from an empty state map
//     instead of the unconflicted state map, so conflicted power events are
//     authorised against their own auth chains;
//   - the full conflicted set also holds the conflicted state subgraph: every
//     event lying on an auth_events path between two conflicted events.
package stateres

import (
	"container/heap"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/authrules"
	"github.com/keyserver/keyserver/roomversion"
)

// AuthFunc checks an event against the auth events in provider (the integrator passes authrules.Allowed with userIDForSender bound).
type AuthFunc func(ev gomatrixserverlib.PDU, provider gomatrixserverlib.AuthEventProvider) error

// stateKey identifies one entry of a room's state.
type stateKey struct {
	evType   string
	stateKey string
}

func keyOf(ev gomatrixserverlib.PDU) (stateKey, bool) {
	sk := ev.StateKey()
	if sk == nil {
		return stateKey{}, false
	}
	return stateKey{ev.Type(), *sk}, true
}

// ResolveV21 resolves the given state sets (each the full state of one fork, as state events) into one state.
// authChain holds every event of the union of the state sets' auth chains (the caller loads them from storage; it may also contain the state events themselves).
// isRejected tells events that were rejected (they must not be used).
//
// The result holds one event per state key, ordered by type and state key.
func ResolveV21(states [][]gomatrixserverlib.PDU, authChain []gomatrixserverlib.PDU, allowed AuthFunc, isRejected func(eventID string) bool) ([]gomatrixserverlib.PDU, error) {
	if allowed == nil {
		return nil, fmt.Errorf("stateres: no auth function")
	}
	if isRejected == nil {
		isRejected = func(string) bool { return false }
	}
	r := &resolver{
		events:     make(map[string]gomatrixserverlib.PDU, len(authChain)),
		allowed:    allowed,
		isRejected: isRejected,
		chains:     make(map[string]map[string]struct{}),
	}

	// Every event we may need to look at, by ID.
	for _, ev := range authChain {
		if ev != nil {
			r.events[ev.EventID()] = ev
		}
	}
	stateMaps := make([]map[stateKey]gomatrixserverlib.PDU, 0, len(states))
	for i, set := range states {
		m := make(map[stateKey]gomatrixserverlib.PDU, len(set))
		for _, ev := range set {
			if ev == nil {
				continue
			}
			k, ok := keyOf(ev)
			if !ok {
				return nil, fmt.Errorf("stateres: state set %d holds non-state event %s", i, ev.EventID())
			}
			if prev, dup := m[k]; dup && prev.EventID() != ev.EventID() {
				return nil, fmt.Errorf("stateres: state set %d holds both %s and %s for (%s, %q)", i, prev.EventID(), ev.EventID(), k.evType, k.stateKey)
			}
			m[k] = ev
			r.events[ev.EventID()] = ev
		}
		stateMaps = append(stateMaps, m)
	}
	if len(stateMaps) == 0 {
		return nil, nil
	}

	// Split into the unconflicted state map and the conflicted state set: a
	// key is unconflicted only if every state set has the same event for it.
	unconflicted := make(map[stateKey]gomatrixserverlib.PDU)
	conflicted := make(map[string]gomatrixserverlib.PDU)
	allKeys := make(map[stateKey]struct{})
	for _, m := range stateMaps {
		for k := range m {
			allKeys[k] = struct{}{}
		}
	}
	for k := range allKeys {
		var first gomatrixserverlib.PDU
		same := true
		for _, m := range stateMaps {
			ev, ok := m[k]
			if !ok {
				same = false
				continue
			}
			if first == nil {
				first = ev
			} else if first.EventID() != ev.EventID() {
				same = false
			}
		}
		if same {
			unconflicted[k] = first
			continue
		}
		for _, m := range stateMaps {
			if ev, ok := m[k]; ok {
				conflicted[ev.EventID()] = ev
			}
		}
	}
	if len(conflicted) == 0 {
		return sortedState(unconflicted), nil
	}

	create, err := r.findCreate(stateMaps, unconflicted)
	if err != nil {
		return nil, err
	}
	r.create = create
	roomID := create.RoomID().String()
	for i, m := range stateMaps {
		for _, ev := range m {
			if got := ev.RoomID().String(); got != roomID {
				return nil, fmt.Errorf("stateres: state set %d holds %s of room %s, not %s", i, ev.EventID(), got, roomID)
			}
		}
	}
	r.privilegedCreators = roomversion.Is12(create.Version())

	// The full conflicted set: the conflicted state set, the auth difference
	// and the conflicted state subgraph. Rejected events are never replayed.
	full := make(map[string]struct{}, len(conflicted))
	for id := range conflicted {
		full[id] = struct{}{}
	}
	for id := range r.authDifference(stateMaps) {
		full[id] = struct{}{}
	}
	for id := range r.conflictedSubgraph(conflicted) {
		full[id] = struct{}{}
	}
	for id := range full {
		ev, ok := r.events[id]
		if !ok || isRejected(id) || ev.StateKey() == nil {
			delete(full, id)
		}
	}

	// Step 1: the power events of the full conflicted set, together with the
	// events of their auth chains that are in the full conflicted set, in
	// reverse topological power ordering.
	powerSet := make(map[string]struct{})
	for id := range full {
		ev := r.events[id]
		if !isPowerEvent(ev) {
			continue
		}
		powerSet[id] = struct{}{}
		for anc := range r.authChainOf(id) {
			if _, in := full[anc]; in {
				powerSet[anc] = struct{}{}
			}
		}
	}
	powerOrdered := r.reverseTopologicalPowerOrder(powerSet)

	// Step 2: iterative auth checks from an empty state map.
	partial := make(map[stateKey]gomatrixserverlib.PDU)
	r.iterativeAuthChecks(partial, powerOrdered)

	// Step 3: the other events of the full conflicted set, in mainline order
	// relative to the power levels event resolved so far.
	others := make([]gomatrixserverlib.PDU, 0, len(full)-len(powerSet))
	for id := range full {
		if _, in := powerSet[id]; !in {
			others = append(others, r.events[id])
		}
	}
	others = r.mainlineOrder(partial[stateKey{spec.MRoomPowerLevels, ""}], others)

	// Step 4: iterative auth checks on top of the partially resolved state.
	r.iterativeAuthChecks(partial, others)

	// Step 5: the unconflicted state map wins over everything.
	for k, ev := range unconflicted {
		partial[k] = ev
	}
	return sortedState(partial), nil
}

type resolver struct {
	events     map[string]gomatrixserverlib.PDU
	allowed    AuthFunc
	isRejected func(string) bool
	create     gomatrixserverlib.PDU
	// privilegedCreators: the room's creators have infinite power (room
	// version 12).
	privilegedCreators bool
	chains             map[string]map[string]struct{}
}

// findCreate returns the room's create event. From room version 12 the
// create event is not listed in auth_events (its ID is derived from the room
// ID), so it has to be supplied to every auth check.
func (r *resolver) findCreate(stateMaps []map[stateKey]gomatrixserverlib.PDU, unconflicted map[stateKey]gomatrixserverlib.PDU) (gomatrixserverlib.PDU, error) {
	createKey := stateKey{spec.MRoomCreate, ""}
	// The room is the one the non-create events name.
	var roomID string
	for _, m := range stateMaps {
		for k, ev := range m {
			if k != createKey {
				roomID = ev.RoomID().String()
				break
			}
		}
		if roomID != "" {
			break
		}
	}
	if roomID != "" {
		if ev, ok := r.events[roomversion.CreateEventID(roomID)]; ok && isCreate(ev) && !r.isRejected(ev.EventID()) {
			return ev, nil
		}
	}
	if ev, ok := unconflicted[createKey]; ok {
		return ev, nil
	}
	var found gomatrixserverlib.PDU
	for _, ev := range r.events {
		if !isCreate(ev) || r.isRejected(ev.EventID()) {
			continue
		}
		if found != nil && found.EventID() != ev.EventID() {
			return nil, fmt.Errorf("stateres: more than one create event (%s, %s)", found.EventID(), ev.EventID())
		}
		found = ev
	}
	if found == nil {
		return nil, fmt.Errorf("stateres: no create event for room %s", roomID)
	}
	return found, nil
}

func isCreate(ev gomatrixserverlib.PDU) bool {
	return ev.Type() == spec.MRoomCreate && ev.StateKeyEquals("")
}

// authChainOf returns the IDs of every event reachable from the event through
// auth_events (not the event itself), as far as the known events go.
func (r *resolver) authChainOf(eventID string) map[string]struct{} {
	if c, ok := r.chains[eventID]; ok {
		return c
	}
	chain := make(map[string]struct{})
	ev, ok := r.events[eventID]
	if ok {
		stack := append([]string(nil), ev.AuthEventIDs()...)
		for len(stack) > 0 {
			id := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			if _, seen := chain[id]; seen {
				continue
			}
			chain[id] = struct{}{}
			if known, ok := r.chains[id]; ok {
				for a := range known {
					chain[a] = struct{}{}
				}
				continue
			}
			if a, ok := r.events[id]; ok {
				stack = append(stack, a.AuthEventIDs()...)
			}
		}
	}
	r.chains[eventID] = chain
	return chain
}

// ancestors returns the IDs of every event reachable from the given events
// through one or more auth_events edges, as far as the known events go.
func (r *resolver) ancestors(from []gomatrixserverlib.PDU) map[string]struct{} {
	seen := make(map[string]struct{})
	var stack []string
	for _, ev := range from {
		stack = append(stack, ev.AuthEventIDs()...)
	}
	for len(stack) > 0 {
		id := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if _, ok := seen[id]; ok {
			continue
		}
		seen[id] = struct{}{}
		if a, ok := r.events[id]; ok {
			stack = append(stack, a.AuthEventIDs()...)
		}
	}
	return seen
}

// authDifference returns the events that are in the full auth chain of some
// state set but not in that of every state set. A state set's full auth
// chain holds its own events too, as Synapse computes it: an event that
// every state set holds is never part of the difference.
func (r *resolver) authDifference(stateMaps []map[stateKey]gomatrixserverlib.PDU) map[string]struct{} {
	counts := make(map[string]int)
	for _, m := range stateMaps {
		set := make([]gomatrixserverlib.PDU, 0, len(m))
		for _, ev := range m {
			set = append(set, ev)
		}
		chain := r.ancestors(set)
		for _, ev := range set {
			chain[ev.EventID()] = struct{}{}
		}
		for id := range chain {
			counts[id]++
		}
	}
	diff := make(map[string]struct{})
	for id, n := range counts {
		if n < len(stateMaps) {
			diff[id] = struct{}{}
		}
	}
	return diff
}

// conflictedSubgraph returns the events lying on an auth_events path from one
// conflicted event to another, endpoints included.
func (r *resolver) conflictedSubgraph(conflicted map[string]gomatrixserverlib.PDU) map[string]struct{} {
	// reaches[id] tells whether a conflicted event is reachable from id
	// through zero or more auth_events edges.
	reaches := make(map[string]bool)
	var walk func(id string) bool
	walk = func(id string) bool {
		if v, ok := reaches[id]; ok {
			return v
		}
		reaches[id] = false // the graph is acyclic; this only guards against bad input
		_, res := conflicted[id]
		if ev, ok := r.events[id]; ok {
			for _, a := range ev.AuthEventIDs() {
				if walk(a) {
					res = true
				}
			}
		}
		reaches[id] = res
		return res
	}
	sub := make(map[string]struct{})
	from := make([]gomatrixserverlib.PDU, 0, len(conflicted))
	for _, ev := range conflicted {
		from = append(from, ev)
	}
	// Inner events and the conflicted events at the lower end of a path.
	for id := range r.ancestors(from) {
		if walk(id) {
			sub[id] = struct{}{}
		}
	}
	// Conflicted events at the upper end of a path.
	for id, ev := range conflicted {
		for _, a := range ev.AuthEventIDs() {
			if walk(a) {
				sub[id] = struct{}{}
				break
			}
		}
	}
	return sub
}

// isPowerEvent tells events that may remove someone's ability to act:
// power levels, join rules, and kicks and bans.
func isPowerEvent(ev gomatrixserverlib.PDU) bool {
	switch ev.Type() {
	case spec.MRoomPowerLevels, spec.MRoomJoinRules:
		return ev.StateKeyEquals("")
	case spec.MRoomMember:
		sk := ev.StateKey()
		if sk == nil || *sk == string(ev.SenderID()) {
			return false
		}
		m, err := ev.Membership()
		if err != nil {
			return false
		}
		return m == spec.Leave || m == spec.Ban
	}
	return false
}

// senderPower is the power of the event's sender according to the power
// levels event among its auth events, for tie-breaking.
func (r *resolver) senderPower(ev gomatrixserverlib.PDU) int64 {
	sender := string(ev.SenderID())
	var pl, create gomatrixserverlib.PDU
	for _, id := range ev.AuthEventIDs() {
		a, ok := r.events[id]
		if !ok || r.isRejected(id) {
			continue
		}
		switch {
		case a.Type() == spec.MRoomPowerLevels && a.StateKeyEquals(""):
			pl = a
		case isCreate(a):
			create = a
		}
	}
	if r.privilegedCreators {
		// Creators above everyone (math.MaxInt64), the others as the power
		// levels event gives them.
		return authrules.UserLevel(r.create, pl, sender)
	}
	if pl == nil {
		// Without power levels the creator has 100 and everyone else 0.
		if create == nil {
			create = r.create
		}
		if create != nil && sender == legacyCreator(create) {
			return 100
		}
		return 0
	}
	var content struct {
		Users        map[string]json.RawMessage `json:"users"`
		UsersDefault json.RawMessage            `json:"users_default"`
	}
	if err := json.Unmarshal(pl.Content(), &content); err != nil {
		return 0
	}
	if v, ok := content.Users[sender]; ok {
		return parseLevel(v)
	}
	return parseLevel(content.UsersDefault)
}

// legacyCreator is the room creator before room version 12: content.creator
// up to version 10, the sender from version 11.
func legacyCreator(create gomatrixserverlib.PDU) string {
	var content struct {
		Creator string `json:"creator"`
	}
	if err := json.Unmarshal(create.Content(), &content); err == nil && content.Creator != "" {
		if n, err := strconv.Atoi(string(create.Version())); err == nil && n <= 10 {
			return content.Creator
		}
	}
	return string(create.SenderID())
}

// parseLevel reads a power level given as an integer or, in old room
// versions, a string holding one; anything else counts as 0.
func parseLevel(raw json.RawMessage) int64 {
	if len(raw) == 0 {
		return 0
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err == nil {
		if i, err := n.Int64(); err == nil {
			return i
		}
		return 0
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		if i, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64); err == nil {
			return i
		}
	}
	return 0
}

// powerItem is an event waiting in Kahn's algorithm.
type powerItem struct {
	ev    gomatrixserverlib.PDU
	power int64
	ts    spec.Timestamp
	id    string
}

// powerHeap pops the event that sorts first: greater sender power, then
// smaller origin_server_ts, then smaller event ID.
type powerHeap []*powerItem

func (h powerHeap) Len() int { return len(h) }
func (h powerHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if a.power != b.power {
		return a.power > b.power
	}
	if a.ts != b.ts {
		return a.ts < b.ts
	}
	return a.id < b.id
}
func (h powerHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *powerHeap) Push(x any)   { *h = append(*h, x.(*powerItem)) }
func (h *powerHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

// reverseTopologicalPowerOrder sorts the events so that an event comes after
// every event of its auth chain, ties broken by the power heap's order.
func (r *resolver) reverseTopologicalPowerOrder(set map[string]struct{}) []gomatrixserverlib.PDU {
	// Edges go from an event to each event of its auth chain in the set;
	// paths through events outside the set count too.
	blockers := make(map[string]int, len(set))
	dependents := make(map[string][]string, len(set))
	for id := range set {
		for anc := range r.authChainOf(id) {
			if _, in := set[anc]; in && anc != id {
				blockers[id]++
				dependents[anc] = append(dependents[anc], id)
			}
		}
	}
	h := make(powerHeap, 0, len(set))
	for id := range set {
		if blockers[id] == 0 {
			h = append(h, r.powerItem(id))
		}
	}
	heap.Init(&h)
	out := make([]gomatrixserverlib.PDU, 0, len(set))
	for h.Len() > 0 {
		it := heap.Pop(&h).(*powerItem)
		out = append(out, it.ev)
		for _, dep := range dependents[it.id] {
			blockers[dep]--
			if blockers[dep] == 0 {
				heap.Push(&h, r.powerItem(dep))
			}
		}
	}
	return out
}

func (r *resolver) powerItem(id string) *powerItem {
	ev := r.events[id]
	return &powerItem{ev: ev, power: r.senderPower(ev), ts: ev.OriginServerTS(), id: id}
}

// plAuthEvent returns the power levels event listed in the event's auth_events.
func (r *resolver) plAuthEvent(ev gomatrixserverlib.PDU) gomatrixserverlib.PDU {
	for _, id := range ev.AuthEventIDs() {
		if a, ok := r.events[id]; ok && a.Type() == spec.MRoomPowerLevels && a.StateKeyEquals("") {
			return a
		}
	}
	return nil
}

// mainlineOrder sorts the events by their position relative to the mainline
// of the power levels event pl (older positions first), then by
// origin_server_ts, then by event ID.
func (r *resolver) mainlineOrder(pl gomatrixserverlib.PDU, events []gomatrixserverlib.PDU) []gomatrixserverlib.PDU {
	// mainline[id] is the index of a power levels event in the mainline, the
	// resolved event being 0 and its predecessors counting up.
	mainline := make(map[string]int)
	seen := make(map[string]struct{})
	for p, i := pl, 0; p != nil; p, i = r.plAuthEvent(p), i+1 {
		if _, loop := seen[p.EventID()]; loop {
			break
		}
		seen[p.EventID()] = struct{}{}
		mainline[p.EventID()] = i
	}
	position := func(ev gomatrixserverlib.PDU) int {
		visited := make(map[string]struct{})
		for p := r.plAuthEvent(ev); p != nil; p = r.plAuthEvent(p) {
			if pos, ok := mainline[p.EventID()]; ok {
				return pos
			}
			if _, loop := visited[p.EventID()]; loop {
				break
			}
			visited[p.EventID()] = struct{}{}
		}
		return math.MaxInt
	}
	type item struct {
		ev  gomatrixserverlib.PDU
		pos int
	}
	items := make([]item, len(events))
	for i, ev := range events {
		items[i] = item{ev, position(ev)}
	}
	sort.Slice(items, func(i, j int) bool {
		a, b := items[i], items[j]
		if a.pos != b.pos {
			return a.pos > b.pos
		}
		if a.ev.OriginServerTS() != b.ev.OriginServerTS() {
			return a.ev.OriginServerTS() < b.ev.OriginServerTS()
		}
		return a.ev.EventID() < b.ev.EventID()
	})
	out := make([]gomatrixserverlib.PDU, len(items))
	for i, it := range items {
		out[i] = it.ev
	}
	return out
}

// iterativeAuthChecks applies each event in turn to the partial state if it
// is allowed. The state an event is checked against is the partial state for
// the keys the authorization rules need, completed by the event's own
// (non-rejected) auth events, and always the room's create event.
func (r *resolver) iterativeAuthChecks(partial map[stateKey]gomatrixserverlib.PDU, events []gomatrixserverlib.PDU) {
	for _, ev := range events {
		k, ok := keyOf(ev)
		if !ok {
			continue
		}
		provider := gomatrixserverlib.NewAuthEvents(nil)
		for _, id := range ev.AuthEventIDs() {
			a, ok := r.events[id]
			if !ok || r.isRejected(id) || a.StateKey() == nil {
				continue
			}
			_ = provider.AddEvent(a)
		}
		needed := gomatrixserverlib.StateNeededForAuth([]gomatrixserverlib.PDU{ev})
		override := func(k stateKey) {
			if p, ok := partial[k]; ok {
				_ = provider.AddEvent(p)
			}
		}
		// The create event is needed by every rule set.
		override(stateKey{spec.MRoomCreate, ""})
		if needed.PowerLevels {
			override(stateKey{spec.MRoomPowerLevels, ""})
		}
		if needed.JoinRules {
			override(stateKey{spec.MRoomJoinRules, ""})
		}
		for _, m := range needed.Member {
			override(stateKey{spec.MRoomMember, m})
		}
		for _, tpi := range needed.ThirdPartyInvite {
			override(stateKey{spec.MRoomThirdPartyInvite, tpi})
		}
		if c, _ := provider.Create(); c == nil && r.create != nil {
			_ = provider.AddEvent(r.create)
		}
		if err := r.allowed(ev, &provider); err != nil {
			continue
		}
		partial[k] = ev
	}
}

func sortedState(m map[stateKey]gomatrixserverlib.PDU) []gomatrixserverlib.PDU {
	keys := make([]stateKey, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].evType != keys[j].evType {
			return keys[i].evType < keys[j].evType
		}
		return keys[i].stateKey < keys[j].stateKey
	})
	out := make([]gomatrixserverlib.PDU, len(keys))
	for i, k := range keys {
		out[i] = m[k]
	}
	return out
}
