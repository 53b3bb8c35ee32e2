package authrules

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/tidwall/sjson"

	"github.com/keyserver/keyserver/roomversion"
)

// Users of the test rooms. The creator is on one server, the others on
// another, so that no rule can lean on the room ID's domain.
const (
	creator  = "@alice:creator.example"
	coCreate = "@carol:other.example" // an additional creator
	admin    = "@adam:other.example"  // power level 100
	mod      = "@mona:other.example"  // power level 50
	user     = "@bob:other.example"   // power level 0
	stranger = "@sam:other.example"   // never in the room
)

// alteredEvent is an event whose content is replaced after it was built,
// to give the rules content that the event builders refuse to write but
// that other servers may send (e.g. floats, which canonical JSON forbids).
type alteredEvent struct {
	gomatrixserverlib.PDU
	content []byte
}

func (e *alteredEvent) Content() []byte { return e.content }

// withContent gives an event another content.
func withContent(ev gomatrixserverlib.PDU, content string) gomatrixserverlib.PDU {
	return &alteredEvent{PDU: ev, content: []byte(content)}
}

var (
	signingKey  ed25519.PrivateKey
	roomCounter atomic.Int64
)

func init() {
	_, signingKey, _ = ed25519.GenerateKey(nil)
}

// room is a test room: its create event and current state, and the last
// event, which the next one follows.
type room struct {
	t       testing.TB
	version gomatrixserverlib.RoomVersion
	roomID  spec.RoomID
	create  gomatrixserverlib.PDU
	state   map[gomatrixserverlib.StateKeyTuple]gomatrixserverlib.PDU
	prev    []string
	depth   int64
}

// createOpts shape the create event of a new room.
type createOpts struct {
	sender     string
	content    map[string]any
	keepRoomID bool     // give the create event a room_id
	prev       []string // prev_events of the create event
	stateKey   *string  // default ""
}

// newCreate builds a version 12 create event, and the room it names.
func newCreate(t testing.TB, o createOpts) (gomatrixserverlib.PDU, spec.RoomID) {
	t.Helper()
	if o.sender == "" {
		o.sender = creator
	}
	if o.content == nil {
		o.content = map[string]any{"room_version": "12"}
	}
	if o.stateKey == nil {
		o.stateKey = ptr("")
	}
	// Create events of one sender and content built in one millisecond are
	// one event: the nonce keeps the test rooms apart.
	content := map[string]any{"nonce": roomCounter.Add(1)}
	for k, v := range o.content {
		content[k] = v
	}
	proto := &gomatrixserverlib.ProtoEvent{
		SenderID: o.sender, Type: spec.MRoomCreate, StateKey: o.stateKey,
		PrevEvents: nonNil(o.prev), AuthEvents: []string{}, Depth: 1, Content: mustJSON(t, content),
	}
	if *o.stateKey != "" {
		proto.RoomID = "!notacreate"
	}
	ev := build(t, roomversion.V12, proto)
	if o.keepRoomID {
		// As a server would send it: a room_id, whatever its value.
		withRoomID, err := sjson.SetBytes(ev.JSON(), "room_id", roomversion.RoomIDOfCreate(ev.EventID()))
		if err != nil {
			t.Fatal(err)
		}
		if ev, err = gomatrixserverlib.MustGetRoomVersion(roomversion.V12).NewEventFromTrustedJSON(withRoomID, false); err != nil {
			t.Fatal(err)
		}
	}
	return ev, ev.RoomID()
}

// newRoom starts a version 12 room with a create event of the given content
// (nil: {"room_version": "12"}) sent by creator, whom it joins.
func newRoom(t testing.TB, createContent map[string]any) *room {
	t.Helper()
	create, roomID := newCreate(t, createOpts{content: createContent})
	r := &room{t: t, version: RoomVersion12, roomID: roomID, create: create,
		state: map[gomatrixserverlib.StateKeyTuple]gomatrixserverlib.PDU{}}
	r.apply(create)
	r.mustApply(r.member(creator, creator, spec.Join, nil))
	return r
}

// standardRoom is a version 12 room as createRoom makes it, plus members:
// carol an additional creator, adam at 100, mona at 50, bob at 0, all
// joined; the join rule is given.
func standardRoom(t testing.TB, joinRule string) *room {
	t.Helper()
	r := newRoom(t, map[string]any{"room_version": "12", "additional_creators": []string{coCreate}})
	r.mustApply(r.state_(creator, spec.MRoomPowerLevels, "", map[string]any{
		"users":  map[string]int{admin: 100, mod: 50},
		"events": map[string]int{"m.room.tombstone": 150, spec.MRoomPowerLevels: 50},
	}))
	r.mustApply(r.state_(creator, spec.MRoomJoinRules, "", map[string]any{"join_rule": spec.Public}))
	for _, u := range []string{coCreate, admin, mod, user} {
		r.mustApply(r.member(u, u, spec.Join, nil))
	}
	if joinRule != spec.Public {
		r.mustApply(r.state_(creator, spec.MRoomJoinRules, "", map[string]any{"join_rule": joinRule}))
	}
	return r
}

// event builds an event of the room following its last event, with the
// auth events the selection asks for. It does not apply it.
func (r *room) event(sender, typ string, stateKey *string, content any) gomatrixserverlib.PDU {
	r.t.Helper()
	return r.eventWith(sender, typ, stateKey, content, nil)
}

// eventWith is event with a change of the proto event before it is built.
func (r *room) eventWith(sender, typ string, stateKey *string, content any, adjust func(*gomatrixserverlib.ProtoEvent)) gomatrixserverlib.PDU {
	r.t.Helper()
	proto := &gomatrixserverlib.ProtoEvent{
		SenderID: sender, RoomID: r.roomID.String(), Type: typ, StateKey: stateKey,
		PrevEvents: append([]string{}, r.prev...), Depth: r.depth + 1, Content: mustJSON(r.t, content),
	}
	proto.AuthEvents = r.authEventIDs(proto)
	if adjust != nil {
		adjust(proto)
	}
	return build(r.t, r.version, proto)
}

// authEventIDs lists the auth events the selection of the room's version
// asks for, from the room's state.
func (r *room) authEventIDs(proto *gomatrixserverlib.ProtoEvent) []string {
	var needed gomatrixserverlib.StateNeeded
	var err error
	if r.version == RoomVersion12 {
		needed, err = AuthEventsNeededForProto(proto)
	} else {
		needed, err = gomatrixserverlib.StateNeededForProtoEvent(proto)
	}
	if err != nil {
		return []string{}
	}
	ids := []string{}
	for _, t := range needed.Tuples() {
		if e, ok := r.state[t]; ok {
			ids = append(ids, e.EventID())
		}
	}
	return ids
}

func (r *room) member(sender, target, membership string, extra map[string]any) gomatrixserverlib.PDU {
	r.t.Helper()
	content := map[string]any{"membership": membership}
	for k, v := range extra {
		content[k] = v
	}
	return r.event(sender, spec.MRoomMember, ptr(target), content)
}

// state_ builds a state event.
func (r *room) state_(sender, typ, stateKey string, content any) gomatrixserverlib.PDU {
	r.t.Helper()
	return r.event(sender, typ, ptr(stateKey), content)
}

func (r *room) message(sender string) gomatrixserverlib.PDU {
	r.t.Helper()
	return r.event(sender, "m.room.message", nil, map[string]any{"msgtype": "m.text", "body": "hello"})
}

// provider is the room's current state as auth events.
func (r *room) provider() *gomatrixserverlib.AuthEvents {
	ae := gomatrixserverlib.NewAuthEvents(nil)
	for _, e := range r.state {
		if err := ae.AddEvent(e); err != nil {
			r.t.Fatal(err)
		}
	}
	return &ae
}

// allowed checks ev against the room's current state.
func (r *room) allowed(ev gomatrixserverlib.PDU) error {
	return Allowed(ev, r.provider(), userIDForSender)
}

// apply makes ev part of the room's state and history.
func (r *room) apply(ev gomatrixserverlib.PDU) {
	if sk := ev.StateKey(); sk != nil {
		r.state[gomatrixserverlib.StateKeyTuple{EventType: ev.Type(), StateKey: *sk}] = ev
	}
	r.prev = []string{ev.EventID()}
	r.depth++
}

// mustApply applies an event the rules must allow.
func (r *room) mustApply(ev gomatrixserverlib.PDU) {
	r.t.Helper()
	if err := r.allowed(ev); err != nil {
		r.t.Fatalf("setting up the room: %s %s by %s refused: %v", ev.Type(), string(ev.Content()), ev.SenderID(), err)
	}
	r.apply(ev)
}

func build(t testing.TB, version gomatrixserverlib.RoomVersion, proto *gomatrixserverlib.ProtoEvent) gomatrixserverlib.PDU {
	t.Helper()
	origin := "creator.example"
	if i := strings.IndexByte(proto.SenderID, ':'); i >= 0 {
		origin = proto.SenderID[i+1:]
	}
	ev, err := roomversion.Build(version, proto, time.Now(), spec.ServerName(origin), "ed25519:test", signingKey)
	if err != nil {
		t.Fatalf("building %s: %v", proto.Type, err)
	}
	return ev
}

func userIDForSender(_ spec.RoomID, senderID spec.SenderID) (*spec.UserID, error) {
	return spec.NewUserID(string(senderID), true)
}

// mapProvider is an auth event provider that, like one reading a database,
// returns whatever it holds without checking rooms.
type mapProvider map[gomatrixserverlib.StateKeyTuple]gomatrixserverlib.PDU

func (p mapProvider) get(typ, sk string) (gomatrixserverlib.PDU, error) {
	return p[gomatrixserverlib.StateKeyTuple{EventType: typ, StateKey: sk}], nil
}
func (p mapProvider) Create() (gomatrixserverlib.PDU, error) { return p.get(spec.MRoomCreate, "") }
func (p mapProvider) JoinRules() (gomatrixserverlib.PDU, error) {
	return p.get(spec.MRoomJoinRules, "")
}
func (p mapProvider) PowerLevels() (gomatrixserverlib.PDU, error) {
	return p.get(spec.MRoomPowerLevels, "")
}
func (p mapProvider) Member(sk spec.SenderID) (gomatrixserverlib.PDU, error) {
	return p.get(spec.MRoomMember, string(sk))
}
func (p mapProvider) ThirdPartyInvite(sk string) (gomatrixserverlib.PDU, error) {
	return p.get(spec.MRoomThirdPartyInvite, sk)
}
func (p mapProvider) Valid() bool { return true }

func (r *room) mapProvider() mapProvider {
	p := mapProvider{}
	for k, v := range r.state {
		p[k] = v
	}
	return p
}

func ptr[T any](v T) *T { return &v }

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// expectRule checks the outcome of Allowed: nil for allowed, or a refusal
// that names the rule.
func expectRule(t *testing.T, err error, rule string) {
	t.Helper()
	if rule == "" {
		if err != nil {
			t.Fatalf("refused, want allowed: %v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("allowed, want refused by rule %s", rule)
	}
	var na *gomatrixserverlib.NotAllowed
	if !errors.As(err, &na) {
		t.Fatalf("refused with %T %v, want a *gomatrixserverlib.NotAllowed", err, err)
	}
	if !strings.HasPrefix(na.Message, "rule "+rule+":") {
		t.Fatalf("refused by %q, want rule %s", na.Message, rule)
	}
}
