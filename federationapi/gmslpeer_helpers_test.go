package federationapi_test

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/fclient"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/authrules"
	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/roomversion"
	"github.com/keyserver/keyserver/stateres"
)

// gmslPeer is another homeserver made from gomatrixserverlib: it hosts
// one room of a given version, builds, signs and authorises its events
// with gomatrixserverlib, keeps them in memory, and serves what a daemon
// joining and following the room asks of it: make_join, v2 send_join,
// event, state_ids, get_missing_events, and send for what comes back.
// Requests to it are checked (X-Matrix) with its own key ring. Version
// 12, which the pinned gomatrixserverlib predates, is built with
// roomversion.Build, authorised with authrules and resolved with
// stateres.ResolveV21; its make_join and make_leave are the peer's own
// steps (gomatrixserverlib's check templates with the rules of version 11).
type gmslPeer struct {
	*testutil.Origin
	t       testing.TB
	version gomatrixserverlib.RoomVersion
	impl    gomatrixserverlib.IRoomVersion
	roomID  string
	creator string // joined, with power level 100 (a creator in version 12)
	keyRing *gomatrixserverlib.KeyRing

	mu         sync.Mutex
	events     map[string]gomatrixserverlib.PDU
	stateAfter map[string]peerState
	latest     []string                       // forward extremities
	templates  []gomatrixserverlib.ProtoEvent // answered by make_join
	offered    [][]string                     // the versions of each make_join
	joins      []gomatrixserverlib.PDU        // received in send_join
	received   []gomatrixserverlib.PDU        // received over /send
	calls      map[string]int                 // requests served, by endpoint
	minDepths  []int64                        // of get_missing_events requests
	txn        int
	// failMakeJoin and failSendJoin, when set, answer those requests
	// instead of the room.
	failMakeJoin, failSendJoin http.HandlerFunc
	// editSendJoin, when set, changes each send_join answer before it
	// is sent (a misbehaving server).
	editSendJoin func(answer map[string]any)
	// stateAnswer, when set, answers /state_ids and /state in place of
	// the room's own state: for another room (one of the daemon's the
	// peer's users are in), or a wrong answer (ok false: not found).
	stateAnswer func(roomID, eventID string) (state, authChain []gomatrixserverlib.PDU, ok bool)
	// v1Only makes the peer an older server: v2 send_join and send_leave
	// are unknown paths to it, v1 (answered [200, answer]) is served.
	v1Only bool
	// noMissingEvents answers every get_missing_events with no event;
	// failMissingEvents with 500.
	noMissingEvents, failMissingEvents bool
	// missingNewestFirst answers get_missing_events newest first, and
	// missingExtra is added to its answers (a misbehaving server).
	missingNewestFirst bool
	missingExtra       []json.RawMessage
	// backfillExtra is added to every /backfill answer (events a
	// misbehaving server slips in); failBackfill answers it 500.
	backfillExtra []json.RawMessage
	failBackfill  bool
	hangBackfill  bool // holds /backfill unanswered until the request ends
	// devicesAnswer, when set, answers /user/devices (status and body);
	// otherwise every user has no devices.
	devicesAnswer func(userID string) (int, any)
}

// answerDevices sets the answer of /user/devices (nil: no devices).
func (p *gmslPeer) answerDevices(f func(userID string) (int, any)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.devicesAnswer = f
}

// setFailures sets the answers that replace make_join and send_join
// (nil: the room's).
func (p *gmslPeer) setFailures(makeJoin, sendJoin http.HandlerFunc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failMakeJoin, p.failSendJoin = makeJoin, sendJoin
}

// changeSendJoin sets the change made to send_join answers (nil: none).
func (p *gmslPeer) changeSendJoin(f func(answer map[string]any)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.editSendJoin = f
}

// answerState sets the answer of /state_ids and /state (nil: the room's).
func (p *gmslPeer) answerState(f func(roomID, eventID string) (state, authChain []gomatrixserverlib.PDU, ok bool)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stateAnswer = f
}

// hold keeps events of another room (one of the daemon's the peer's
// users are in) for /event, /get_missing_events and /backfill, without
// making them events of the peer's room.
func (p *gmslPeer) hold(evs ...gomatrixserverlib.PDU) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ev := range evs {
		p.events[ev.EventID()] = ev
	}
}

// stateFor answers /state_ids and /state: the state before an event and
// its auth chain, ok false when the event is not known.
func (p *gmslPeer) stateFor(roomID, eventID string) (state, authChain []gomatrixserverlib.PDU, ok bool) {
	if p.stateAnswer != nil {
		return p.stateAnswer(roomID, eventID)
	}
	ev := p.events[eventID]
	if ev == nil || roomID != p.roomID {
		return nil, nil, false
	}
	state = p.stateAt(ev.PrevEventIDs()).list()
	return state, p.authChain(state), true
}

// answerNoMissingEvents makes get_missing_events answer nothing.
func (p *gmslPeer) answerNoMissingEvents() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.noMissingEvents = true
}

// breakMissingEvents makes get_missing_events answer 500.
func (p *gmslPeer) breakMissingEvents() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failMissingEvents = true
}

// peerState is a room state: (type, state_key) -> event.
type peerState map[gomatrixserverlib.StateKeyTuple]gomatrixserverlib.PDU

func (s peerState) provider() *gomatrixserverlib.AuthEvents {
	ae := gomatrixserverlib.NewAuthEvents(nil)
	for _, ev := range s {
		_ = ae.AddEvent(ev)
	}
	return &ae
}

// list returns the state's events, sorted by key.
func (s peerState) list() []gomatrixserverlib.PDU {
	out := slices.Collect(maps.Values(s))
	sort.Slice(out, func(i, j int) bool {
		return out[i].Type()+"\x00"+*out[i].StateKey() < out[j].Type()+"\x00"+*out[j].StateKey()
	})
	return out
}

// ids maps "type|state_key" to event IDs.
func (s peerState) ids() map[string]string {
	out := map[string]string{}
	for k, ev := range s {
		out[k.EventType+"|"+k.StateKey] = ev.EventID()
	}
	return out
}

func peerUserIDForSender(_ spec.RoomID, senderID spec.SenderID) (*spec.UserID, error) {
	return spec.NewUserID(string(senderID), true)
}

// newGmslPeer starts a peer hosting a new public room of version: its
// creator's create event, join, power levels, join rules and history
// visibility.
// peerRooms numbers the peers' rooms.
var peerRooms atomic.Int64

func newGmslPeer(t testing.TB, version gomatrixserverlib.RoomVersion) *gmslPeer {
	t.Helper()
	o := testutil.NewOrigin(t)
	p := &gmslPeer{
		Origin: o, t: t, version: version, impl: gomatrixserverlib.MustGetRoomVersion(version),
		events: map[string]gomatrixserverlib.PDU{}, stateAfter: map[string]peerState{}, calls: map[string]int{},
	}
	// A room of its own: a peer started later may listen on a port an
	// earlier one used, and so have its name.
	if !p.is12() {
		p.roomID = fmt.Sprintf("!room%d:%s", peerRooms.Add(1), o.Name)
	} // version 12: the hash of the create event, set by add
	p.creator = p.user("creator")
	p.keyRing = &gomatrixserverlib.KeyRing{
		KeyDatabase: &memoryKeys{keys: map[gomatrixserverlib.PublicKeyLookupRequest]gomatrixserverlib.PublicKeyLookupResult{}},
		KeyFetchers: []gomatrixserverlib.KeyFetcher{&gomatrixserverlib.DirectKeyFetcher{
			Client:            fclient.NewClient(fclient.WithSkipVerify(true), fclient.WithTimeout(10*time.Second)),
			IsLocalServerName: func(s spec.ServerName) bool { return string(s) == o.Name },
			LocalPublicKey:    spec.Base64Bytes(o.Key.Public().(ed25519.PublicKey)),
		}},
	}
	p.serve()
	empty := ""
	p.add(peerEvent{Sender: p.creator, Type: spec.MRoomCreate, StateKey: &empty,
		Content: map[string]any{"creator": p.creator, "room_version": version}})
	p.add(peerEvent{Sender: p.creator, Type: spec.MRoomMember, StateKey: &p.creator, Content: map[string]any{"membership": spec.Join}})
	users := map[string]any{p.creator: 100}
	if p.is12() {
		users = map[string]any{} // creators are privileged, and not listed
	}
	p.add(peerEvent{Sender: p.creator, Type: spec.MRoomPowerLevels, StateKey: &empty, Content: map[string]any{
		"users": users, "users_default": 0, "events_default": 0, "state_default": 50,
		"ban": 50, "kick": 50, "redact": 50, "invite": 0,
	}})
	p.add(peerEvent{Sender: p.creator, Type: spec.MRoomJoinRules, StateKey: &empty, Content: map[string]any{"join_rule": spec.Public}})
	p.add(peerEvent{Sender: p.creator, Type: spec.MRoomHistoryVisibility, StateKey: &empty, Content: map[string]any{"history_visibility": "shared"}})
	return p
}

// is12 tells whether the peer's room is of version 12.
func (p *gmslPeer) is12() bool { return roomversion.Is12(p.version) }

// allowedByPeer checks an event with the auth rules of its version
// (version 12: authrules; the provider must hold the create event).
func allowedByPeer(ev gomatrixserverlib.PDU, provider gomatrixserverlib.AuthEventProvider) error {
	return authrules.Allowed(ev, provider, peerUserIDForSender)
}

// authEvents12 is the auth_events of a version 12 event: gomatrixserverlib's
// selection without the create event, from state.
func authEvents12(proto *gomatrixserverlib.ProtoEvent, state peerState) ([]string, error) {
	needed, err := authrules.AuthEventsNeededForProto(proto)
	if err != nil {
		return nil, err
	}
	ids := []string{}
	for _, t := range needed.Tuples() {
		if ev := state[t]; ev != nil {
			ids = append(ids, ev.EventID())
		}
	}
	return ids, nil
}

// build builds an event of the peer's room on authState, with auth as
// its auth events when set, signed with key.
func (p *gmslPeer) build(proto *gomatrixserverlib.ProtoEvent, authState peerState, auth []string, key ed25519.PrivateKey) (gomatrixserverlib.PDU, error) {
	if !p.is12() {
		eb := p.impl.NewEventBuilderFromProtoEvent(proto)
		if err := eb.AddAuthEvents(authState.provider()); err != nil {
			return nil, fmt.Errorf("auth events of %s: %w", proto.Type, err)
		}
		if auth != nil {
			eb.AuthEvents = auth
		}
		proto.AuthEvents = eb.AuthEvents
		return eb.Build(time.Now(), spec.ServerName(p.Name), p.KeyID, key)
	}
	if auth == nil {
		var err error
		if auth, err = authEvents12(proto, authState); err != nil {
			return nil, fmt.Errorf("auth events of %s: %w", proto.Type, err)
		}
	}
	proto.AuthEvents = auth
	return roomversion.Build(p.version, proto, time.Now(), spec.ServerName(p.Name), p.KeyID, key)
}

// user is the ID of a user of the peer.
func (p *gmslPeer) user(localpart string) string { return "@" + localpart + ":" + p.Name }

// peerEvent describes an event for the peer to build.
type peerEvent struct {
	Sender   string
	Type     string
	StateKey *string
	Content  any
	// Prev are the prev_events (nil: the peer's forward extremities).
	Prev []string
	// AuthAt takes the auth events from the state after that event
	// instead of the state before the new one.
	AuthAt string
	// Auth, when set, are the auth events.
	Auth []string
	// Redacts is the event a redaction redacts.
	Redacts string
	// Unchecked skips the auth rules: an event meant to fail them.
	Unchecked bool
	// Detached leaves the event out of the forward extremities.
	Detached bool
	// Key signs the event instead of the peer's key.
	Key ed25519.PrivateKey
}

// add builds, signs and (unless Unchecked) authorises an event on the
// state after its prev_events, and keeps it.
func (p *gmslPeer) add(e peerEvent) gomatrixserverlib.PDU {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	prev := e.Prev
	if prev == nil {
		prev = slices.Clone(p.latest)
	}
	if prev == nil {
		prev = []string{} // the create event
	}
	before := p.stateAt(prev)
	content, err := json.Marshal(e.Content)
	if err != nil {
		p.t.Fatal(err)
	}
	proto := gomatrixserverlib.ProtoEvent{SenderID: e.Sender, RoomID: p.roomID, Type: e.Type, StateKey: e.StateKey,
		Content: content, PrevEvents: prev, Depth: p.depthAfter(prev), Redacts: e.Redacts}
	authState := before
	if e.AuthAt != "" {
		authState = p.stateAfter[e.AuthAt]
	}
	key := p.Key
	if e.Key != nil {
		key = e.Key
	}
	ev, err := p.build(&proto, authState, e.Auth, key)
	if err != nil {
		p.t.Fatalf("building %s: %v", e.Type, err)
	}
	if !e.Unchecked {
		if err := allowedByPeer(ev, before.provider()); err != nil {
			p.t.Fatalf("the peer's %s is not allowed: %v", e.Type, err)
		}
	}
	if p.roomID == "" && e.Type == spec.MRoomCreate {
		p.roomID = roomversion.RoomIDOfCreate(ev.EventID()) // version 12
	}
	p.keep(ev, before, !e.Detached)
	return ev
}

// resign hashes and signs an event's JSON as the peer, after a test
// changed it past what gomatrixserverlib's builder accepts.
func (p *gmslPeer) resign(obj map[string]any) json.RawMessage {
	p.t.Helper()
	delete(obj, "signatures")
	delete(obj, "unsigned")
	delete(obj, "hashes")
	raw, err := json.Marshal(obj)
	if err != nil {
		p.t.Fatal(err)
	}
	canonical, err := gomatrixserverlib.CanonicalJSON(raw)
	if err != nil {
		p.t.Fatal(err)
	}
	sum := sha256.Sum256(canonical)
	obj["hashes"] = map[string]string{"sha256": base64.RawStdEncoding.EncodeToString(sum[:])}
	raw, _ = json.Marshal(obj)
	redacted, err := p.impl.RedactEventJSON(raw)
	if err != nil {
		p.t.Fatal(err)
	}
	signed, err := gomatrixserverlib.SignJSON(p.Name, p.KeyID, p.Key, redacted)
	if err != nil {
		p.t.Fatal(err)
	}
	var sigs struct {
		Signatures json.RawMessage `json:"signatures"`
	}
	if err := json.Unmarshal(signed, &sigs); err != nil {
		p.t.Fatal(err)
	}
	obj["signatures"] = sigs.Signatures
	raw, _ = json.Marshal(obj)
	return raw
}

// replace puts another copy of a kept event in its place: the same event
// with more signatures (an invite signed by the invitee's server).
func (p *gmslPeer) replace(ev gomatrixserverlib.PDU) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.events[ev.EventID()] == nil {
		p.t.Fatalf("replacing unknown event %s", ev.EventID())
	}
	p.events[ev.EventID()] = ev
	for _, st := range p.stateAfter {
		for k, e := range st {
			if e.EventID() == ev.EventID() {
				st[k] = ev
			}
		}
	}
}

// keep stores an event with the state before it; extremity makes it a
// forward extremity in place of its prev_events.
func (p *gmslPeer) keep(ev gomatrixserverlib.PDU, before peerState, extremity bool) {
	after := maps.Clone(before)
	if ev.StateKey() != nil {
		after[gomatrixserverlib.StateKeyTuple{EventType: ev.Type(), StateKey: *ev.StateKey()}] = ev
	}
	p.events[ev.EventID()] = ev
	p.stateAfter[ev.EventID()] = after
	if extremity {
		p.latest = slices.DeleteFunc(p.latest, func(id string) bool { return slices.Contains(ev.PrevEventIDs(), id) })
		p.latest = append(p.latest, ev.EventID())
	}
}

func (p *gmslPeer) depthAfter(prev []string) int64 {
	depth := int64(0)
	for _, id := range prev {
		if ev := p.events[id]; ev != nil { // an event of another room: none
			depth = max(depth, ev.Depth())
		}
	}
	return depth + 1
}

// stateAt is the state after prev: one event's, or their states resolved.
func (p *gmslPeer) stateAt(prev []string) peerState {
	switch len(prev) {
	case 0:
		return peerState{}
	case 1:
		return p.stateAfter[prev[0]]
	}
	var all []gomatrixserverlib.PDU
	conflicted := false
	union := peerState{}
	for _, id := range prev {
		for k, ev := range p.stateAfter[id] {
			if have, ok := union[k]; ok && have.EventID() != ev.EventID() {
				conflicted = true
			}
			union[k] = ev
			all = append(all, ev)
		}
	}
	if !conflicted {
		return union
	}
	if p.is12() {
		states := make([][]gomatrixserverlib.PDU, 0, len(prev))
		for _, id := range prev {
			states = append(states, p.stateAfter[id].list())
		}
		resolved, err := stateres.ResolveV21(states, append(p.authChain(all), all...), allowedByPeer, nil)
		if err != nil {
			p.t.Fatalf("state resolution: %v", err)
		}
		out := peerState{}
		for _, ev := range resolved {
			out[gomatrixserverlib.StateKeyTuple{EventType: ev.Type(), StateKey: *ev.StateKey()}] = ev
		}
		return out
	}
	resolved, err := gomatrixserverlib.ResolveConflicts(p.version, all, p.authChain(all), peerUserIDForSender,
		func(string) bool { return false })
	if err != nil {
		p.t.Fatalf("state resolution: %v", err)
	}
	out := peerState{}
	for _, ev := range resolved {
		out[gomatrixserverlib.StateKeyTuple{EventType: ev.Type(), StateKey: *ev.StateKey()}] = ev
	}
	return out
}

// extremities returns the room's forward extremities.
func (p *gmslPeer) extremities() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.latest)
}

// current is the room's current state.
func (p *gmslPeer) current() peerState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stateAt(p.latest)
}

// authChain is every event reachable through auth_events from evs.
func (p *gmslPeer) authChain(evs []gomatrixserverlib.PDU) []gomatrixserverlib.PDU {
	seen := map[string]bool{}
	var out []gomatrixserverlib.PDU
	next := slices.Clone(evs)
	for len(next) > 0 {
		ev := next[0]
		next = next[1:]
		for _, id := range ev.AuthEventIDs() {
			if a := p.events[id]; a != nil && !seen[id] {
				seen[id] = true
				out = append(out, a)
				next = append(next, a)
			}
		}
	}
	return out
}

func (p *gmslPeer) count(endpoint string) {
	p.mu.Lock()
	p.calls[endpoint]++
	p.mu.Unlock()
}

// missingMinDepths returns the min_depth of each get_missing_events.
func (p *gmslPeer) missingMinDepths() []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.minDepths)
}

// served returns how many requests an endpoint had.
func (p *gmslPeer) served(endpoint string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[endpoint]
}

func rawEvents(evs ...gomatrixserverlib.PDU) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(evs))
	for _, ev := range evs {
		out = append(out, json.RawMessage(ev.JSON()))
	}
	return out
}

func eventIDs(evs []gomatrixserverlib.PDU) []string {
	out := make([]string, 0, len(evs))
	for _, ev := range evs {
		out = append(out, ev.EventID())
	}
	return out
}

// verify checks a request's X-Matrix signature with the peer's key ring,
// answering it when it fails.
// enter counts a call of an endpoint, runs the failure the test set for
// it (read by fail under the lock) if any, else checks the request's
// signature: nil when the request is answered already.
func (p *gmslPeer) enter(w http.ResponseWriter, r *http.Request, name string, fail func() http.HandlerFunc) *fclient.FederationRequest {
	p.mu.Lock()
	p.calls[name]++
	f := fail()
	p.mu.Unlock()
	if f != nil {
		f(w, r)
		return nil
	}
	return p.verify(w, r)
}

func (p *gmslPeer) verify(w http.ResponseWriter, r *http.Request) *fclient.FederationRequest {
	fr, resp := fclient.VerifyHTTPRequest(r, time.Now(), spec.ServerName(p.Name), nil, p.keyRing)
	if fr == nil {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(resp.Code)
		_ = json.NewEncoder(w).Encode(resp.JSON)
	}
	return fr
}

func writeStatus(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeSpecError answers gomatrixserverlib's errors as a homeserver does.
func writeSpecError(w http.ResponseWriter, err error) {
	var me spec.MatrixError
	var irv spec.IncompatibleRoomVersionError
	switch {
	case errors.As(err, &irv):
		writeStatus(w, http.StatusBadRequest, irv)
	case errors.As(err, &me) && me.ErrCode == spec.ErrorForbidden:
		writeStatus(w, http.StatusForbidden, me)
	case errors.As(err, &me):
		writeStatus(w, http.StatusBadRequest, me)
	default:
		writeStatus(w, http.StatusInternalServerError, map[string]string{"errcode": "M_UNKNOWN", "error": err.Error()})
	}
}

func (p *gmslPeer) serve() {
	mux := p.Mux
	mux.HandleFunc("GET /_matrix/federation/v1/make_join/{roomId}/{userId}", p.makeJoin)
	mux.HandleFunc("PUT /_matrix/federation/v2/send_join/{roomId}/{eventId}", p.unlessV1Only(p.sendJoin))
	mux.HandleFunc("GET /_matrix/federation/v1/make_leave/{roomId}/{userId}", p.makeLeave)
	mux.HandleFunc("PUT /_matrix/federation/v2/send_leave/{roomId}/{eventId}", p.unlessV1Only(p.sendLeave))
	mux.HandleFunc("PUT /_matrix/federation/v1/send_join/{roomId}/{eventId}", p.asV1("v1 send_join", p.sendJoin))
	mux.HandleFunc("PUT /_matrix/federation/v1/send_leave/{roomId}/{eventId}", p.asV1("v1 send_leave", p.sendLeave))
	mux.HandleFunc("GET /_matrix/federation/v1/event/{eventId}", func(w http.ResponseWriter, r *http.Request) {
		if p.verify(w, r) == nil {
			return
		}
		p.count("event")
		p.mu.Lock()
		ev := p.events[r.PathValue("eventId")]
		p.mu.Unlock()
		if ev == nil {
			writeStatus(w, http.StatusNotFound, map[string]string{"errcode": "M_NOT_FOUND", "error": "unknown event"})
			return
		}
		writeJSON(w, map[string]any{"origin": p.Name, "origin_server_ts": time.Now().UnixMilli(), "pdus": rawEvents(ev)})
	})
	mux.HandleFunc("GET /_matrix/federation/v1/state_ids/{roomId}", func(w http.ResponseWriter, r *http.Request) {
		if p.verify(w, r) == nil {
			return
		}
		p.count("state_ids")
		p.mu.Lock()
		defer p.mu.Unlock()
		state, authChain, ok := p.stateFor(r.PathValue("roomId"), r.URL.Query().Get("event_id"))
		if !ok {
			writeStatus(w, http.StatusNotFound, map[string]string{"errcode": "M_NOT_FOUND", "error": "unknown event"})
			return
		}
		writeJSON(w, map[string]any{"pdu_ids": eventIDs(state), "auth_chain_ids": eventIDs(authChain)})
	})
	mux.HandleFunc("GET /_matrix/federation/v1/state/{roomId}", func(w http.ResponseWriter, r *http.Request) {
		if p.verify(w, r) == nil {
			return
		}
		p.count("state")
		p.mu.Lock()
		defer p.mu.Unlock()
		state, authChain, ok := p.stateFor(r.PathValue("roomId"), r.URL.Query().Get("event_id"))
		if !ok {
			writeStatus(w, http.StatusNotFound, map[string]string{"errcode": "M_NOT_FOUND", "error": "unknown event"})
			return
		}
		writeJSON(w, map[string]any{"pdus": rawEvents(state...), "auth_chain": rawEvents(authChain...)})
	})
	mux.HandleFunc("POST /_matrix/federation/v1/get_missing_events/{roomId}", p.missingEvents)
	mux.HandleFunc("GET /_matrix/federation/v1/backfill/{roomId}", p.backfill)
	mux.HandleFunc("PUT /_matrix/federation/v1/send/{txnId}", p.receive)
	// The daemon tracks the device lists of the room's users: they have
	// no devices unless the test says otherwise.
	mux.HandleFunc("GET /_matrix/federation/v1/user/devices/{userId}", func(w http.ResponseWriter, r *http.Request) {
		if p.verify(w, r) == nil {
			return
		}
		p.mu.Lock()
		p.calls["user_devices"]++
		answer := p.devicesAnswer
		p.mu.Unlock()
		if answer != nil {
			status, body := answer(r.PathValue("userId"))
			writeStatus(w, status, body)
			return
		}
		writeJSON(w, map[string]any{"user_id": r.PathValue("userId"), "stream_id": 1, "devices": []any{}})
	})
}

// setV1Only makes the peer serve the v1 handshakes only.
func (p *gmslPeer) setV1Only(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.v1Only = on
}

// unlessV1Only answers a v2 handshake as an older server does, which
// does not know the path, when the peer is v1 only.
func (p *gmslPeer) unlessV1Only(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		old := p.v1Only
		p.mu.Unlock()
		if old {
			p.count("v2 refused")
			writeStatus(w, http.StatusNotFound, map[string]string{"errcode": "M_UNRECOGNIZED", "error": "Unrecognized request"})
			return
		}
		h(w, r)
	}
}

// asV1 serves a v1 handshake, counted as name: the v2 answer, wrapped
// in [200, answer] when it succeeds.
func (p *gmslPeer) asV1(name string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p.count(name)
		rec := httptest.NewRecorder()
		h(rec, r)
		if rec.Code != http.StatusOK {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(rec.Code)
			w.Write(rec.Body.Bytes())
			return
		}
		writeJSON(w, []any{200, json.RawMessage(rec.Body.Bytes())})
	}
}

// peerQuerier answers gomatrixserverlib's questions about the room, with
// the peer's lock held.
type peerQuerier struct{ p *gmslPeer }

func (q peerQuerier) CurrentMembership(_ context.Context, _ spec.RoomID, senderID spec.SenderID) (string, error) {
	ev := q.p.stateAt(q.p.latest)[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomMember, StateKey: string(senderID)}]
	if ev == nil {
		return spec.Leave, nil
	}
	return ev.Membership()
}

func (q peerQuerier) CurrentStateEvent(_ context.Context, _ spec.RoomID, evType, stateKey string) (gomatrixserverlib.PDU, error) {
	return q.p.stateAt(q.p.latest)[gomatrixserverlib.StateKeyTuple{EventType: evType, StateKey: stateKey}], nil
}

func (q peerQuerier) InvitePending(ctx context.Context, roomID spec.RoomID, senderID spec.SenderID) (bool, error) {
	m, err := q.CurrentMembership(ctx, roomID, senderID)
	return m == spec.Invite, err
}

func (q peerQuerier) RestrictedRoomJoinInfo(context.Context, spec.RoomID, spec.SenderID, spec.ServerName) (*gomatrixserverlib.RestrictedRoomJoinInfo, error) {
	return &gomatrixserverlib.RestrictedRoomJoinInfo{}, nil
}

// makeJoin answers a join template built on the room's current state
// (gomatrixserverlib.HandleMakeJoin).
func (p *gmslPeer) makeJoin(w http.ResponseWriter, r *http.Request) {
	fr := p.enter(w, r, "make_join", func() http.HandlerFunc { return p.failMakeJoin })
	if fr == nil {
		return
	}
	user, err := spec.NewUserID(r.PathValue("userId"), true)
	if err != nil || r.PathValue("roomId") != p.roomID {
		writeStatus(w, http.StatusNotFound, map[string]string{"errcode": "M_NOT_FOUND", "error": "unknown room or user"})
		return
	}
	rid, _ := roomversion.ParseRoomID(p.roomID)
	var remote []gomatrixserverlib.RoomVersion
	for _, v := range r.URL.Query()["ver"] {
		remote = append(remote, gomatrixserverlib.RoomVersion(v))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.offered = append(p.offered, r.URL.Query()["ver"])
	if p.is12() {
		p.makeMembership12(w, fr, *user, spec.Join, remote)
		return
	}
	res, err := gomatrixserverlib.HandleMakeJoin(gomatrixserverlib.HandleMakeJoinInput{
		Context: r.Context(), UserID: *user, SenderID: spec.SenderID(user.String()), RoomID: rid,
		RoomVersion: p.version, RemoteVersions: remote, RequestOrigin: fr.Origin(),
		LocalServerName: spec.ServerName(p.Name), LocalServerInRoom: true,
		RoomQuerier: peerQuerier{p}, UserIDQuerier: peerUserIDForSender,
		BuildEventTemplate: p.buildTemplate,
	})
	if err != nil {
		writeSpecError(w, err)
		return
	}
	p.templates = append(p.templates, res.JoinTemplateEvent)
	writeJSON(w, map[string]any{"room_version": res.RoomVersion, "event": res.JoinTemplateEvent})
}

// makeJoinIn answers make_join with a template of the room's current
// state in another room version: a server hosting a room of that version.
func (p *gmslPeer) makeJoinIn(w http.ResponseWriter, r *http.Request, version string) {
	userID := r.PathValue("userId")
	p.mu.Lock()
	defer p.mu.Unlock()
	proto := gomatrixserverlib.ProtoEvent{SenderID: userID, RoomID: p.roomID, Type: spec.MRoomMember, StateKey: &userID,
		Content: []byte(`{"membership":"join"}`), PrevEvents: slices.Clone(p.latest), Depth: p.depthAfter(p.latest)}
	eb := p.impl.NewEventBuilderFromProtoEvent(&proto)
	if err := eb.AddAuthEvents(p.stateAt(p.latest).provider()); err != nil {
		p.t.Error(err)
	}
	proto.AuthEvents = eb.AuthEvents
	writeJSON(w, map[string]any{"room_version": version, "event": proto})
}

// buildTemplate builds a membership template on the room's current
// state, as make_join and make_leave answer it.
func (p *gmslPeer) buildTemplate(proto *gomatrixserverlib.ProtoEvent) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU, error) {
	state := p.stateAt(p.latest)
	proto.PrevEvents = slices.Clone(p.latest)
	proto.Depth = p.depthAfter(p.latest)
	ev, err := p.build(proto, state, nil, p.Key)
	return ev, state.list(), err
}

// makeMembership12 answers make_join or make_leave in a version 12 room
// with the peer's own steps: gomatrixserverlib.HandleMakeJoin and
// HandleMakeLeave check the template with the auth rules of version 11.
// The same checks: a version the remote supports, the user's server
// asking, a template the rules of version 12 allow on the current state.
func (p *gmslPeer) makeMembership12(w http.ResponseWriter, fr *fclient.FederationRequest, user spec.UserID, membership string, remote []gomatrixserverlib.RoomVersion) {
	if !slices.Contains(remote, p.version) {
		writeStatus(w, http.StatusBadRequest, spec.IncompatibleRoomVersion(string(p.version)))
		return
	}
	if user.Domain() != fr.Origin() {
		writeStatus(w, http.StatusForbidden, spec.Forbidden("the user is not of the requesting server"))
		return
	}
	sk := user.String()
	content, _ := json.Marshal(map[string]any{"membership": membership})
	proto := gomatrixserverlib.ProtoEvent{SenderID: sk, RoomID: p.roomID, Type: spec.MRoomMember, StateKey: &sk, Content: content}
	ev, state, err := p.buildTemplate(&proto)
	if err != nil {
		writeSpecError(w, err)
		return
	}
	provider := gomatrixserverlib.NewAuthEvents(state)
	if err := allowedByPeer(ev, &provider); err != nil {
		writeStatus(w, http.StatusForbidden, spec.Forbidden(err.Error()))
		return
	}
	if membership == spec.Join {
		p.templates = append(p.templates, proto)
	}
	writeJSON(w, map[string]any{"room_version": p.version, "event": proto})
}

// makeLeave answers a leave template (gomatrixserverlib.HandleMakeLeave).
func (p *gmslPeer) makeLeave(w http.ResponseWriter, r *http.Request) {
	fr := p.verify(w, r)
	if fr == nil {
		return
	}
	p.count("make_leave")
	user, err := spec.NewUserID(r.PathValue("userId"), true)
	if err != nil || r.PathValue("roomId") != p.roomID {
		writeStatus(w, http.StatusNotFound, map[string]string{"errcode": "M_NOT_FOUND", "error": "unknown room or user"})
		return
	}
	rid, _ := roomversion.ParseRoomID(p.roomID)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.is12() {
		p.makeMembership12(w, fr, *user, spec.Leave, []gomatrixserverlib.RoomVersion{p.version})
		return
	}
	res, err := gomatrixserverlib.HandleMakeLeave(gomatrixserverlib.HandleMakeLeaveInput{
		UserID: *user, SenderID: spec.SenderID(user.String()), RoomID: rid, RoomVersion: p.version,
		RequestOrigin: fr.Origin(), LocalServerName: spec.ServerName(p.Name), LocalServerInRoom: true,
		UserIDQuerier: peerUserIDForSender, BuildEventTemplate: p.buildTemplate,
	})
	if err != nil {
		writeSpecError(w, err)
		return
	}
	writeJSON(w, map[string]any{"room_version": res.RoomVersion, "event": res.LeaveTemplateEvent})
}

// sendLeave accepts a leave of the requesting server's user that the
// auth rules allow.
func (p *gmslPeer) sendLeave(w http.ResponseWriter, r *http.Request) {
	fr := p.verify(w, r)
	if fr == nil {
		return
	}
	p.count("send_leave")
	ev, err := p.impl.NewEventFromUntrustedJSON(fr.Content())
	if err == nil && ev.EventID() != r.PathValue("eventId") {
		err = errors.New("the event ID differs from the path's")
	}
	if err == nil {
		err = gomatrixserverlib.VerifyEventSignatures(r.Context(), ev, p.keyRing, peerUserIDForSender)
	}
	if err != nil {
		writeStatus(w, http.StatusBadRequest, map[string]string{"errcode": "M_BAD_JSON", "error": err.Error()})
		return
	}
	m, _ := ev.Membership()
	if m != spec.Leave || ev.StateKey() == nil || *ev.StateKey() != string(ev.SenderID()) || senderServer(ev.SenderID()) != fr.Origin() {
		writeStatus(w, http.StatusBadRequest, map[string]string{"errcode": "M_BAD_JSON", "error": "not a leave of the requesting server's user"})
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	before := p.stateAt(ev.PrevEventIDs())
	if err := allowedByPeer(ev, before.provider()); err != nil {
		writeStatus(w, http.StatusForbidden, map[string]string{"errcode": "M_FORBIDDEN", "error": err.Error()})
		return
	}
	p.keep(ev, before, true)
	writeJSON(w, map[string]any{})
}

func senderServer(sender spec.SenderID) spec.ServerName {
	u, err := spec.NewUserID(string(sender), true)
	if err != nil {
		return ""
	}
	return u.Domain()
}

// sendJoin accepts a join (gomatrixserverlib.HandleSendJoin, then the
// auth rules against the state before it) and answers the state before
// it with its auth chain.
func (p *gmslPeer) sendJoin(w http.ResponseWriter, r *http.Request) {
	fr := p.enter(w, r, "send_join", func() http.HandlerFunc { return p.failSendJoin })
	if fr == nil {
		return
	}
	rid, err := roomversion.ParseRoomID(r.PathValue("roomId"))
	if err != nil || rid.String() != p.roomID {
		writeStatus(w, http.StatusNotFound, map[string]string{"errcode": "M_NOT_FOUND", "error": "unknown room"})
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	res, err := gomatrixserverlib.HandleSendJoin(gomatrixserverlib.HandleSendJoinInput{
		Context: r.Context(), RoomID: rid, EventID: r.PathValue("eventId"), JoinEvent: spec.RawJSON(fr.Content()),
		RoomVersion: p.version, RequestOrigin: fr.Origin(), LocalServerName: spec.ServerName(p.Name),
		KeyID: p.KeyID, PrivateKey: p.Key, Verifier: p.keyRing, MembershipQuerier: peerQuerier{p},
		UserIDQuerier:             peerUserIDForSender,
		StoreSenderIDFromPublicID: func(context.Context, spec.SenderID, string, spec.RoomID) error { return nil },
	})
	if err != nil {
		writeSpecError(w, err)
		return
	}
	join := res.JoinEvent
	before := p.stateAt(join.PrevEventIDs())
	if err := allowedByPeer(join, before.provider()); err != nil {
		writeStatus(w, http.StatusForbidden, map[string]string{"errcode": "M_FORBIDDEN", "error": err.Error()})
		return
	}
	p.joins = append(p.joins, join)
	p.keep(join, before, true)
	state := before.list()
	answer := map[string]any{
		"origin": p.Name, "state": rawEvents(state...), "auth_chain": rawEvents(p.authChain(append(state, join))...),
		"event": json.RawMessage(join.JSON()), "members_omitted": false, "servers_in_room": []string{p.Name},
	}
	if p.editSendJoin != nil {
		p.editSendJoin(answer)
	}
	writeJSON(w, answer)
}

// missingEvents walks back from latest_events to earliest_events, at
// most limit events, answered oldest first.
func (p *gmslPeer) missingEvents(w http.ResponseWriter, r *http.Request) {
	fr := p.verify(w, r)
	if fr == nil {
		return
	}
	p.count("get_missing_events")
	var req struct {
		Earliest []string `json:"earliest_events"`
		Latest   []string `json:"latest_events"`
		Limit    int      `json:"limit"`
		MinDepth int64    `json:"min_depth"`
	}
	if err := json.Unmarshal(fr.Content(), &req); err != nil {
		writeStatus(w, http.StatusBadRequest, map[string]string{"errcode": "M_BAD_JSON", "error": err.Error()})
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// min_depth is recorded, not honoured: the daemon must not rely on it.
	p.minDepths = append(p.minDepths, req.MinDepth)
	if p.noMissingEvents {
		writeJSON(w, map[string]any{"events": []any{}})
		return
	}
	if p.failMissingEvents {
		writeStatus(w, http.StatusInternalServerError, map[string]string{"errcode": "M_UNKNOWN", "error": "broken"})
		return
	}
	seen := map[string]bool{}
	for _, id := range append(slices.Clone(req.Earliest), req.Latest...) {
		seen[id] = true
	}
	var next []string
	for _, id := range req.Latest {
		if ev := p.events[id]; ev != nil {
			next = append(next, ev.PrevEventIDs()...)
		}
	}
	var out []gomatrixserverlib.PDU
	for len(next) > 0 && len(out) < req.Limit {
		id := next[0]
		next = next[1:]
		ev := p.events[id]
		if seen[id] || ev == nil {
			continue
		}
		seen[id] = true
		out = append(out, ev)
		next = append(next, ev.PrevEventIDs()...)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Depth() < out[j].Depth() != p.missingNewestFirst })
	writeJSON(w, map[string]any{"events": append(p.missingExtra, rawEvents(out...)...)})
}

// backfill walks back from the v events (included) over prev_events,
// breadth-first, at most limit events, answered newest first, with
// backfillExtra added.
func (p *gmslPeer) backfill(w http.ResponseWriter, r *http.Request) {
	if p.verify(w, r) == nil {
		return
	}
	p.count("backfill")
	limit, err := strconv.Atoi(r.URL.Query().Get("limit"))
	if err != nil || r.PathValue("roomId") != p.roomID {
		writeStatus(w, http.StatusBadRequest, map[string]string{"errcode": "M_INVALID_PARAM", "error": "bad limit or room"})
		return
	}
	p.mu.Lock()
	if p.hangBackfill {
		p.mu.Unlock()
		<-r.Context().Done()
		return
	}
	defer p.mu.Unlock()
	if p.failBackfill {
		writeStatus(w, http.StatusInternalServerError, map[string]string{"errcode": "M_UNKNOWN", "error": "broken"})
		return
	}
	seen := map[string]bool{}
	next := r.URL.Query()["v"]
	var out []gomatrixserverlib.PDU
	for len(next) > 0 && len(out) < limit {
		id := next[0]
		next = next[1:]
		ev := p.events[id]
		if seen[id] || ev == nil {
			continue
		}
		seen[id] = true
		out = append(out, ev)
		next = append(next, ev.PrevEventIDs()...)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Depth() > out[j].Depth() })
	writeJSON(w, map[string]any{"origin": p.Name, "origin_server_ts": time.Now().UnixMilli(),
		"pdus": append(rawEvents(out...), p.backfillExtra...)})
}

// history lists the events from id back to the room's create event,
// newest first, following the first prev_event of each.
func (p *gmslPeer) history(id string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for ev := p.events[id]; ev != nil; {
		out = append(out, ev.EventID())
		prev := ev.PrevEventIDs()
		if len(prev) == 0 {
			break
		}
		ev = p.events[prev[0]]
	}
	return out
}

// receive takes a transaction from the daemon: each PDU is checked
// (format, signatures) and recorded; one the room's rules allow on known
// prev_events joins the room's events.
func (p *gmslPeer) receive(w http.ResponseWriter, r *http.Request) {
	fr := p.verify(w, r)
	if fr == nil {
		return
	}
	p.count("send")
	var txn struct {
		PDUs []json.RawMessage `json:"pdus"`
	}
	if err := json.Unmarshal(fr.Content(), &txn); err != nil {
		writeStatus(w, http.StatusBadRequest, map[string]string{"errcode": "M_BAD_JSON", "error": err.Error()})
		return
	}
	results := map[string]any{}
	for _, raw := range txn.PDUs {
		ev, err := p.impl.NewEventFromUntrustedJSON(raw)
		if err != nil {
			continue
		}
		if err := gomatrixserverlib.VerifyEventSignatures(r.Context(), ev, p.keyRing, peerUserIDForSender); err != nil {
			results[ev.EventID()] = map[string]string{"error": err.Error()}
			continue
		}
		p.mu.Lock()
		p.received = append(p.received, ev)
		known := true
		for _, id := range ev.PrevEventIDs() {
			known = known && p.events[id] != nil
		}
		if known && p.events[ev.EventID()] == nil {
			before := p.stateAt(ev.PrevEventIDs())
			if allowedByPeer(ev, before.provider()) == nil {
				p.keep(ev, before, true)
			}
		}
		p.mu.Unlock()
		results[ev.EventID()] = map[string]any{}
	}
	writeJSON(w, map[string]any{"pdus": results})
}

// handshakes returns the templates answered by make_join and the joins
// received in send_join.
func (p *gmslPeer) handshakes() ([]gomatrixserverlib.ProtoEvent, []gomatrixserverlib.PDU) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.templates), slices.Clone(p.joins)
}

// offeredVersions returns the room versions each make_join offered.
func (p *gmslPeer) offeredVersions() [][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.offered)
}

// receivedPDUs returns the PDUs the daemon sent.
func (p *gmslPeer) receivedPDUs() []gomatrixserverlib.PDU {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.received)
}

// send sends raw PDUs to a node in one transaction from the peer and
// returns each PDU's result by event ID ("" when accepted).
func (p *gmslPeer) send(t testing.TB, n *testutil.Node, pdus ...json.RawMessage) map[string]string {
	t.Helper()
	p.mu.Lock()
	p.txn++
	txnID := fmt.Sprintf("peertxn%d", p.txn)
	p.mu.Unlock()
	body := map[string]any{"origin": p.Name, "origin_server_ts": time.Now().UnixMilli(), "pdus": pdus, "edus": []any{}}
	r := testutil.SendTo(t, n, p.SignedRequest(t, "PUT", n.ServerName, p.SendPath(txnID), body, "", nil))
	if r.Status != http.StatusOK {
		t.Fatalf("/send: %d %s", r.Status, r.Raw)
	}
	out := map[string]string{}
	results, _ := r.Body["pdus"].(map[string]any)
	for id, res := range results {
		m, _ := res.(map[string]any)
		if m == nil {
			t.Fatalf("/send result of %s is not an object: %s", id, r.Raw)
		}
		e, _ := m["error"].(string)
		if _, has := m["error"]; has && e == "" {
			t.Fatalf("/send result of %s has an empty error: %s", id, r.Raw)
		}
		out[id] = e
	}
	return out
}

// sendEDUs sends EDUs in one transaction and fails the test unless it
// is answered 200.
func (p *gmslPeer) sendEDUs(t testing.TB, n *testutil.Node, edus ...map[string]any) {
	t.Helper()
	p.mu.Lock()
	p.txn++
	txnID := fmt.Sprintf("peertxn%d", p.txn)
	p.mu.Unlock()
	body := map[string]any{"origin": p.Name, "origin_server_ts": time.Now().UnixMilli(), "pdus": []any{}, "edus": edus}
	if r := testutil.SendTo(t, n, p.SignedRequest(t, "PUT", n.ServerName, p.SendPath(txnID), body, "", nil)); r.Status != http.StatusOK {
		t.Fatalf("/send: %d %s", r.Status, r.Raw)
	}
}

// sendEvents sends events and fails the test unless each was accepted.
func (p *gmslPeer) sendEvents(t testing.TB, n *testutil.Node, evs ...gomatrixserverlib.PDU) {
	t.Helper()
	res := p.send(t, n, rawEvents(evs...)...)
	for _, ev := range evs {
		if e, ok := res[ev.EventID()]; !ok || e != "" {
			t.Fatalf("%s (%s) not accepted: %q (answer %v)", ev.EventID(), ev.Type(), e, res)
		}
	}
}

// memoryKeys is the peer key ring's cache of other servers' keys.
type memoryKeys struct {
	mu   sync.Mutex
	keys map[gomatrixserverlib.PublicKeyLookupRequest]gomatrixserverlib.PublicKeyLookupResult
}

func (*memoryKeys) FetcherName() string { return "memory" }

func (m *memoryKeys) FetchKeys(_ context.Context, reqs map[gomatrixserverlib.PublicKeyLookupRequest]spec.Timestamp) (
	map[gomatrixserverlib.PublicKeyLookupRequest]gomatrixserverlib.PublicKeyLookupResult, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[gomatrixserverlib.PublicKeyLookupRequest]gomatrixserverlib.PublicKeyLookupResult{}
	for r := range reqs {
		if k, ok := m.keys[r]; ok {
			out[r] = k
		}
	}
	return out, nil
}

func (m *memoryKeys) StoreKeys(_ context.Context, results map[gomatrixserverlib.PublicKeyLookupRequest]gomatrixserverlib.PublicKeyLookupResult) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	maps.Copy(m.keys, results)
	return nil
}

// The daemon's side, through its client API.

// joinPeerRoom joins u on n to the peer's room through the peer.
func joinPeerRoom(t testing.TB, n *testutil.Node, u *testutil.User, p *gmslPeer) {
	t.Helper()
	r := n.Must(t, "POST", "/_matrix/client/v3/join/"+url.PathEscape(p.roomID)+"?server_name="+url.QueryEscape(p.Name), u.Token, map[string]any{})
	if r["room_id"] != p.roomID {
		t.Fatalf("join answered %v", r)
	}
}

// daemonState is a room's current state on n as "type|state_key" ->
// event ID.
func daemonState(t testing.TB, n *testutil.Node, u *testutil.User, roomID string) map[string]string {
	t.Helper()
	status, raw := roomStateRaw(t, n, u, roomID)
	if status != http.StatusOK {
		t.Fatalf("room state: %d %s", status, raw)
	}
	var evs []struct {
		Type     string `json:"type"`
		StateKey string `json:"state_key"`
		EventID  string `json:"event_id"`
	}
	if err := json.Unmarshal(raw, &evs); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, ev := range evs {
		out[ev.Type+"|"+ev.StateKey] = ev.EventID
	}
	return out
}

// roomStateRaw is GET /rooms/{roomId}/state, whose answer is a list.
func roomStateRaw(t testing.TB, n *testutil.Node, u *testutil.User, roomID string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest("GET", n.URL+rpath(roomID, "/state"), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+u.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

// timelineEvent is an event of a /sync timeline.
type timelineEvent struct {
	EventID string         `json:"event_id"`
	Type    string         `json:"type"`
	Sender  string         `json:"sender"`
	Content map[string]any `json:"content"`
}

// roomTimeline runs an incremental /sync and returns a room's timeline
// events and the next token.
func roomTimeline(t testing.TB, n *testutil.Node, u *testutil.User, roomID, since string) ([]timelineEvent, string) {
	t.Helper()
	filter := url.QueryEscape(`{"room":{"timeline":{"limit":100}}}`)
	r := n.Do(t, "GET", "/_matrix/client/v3/sync?timeout=0&filter="+filter+"&since="+url.QueryEscape(since), u.Token, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("/sync: %d %s", r.Status, r.Raw)
	}
	var body struct {
		NextBatch string `json:"next_batch"`
		Rooms     struct {
			Join map[string]struct {
				Timeline struct {
					Events []timelineEvent `json:"events"`
				} `json:"timeline"`
			} `json:"join"`
		} `json:"rooms"`
	}
	if err := json.Unmarshal(r.Raw, &body); err != nil {
		t.Fatal(err)
	}
	return body.Rooms.Join[roomID].Timeline.Events, body.NextBatch
}

func timelineIDs(evs []timelineEvent) []string {
	out := make([]string, 0, len(evs))
	for _, ev := range evs {
		out = append(out, ev.EventID)
	}
	return out
}

// refIDs reads prev_events or auth_events in either format: event IDs,
// or [event ID, hashes] pairs (versions 1 and 2).
func refIDs(t testing.TB, v any) []string {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var plain []string
	if json.Unmarshal(raw, &plain) == nil {
		return plain
	}
	var ids []string
	var pairs [][]json.RawMessage
	if err := json.Unmarshal(raw, &pairs); err != nil {
		t.Fatalf("not event references: %s", raw)
	}
	for _, pair := range pairs {
		var id string
		if len(pair) == 0 || json.Unmarshal(pair[0], &id) != nil {
			t.Fatalf("not an event reference: %s", raw)
		}
		ids = append(ids, id)
	}
	return ids
}
