// Package roomserver is the rooms of the server: their events, state and
// membership, built, hashed, signed and authorised with gomatrixserverlib
// (versions 1 to 11) and with packages roomversion, authrules and
// stateres (version 12: docs/design/rooms.md). Membership is the source of who shares a room with whom, which drives
// the device lists of package keyserver.
//
// # Storage (package sqlstore, migration 14)
//
//   - rooms: one row per room, with its room version (which decides the
//     format of its events, the event ID format and the auth rules), the
//     snapshot of its current state and its greatest depth.
//   - room_events: every event as the signed PDU in federation format,
//     with its room version beside it, so that JSON is always read back
//     with the rules it was written under (v1/v2 carry their event_id,
//     v3+ IDs are reference hashes). Each event has state_before and
//     state_after (migration 15), the snapshots of the room state before
//     and after it, and pos, its position in the
//     /sync stream (shared with device lists and account data). Events
//     stored without known state before them (outliers: auth chains and
//     state received in a join, invites to rooms we are not in) have
//     neither; flags mark rejected and soft-failed events.
//   - room_state_snapshots / room_state_entries: a snapshot is a full map
//     (type, state_key) -> event. Events with the same state before them
//     share a snapshot: only a state event makes a new one (the old one
//     with that key replaced). "State at an event" (federation /state and
//     /state_ids, /sync's state at the start of a timeline) is a snapshot
//     lookup; the state after an event is the state before it plus the
//     event when it is state.
//   - room_extremities: the forward extremities, prev_events of the next
//     event. rooms.head (migration 18) is a random number every write
//     replaces: a write names the head it built on and fails with
//     storage.ErrRoomMoved if the room moved meanwhile (another daemon
//     sharing the database, or a write it was built on that failed); the
//     event is then built again. Each room's head is kept in memory
//     (roomPipe, pipe.go), so that a message is built on the one before
//     it while that one is still being written.
//   - room_current_state: the current state by key, with the membership
//     of member events, for member lists and a user's rooms.
//   - room_aliases, room_txns (client transaction IDs per device and
//     path), room_forgotten, sync_filters.
//
// # Membership and device lists
//
// Every membership event is written in one transaction with the
// membership row the device-list side reads (sqlstore's txSetMembership,
// the body of the admin endpoint's storage.SetMembership): joined and
// invited users share the room (as Synapse counts it), anyone else does
// not. That transaction also marks newly shared remote users' lists stale
// and names the local users concerned, whose waiting /sync requests wake.
// Neither side reads the other's tables: the device-list side sees only
// memberships (join, invite, leave).
//
// # Federation
//
// Events of other servers come through inbound.go (the spec's receive
// pipeline; storage's IngestRoomEvents places each with the state before
// it: the state after its one prev event, or an explicit list when
// branches were resolved or the state was fetched) and the handshakes of
// handshake.go (joins, invites, leaves, both sides). Events from a join's
// state and auth chain, fetched auth events and invites to rooms this
// server is not in are outliers. Every event's room version is stored
// beside it.
//
// Our own events are queued for the room's other servers in the
// transaction that writes them (Options.Federated sets
// storage.RoomWrite.Federate; table outbound_pdus, migration 16): for
// every server with a joined member after the write, and for a membership
// event also its target's server; an event another server hands us in a
// join or leave we are resident for is sent on alike (RoomIngest.Federate,
// skipping that server). The device-list sender delivers them with its
// EDUs, up to 50 per transaction, surviving restarts.
//
// Other servers read events, the state before an event with its auth
// chain, missing events and history (fedread.go, with the rule of who may
// read), and resolve our aliases; the history before this server's
// first event of a room joined over federation is asked of the room's
// servers when a client pages back to it (backfill.go); aliases of other servers are asked of
// them through Options.Federation (federation.go).
package roomserver

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"runtime"
	"sync"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/authrules"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/roomversion"
	"github.com/keyserver/keyserver/stateres"
	"github.com/keyserver/keyserver/storage"
)

// Store is what rooms keep in the database (package sqlstore).
type Store interface {
	WriteRoomEvents(ctx context.Context, w storage.RoomWrite) (storage.RoomWriteResult, error)
	StartRoomWrite(ctx context.Context, w storage.RoomWrite) func() (storage.RoomWriteResult, error)
	Room(ctx context.Context, roomID string) (storage.Room, error)
	RoomCurrentState(ctx context.Context, roomID string) ([]storage.RoomEvent, error)
	RoomJoinedServers(ctx context.Context, roomID string) ([]string, error)
	RoomStateEvents(ctx context.Context, roomID string, keys []storage.StateKey) ([]storage.RoomEvent, error)
	RoomStateBefore(ctx context.Context, eventID string) ([]storage.RoomEvent, error)
	RoomEvent(ctx context.Context, eventID string) (storage.RoomEvent, error)
	RoomEventsByID(ctx context.Context, ids []string) ([]storage.RoomEvent, error)
	RoomMinDepth(ctx context.Context, roomID string) (int64, error)
	RoomLowestPos(ctx context.Context, roomID string) (storage.StreamPos, error)
	RoomStateAfter(ctx context.Context, eventID string, keys []storage.StateKey) ([]storage.RoomEvent, error)
	IngestRoomEvents(ctx context.Context, in storage.RoomIngest) (storage.RoomWriteResult, error)
	RoomMembership(ctx context.Context, roomID, userID string) (string, error)
	UserRoomMemberships(ctx context.Context, userID string) ([]storage.RoomMember, error)
	RoomTxnEvent(ctx context.Context, t storage.RoomTxn) (string, error)
	PutRoomAlias(ctx context.Context, a storage.RoomAlias) error
	RoomAlias(ctx context.Context, alias string) (storage.RoomAlias, error)
	RoomAliases(ctx context.Context, roomID string) ([]string, error)
	DeleteRoomAlias(ctx context.Context, alias string) error
	SetRoomPublished(ctx context.Context, roomID string, published bool) error
	ForgetRoom(ctx context.Context, userID, roomID string) error
	SnapshotStore
	SyncStore
}

// MembershipSink is the device-list side's one view of rooms: told of
// every committed room write, with the local users it concerns, the
// remote users whose lists are now tracked, and whether events were
// queued for other servers (the server's change fan-out, which wakes
// waiting /sync requests, the updater and the outbound queue).
type MembershipSink interface {
	RoomWritten(res storage.RoomWriteResult)
}

// Sinks tells each of its sinks, in order, of every committed write.
type Sinks []MembershipSink

// RoomWritten tells each sink.
func (ss Sinks) RoomWritten(res storage.RoomWriteResult) {
	for _, s := range ss {
		s.RoomWritten(res)
	}
}

// Options configure the rooms.
type Options struct {
	ServerName string
	// KeyID and PrivateKey sign our events (the server's signing key).
	KeyID      gomatrixserverlib.KeyID
	PrivateKey ed25519.PrivateKey
	Sink       MembershipSink
	// Profiles fill local users' member events; nil: they carry none.
	Profiles Profiles
	// Upgrades hears of local users joining rooms that replaced others;
	// nil: nobody.
	Upgrades UpgradeFollower
	// KeyRing checks other servers' signatures on events.
	KeyRing *gomatrixserverlib.KeyRing
	// Remote fetches events from other servers; nil: none are fetched.
	Remote RemoteEvents
	// Handshakes join, invite and leave over federation; nil: rooms of
	// other servers cannot be joined.
	Handshakes Handshakes
	// Directory resolves aliases of other servers; nil: they are not
	// resolved.
	Directory AliasDirectory
	// RemoteTimeout bounds a request to another server made while a
	// client waits (default 10 s).
	RemoteTimeout time.Duration
	// Relations reads the relations between events (package relations):
	// /relations, /threads and the aggregations bundled with the events
	// shown; nil: none.
	Relations Relations
	// Federated queues our events for the other servers in their rooms,
	// in the transaction that writes them (storage.RoomWrite.Federate);
	// the write's result says so (PDUsQueued), and Sink pokes the sender.
	Federated bool
	Logger    logrus.FieldLogger
	Now       func() time.Time
}

// Service serves rooms.
type Service struct {
	db    Store
	opts  Options
	pipes sync.Map // room ID -> *roomPipe: the room's local writes
	// backfills holds a lock per room for its backfills (backfill.go).
	backfills sync.Map
	// states keeps state read for building events.
	states stateCache
	// profiles fill local users' member events (Options.Profiles); nil:
	// none.
	profiles Profiles
	// lazy remembers the member events each device was sent with lazy
	// loading (lazymembers.go).
	lazy lazySent
}

// New makes a Service.
func New(db Store, opts Options) *Service {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = logrus.StandardLogger()
	}
	if opts.RemoteTimeout <= 0 {
		opts.RemoteTimeout = defaultRemoteTimeout
	}
	return &Service{db: db, opts: opts, profiles: opts.Profiles}
}

// DefaultRoomVersion is the version of rooms created without one.
const DefaultRoomVersion = gomatrixserverlib.RoomVersionV11

// MaxEventBytes bounds an event as federation JSON.
const MaxEventBytes = 65536

// RoomVersions lists the versions rooms may be created and joined in,
// each "stable" or "unstable" (for /capabilities).
func RoomVersions() map[string]string {
	out := map[string]string{}
	for v, impl := range gomatrixserverlib.RoomVersions() {
		if v == gomatrixserverlib.RoomVersionPseudoIDs {
			continue // pseudo IDs need a sender-to-user mapping this server does not keep
		}
		if impl.Stable() {
			out[string(v)] = "stable"
		} else {
			out[string(v)] = "unstable"
		}
	}
	return out
}

// allowed checks an event against the auth rules of its room version.
// In version 12 provider must hold the room's create event, which the
// event's auth_events do not list.
func allowed(ev gomatrixserverlib.PDU, provider gomatrixserverlib.AuthEventProvider) error {
	return authrules.Allowed(ev, provider, userIDForSender)
}

// resolveV21 resolves the states of a version 12 room (state resolution
// v2.1).
func resolveV21(states [][]gomatrixserverlib.PDU, authChain []gomatrixserverlib.PDU, isRejected func(string) bool) ([]gomatrixserverlib.PDU, error) {
	return stateres.ResolveV21(states, authChain, allowed, isRejected)
}

// userIDForSender maps a sender to its user: the same in every version
// this server creates and joins (no pseudo IDs).
func userIDForSender(_ spec.RoomID, senderID spec.SenderID) (*spec.UserID, error) {
	return spec.NewUserID(string(senderID), true)
}

// pdu reads a stored event with the rules of its room version.
func pdu(ev storage.RoomEvent) (gomatrixserverlib.PDU, error) {
	impl, err := gomatrixserverlib.GetRoomVersion(gomatrixserverlib.RoomVersion(ev.RoomVersion))
	if err != nil {
		return nil, err
	}
	return impl.NewEventFromTrustedJSONWithEventID(ev.EventID, ev.JSON, false)
}

func pdus(evs []storage.RoomEvent) ([]gomatrixserverlib.PDU, error) {
	out := make([]gomatrixserverlib.PDU, 0, len(evs))
	for _, ev := range evs {
		p, err := pdu(ev)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// record is the stored form of a new event.
func record(ev gomatrixserverlib.PDU) storage.RoomEvent {
	r := storage.RoomEvent{
		EventID: ev.EventID(), RoomID: ev.RoomID().String(), Type: ev.Type(), StateKey: ev.StateKey(),
		Sender: string(ev.SenderID()), Depth: ev.Depth(), RoomVersion: string(ev.Version()), JSON: ev.JSON(),
	}
	if ev.Type() == spec.MRoomMember {
		r.Membership, _ = ev.Membership()
	}
	return r
}

// chain builds events one after the other on a state, each checked by
// the auth rules against the state before it.
type chain struct {
	s       *Service
	impl    gomatrixserverlib.IRoomVersion
	roomID  string
	state   map[gomatrixserverlib.StateKeyTuple]gomatrixserverlib.PDU
	prev    []string
	depth   int64
	built   []gomatrixserverlib.PDU
	records []storage.RoomEvent
}

func (s *Service) newChain(impl gomatrixserverlib.IRoomVersion, roomID string, state []gomatrixserverlib.PDU, prev []string, depth int64) *chain {
	c := &chain{s: s, impl: impl, roomID: roomID, state: map[gomatrixserverlib.StateKeyTuple]gomatrixserverlib.PDU{}, prev: prev, depth: depth}
	for _, ev := range state {
		c.state[gomatrixserverlib.StateKeyTuple{EventType: ev.Type(), StateKey: *ev.StateKey()}] = ev
	}
	return c
}

func (c *chain) authEvents() (*gomatrixserverlib.AuthEvents, error) {
	ae := gomatrixserverlib.NewAuthEvents(nil)
	for _, ev := range c.state {
		if err := ae.AddEvent(ev); err != nil {
			return nil, err
		}
	}
	return &ae, nil
}

// authEventIDs selects an event's auth events from the chain's state.
func (c *chain) authEventIDs(proto *gomatrixserverlib.ProtoEvent) ([]string, error) {
	return selectAuthEvents(c.impl.Version(), proto, c.state)
}

// selectAuthEvents lists the auth events of a new event from state:
// gomatrixserverlib's selection, less the create event in version 12 (its
// ID is the room ID).
func selectAuthEvents(version gomatrixserverlib.RoomVersion, proto *gomatrixserverlib.ProtoEvent,
	state map[gomatrixserverlib.StateKeyTuple]gomatrixserverlib.PDU) ([]string, error) {
	needed, err := gomatrixserverlib.StateNeededForProtoEvent(proto)
	if roomversion.Is12(version) {
		needed, err = authrules.AuthEventsNeededForProto(proto)
	}
	if err != nil {
		return nil, err
	}
	ids := []string{}
	for _, t := range needed.Tuples() {
		if ev, ok := state[t]; ok {
			ids = append(ids, ev.EventID())
		}
	}
	return ids, nil
}

// stateMap keys state events by type and state key.
func stateMap(evs []gomatrixserverlib.PDU) map[gomatrixserverlib.StateKeyTuple]gomatrixserverlib.PDU {
	m := make(map[gomatrixserverlib.StateKeyTuple]gomatrixserverlib.PDU, len(evs))
	for _, ev := range evs {
		if ev.StateKey() != nil {
			m[gomatrixserverlib.StateKeyTuple{EventType: ev.Type(), StateKey: *ev.StateKey()}] = ev
		}
	}
	return m
}

// checkCreatorsUnlisted refuses, as a bad request, power levels of a
// version 12 room that list one of its creators: the auth rules would
// refuse them (MSC4289), but the mistake is the client's content.
func (c *chain) checkCreatorsUnlisted(content []byte) error {
	create, ok := c.state[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomCreate, StateKey: ""}]
	if !ok {
		return nil
	}
	creators, err := authrules.Creators(create)
	if err != nil {
		return nil // the auth rules decide
	}
	var pl struct {
		Users map[string]json.RawMessage `json:"users"`
	}
	_ = json.Unmarshal(content, &pl)
	for _, u := range creators {
		if _, listed := pl.Users[u]; listed {
			return mxerr.BadJSON("%s is a creator of the room: creators hold every power and are not listed in its power levels", u)
		}
	}
	return nil
}

// add builds, signs and authorises the next event. A refusal of the auth
// rules is 403 M_FORBIDDEN, an event too large 413 M_TOO_LARGE.
func (c *chain) add(sender, evType string, stateKey *string, content any) (gomatrixserverlib.PDU, error) {
	raw, err := json.Marshal(content)
	if err != nil {
		return nil, mxerr.BadJSON("the content cannot be encoded")
	}
	if len(raw) > MaxEventBytes {
		return nil, mxerr.TooLarge("the event is larger than %d bytes", MaxEventBytes)
	}
	if evType == spec.MRoomPowerLevels && roomversion.Is12(c.impl.Version()) {
		if err := c.checkCreatorsUnlisted(raw); err != nil {
			return nil, err
		}
	}
	prev := c.prev
	if prev == nil {
		prev = []string{} // the create event: an empty list, not null
	}
	proto := gomatrixserverlib.ProtoEvent{
		SenderID: sender, RoomID: c.roomID, Type: evType, StateKey: stateKey, Content: raw,
		PrevEvents: prev, Depth: c.depth + 1,
	}
	if evType == spec.MRoomRedaction {
		var r struct {
			Redacts string `json:"redacts"`
		}
		if json.Unmarshal(raw, &r) != nil || r.Redacts == "" {
			return nil, mxerr.BadJSON("a redaction needs the ID of the event it redacts in content.redacts")
		}
		proto.Redacts = r.Redacts
	}
	ae, err := c.authEvents()
	if err != nil {
		return nil, err
	}
	if proto.AuthEvents, err = c.authEventIDs(&proto); err != nil {
		return nil, mxerr.BadJSON("%v", err)
	}
	ev, err := roomversion.Build(c.impl.Version(), &proto, c.s.opts.Now(), spec.ServerName(c.s.opts.ServerName), c.s.opts.KeyID, c.s.opts.PrivateKey)
	var invalid gomatrixserverlib.EventValidationError
	if errors.As(err, &invalid) && invalid.Code == gomatrixserverlib.EventValidationTooLarge {
		return nil, mxerr.TooLarge("the event is larger than %d bytes", MaxEventBytes)
	}
	if err != nil {
		return nil, mxerr.BadJSON("invalid event: %v", err)
	}
	if len(ev.JSON()) > MaxEventBytes {
		return nil, mxerr.TooLarge("the event is larger than %d bytes", MaxEventBytes)
	}
	if err := allowed(ev, ae); err != nil {
		var na *gomatrixserverlib.NotAllowed
		if errors.As(err, &na) {
			return nil, mxerr.Forbidden("%s", na.Message)
		}
		return nil, mxerr.Forbidden("%v", err)
	}
	if ev.StateKey() != nil {
		c.state[gomatrixserverlib.StateKeyTuple{EventType: ev.Type(), StateKey: *ev.StateKey()}] = ev
	}
	c.prev = []string{ev.EventID()}
	c.depth = ev.Depth()
	c.built = append(c.built, ev)
	c.records = append(c.records, record(ev))
	return ev, nil
}

// errNoRoom answers for a room this server does not know.
func errNoRoom(roomID string) error { return mxerr.NotFound("unknown room %s", roomID) }

// maxAttempts bounds the rebuilds of an event whose room moved under it.
const maxAttempts = 20

// send builds one event on a room's current state and writes it; txn
// (optional) records it as a client transaction's result.
func (s *Service) send(ctx context.Context, roomID, sender, evType string, stateKey *string, content any, txn *storage.RoomTxn) (gomatrixserverlib.PDU, error) {
	return s.sendFinished(ctx, roomID, sender, evType, stateKey, content, txn, nil)
}

// sendFinished is send with a last step between building the event and
// writing it: finish returns the event to write (an invite signed by the
// invitee's server).
func (s *Service) sendFinished(ctx context.Context, roomID, sender, evType string, stateKey *string, content any, txn *storage.RoomTxn,
	finish func(gomatrixserverlib.PDU) (gomatrixserverlib.PDU, error)) (gomatrixserverlib.PDU, error) {
	// Building and signing an event is the longest stretch of CPU a send
	// has (~0.2 ms). Before it, the send lets the goroutines waiting to
	// run go first: under load most of them are sends further along
	// (answering their clients once their write committed, or writing the
	// next batch), which then finish sooner instead of queueing behind
	// new builds. Paired runs of room-send on SQLite: p99 17.4-19.5 ms
	// against 19.7-21.9 at the same rate.
	runtime.Gosched()
	needed, err := stateNeeded(sender, evType, stateKey, content)
	if err != nil {
		return nil, err
	}
	p := s.pipe(roomID)
	for attempt := 0; ; attempt++ {
		ev, res, err := s.sendOnce(ctx, p, attempt > 0, roomID, sender, evType, stateKey, content, txn, needed, finish)
		if errors.Is(err, storage.ErrRoomMoved) && attempt < maxAttempts {
			continue
		}
		if errors.Is(err, storage.ErrTxnDone) { // a retry, its first done
			id, err := s.db.RoomTxnEvent(ctx, *txn)
			if err != nil {
				return nil, err
			}
			return s.storedEvent(ctx, id)
		}
		if err != nil {
			return nil, err
		}
		if res != nil {
			s.written(*res)
		}
		return ev, nil
	}
}

// sendOnce builds an event on the room's head (roomPipe) and writes it. A
// message is written in the room's pipe: the room is free for the next
// one as soon as the write has started; anything else holds the room
// until written. The result is nil when the event is the one a client
// transaction in flight made.
func (s *Service) sendOnce(ctx context.Context, p *roomPipe, retry bool, roomID, sender, evType string, stateKey *string, content any,
	txn *storage.RoomTxn, needed []storage.StateKey, finish func(gomatrixserverlib.PDU) (gomatrixserverlib.PDU, error),
) (gomatrixserverlib.PDU, *storage.RoomWriteResult, error) {
	p.mu.Lock()
	locked := true
	defer func() {
		if locked {
			p.mu.Unlock()
		}
	}()
	if retry {
		p.drain() // the room moved: what was in flight on the old head ends first
	}
	p.settle()
	if txn != nil {
		if f := p.inFlight(txn); f != nil {
			p.mu.Unlock()
			locked = false
			select {
			case <-f.done:
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
			if f.err != nil {
				return nil, nil, storage.ErrRoomMoved // sent again, on the room as it is
			}
			ev, err := s.storedEvent(ctx, f.eventID)
			return ev, nil, err
		}
		// A retry whose first has ended is found by its write
		// (storage.ErrTxnDone): retries are rare, reads on every send
		// are not.
	}
	room, err := p.current(ctx, s.db, roomID)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, nil, errNoRoom(roomID)
	} else if err != nil {
		return nil, nil, err
	}
	impl, err := gomatrixserverlib.GetRoomVersion(gomatrixserverlib.RoomVersion(room.RoomVersion))
	if err != nil {
		return nil, nil, mxerr.New(400, "M_UNSUPPORTED_ROOM_VERSION", "room version %q is not supported", room.RoomVersion)
	}
	// Only the state the auth rules look at is loaded, of the snapshot
	// that goes with the extremities the event builds on.
	state, err := s.snapshotState(ctx, room.StateSnapshot, needed)
	if err != nil {
		return nil, nil, err
	}
	c := s.newChain(impl, roomID, state, room.Extremities, room.Depth)
	ev, err := c.add(sender, evType, stateKey, content)
	if err != nil {
		return nil, nil, err
	}
	if finish != nil {
		if ev, err = finish(ev); err != nil {
			return nil, nil, err
		}
		c.records[len(c.records)-1] = record(ev)
	}
	w := storage.RoomWrite{RoomID: roomID, Extremities: room.Extremities, Head: room.Head, StateSnapshot: room.StateSnapshot,
		NewHead: storage.NewRoomHead(), Events: c.records, Txn: txn, Federate: s.opts.Federated, Now: s.opts.Now().UnixMilli()}
	if red, err := s.redaction(ctx, ev); err != nil {
		return nil, nil, err
	} else if red != nil {
		w.Redactions = []storage.RoomRedaction{*red}
	}
	wait := p.start(ctx, s.db, w)
	after := room
	after.Extremities, after.Depth, after.Head = []string{ev.EventID()}, max(room.Depth, ev.Depth()), w.NewHead
	if ev.StateKey() == nil && finish == nil {
		// A message: the next event builds on it now.
		p.head = &after
		p.mu.Unlock()
		locked = false
		res, err := wait()
		return ev, &res, err
	}
	res, err := wait()
	if err != nil {
		return nil, nil, err // the head is read again (settle)
	}
	after.StateSnapshot = res.StateSnapshot
	if ev.StateKey() != nil {
		s.states.carry(room.StateSnapshot, res.StateSnapshot, ev)
	}
	p.head = &after
	return ev, &res, nil
}

// storedEvent reads an event of ours back.
func (s *Service) storedEvent(ctx context.Context, eventID string) (gomatrixserverlib.PDU, error) {
	ev, err := s.db.RoomEvent(ctx, eventID)
	if err != nil {
		return nil, err
	}
	return pdu(ev)
}

// stateNeeded lists the state an event's auth events come from
// (gomatrixserverlib's selection).
func stateNeeded(sender, evType string, stateKey *string, content any) ([]storage.StateKey, error) {
	raw, err := json.Marshal(content)
	if err != nil {
		return nil, mxerr.BadJSON("the content cannot be encoded")
	}
	needed, err := gomatrixserverlib.StateNeededForProtoEvent(&gomatrixserverlib.ProtoEvent{
		SenderID: sender, Type: evType, StateKey: stateKey, Content: raw})
	if err != nil {
		return nil, mxerr.BadJSON("%v", err)
	}
	var keys []storage.StateKey
	for _, t := range needed.Tuples() {
		keys = append(keys, storage.StateKey{Type: t.EventType, StateKey: t.StateKey})
	}
	return keys, nil
}

func (s *Service) written(res storage.RoomWriteResult) {
	if s.opts.Sink != nil {
		s.opts.Sink.RoomWritten(res)
	}
}
