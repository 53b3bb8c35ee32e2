package roomserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/authrules"
	"github.com/keyserver/keyserver/roomversion"
	"github.com/keyserver/keyserver/storage"
)

// Events from other servers.
//
// Each PDU goes through the receive pipeline of the spec: a valid format
// for its room version (an event whose content hash fails is redacted by
// gomatrixserverlib's parser), its signatures (else dropped), the auth
// rules against its own auth events (fetched from the sender when
// missing, stored as outliers), the auth rules against the state before
// it (else rejected: stored, never shown, never state), and against the
// room's current state (else soft-failed: placed but hidden and no
// extremity). The state before an event is the state after its
// prev_events: one of them, or their states resolved with
// gomatrixserverlib.ResolveConflicts. Unknown prev_events are asked of the
// sender with /get_missing_events (a bounded number); when a gap remains,
// the state before the event is fetched with /state_ids (the events of it
// missing here with one /state when they are many, see fetchState). Where several
// forward extremities remain, the room's current state is their states
// resolved.

// RemoteEvents is what the inbound path asks of other servers.
type RemoteEvents interface {
	// GetEvent fetches one event (/event).
	GetEvent(ctx context.Context, dest, eventID string) (json.RawMessage, error)
	// MissingEvents asks for the events between earliest and latest
	// (/get_missing_events).
	MissingEvents(ctx context.Context, dest, roomID string, earliest, latest []string, limit int, minDepth int64) ([]json.RawMessage, error)
	// StateIDs asks for the state before an event (/state_ids).
	StateIDs(ctx context.Context, dest, roomID, eventID string) (stateIDs, authChainIDs []string, err error)
	// State asks for the state before an event and its auth chain
	// (/state).
	State(ctx context.Context, dest, roomID, eventID string) (state, authChain []json.RawMessage, err error)
	// Backfill asks for the events from and before them (/backfill).
	Backfill(ctx context.Context, dest, roomID string, from []string, limit int) ([]json.RawMessage, error)
}

const (
	// maxFetched bounds the events fetched for one incoming PDU (auth
	// events, missing events, state).
	maxFetched = 500
	// missingEventsLimit is the limit of one /get_missing_events (as
	// Synapse asks).
	missingEventsLimit = 10
	// maxPrevEvents and maxAuthEvents bound a PDU's references (the
	// spec's limits).
	maxPrevEvents = 20
	maxAuthEvents = 10
)

// checkReferences refuses an event with more prev_events or auth_events
// than a PDU may have, before anything is fetched for it.
func checkReferences(ev gomatrixserverlib.PDU) error {
	if n := len(ev.PrevEventIDs()); n > maxPrevEvents {
		return fmt.Errorf("invalid event: %d prev_events, at most %d", n, maxPrevEvents)
	}
	if n := len(ev.AuthEventIDs()); n > maxAuthEvents {
		return fmt.Errorf("invalid event: %d auth_events, at most %d", n, maxAuthEvents)
	}
	return nil
}

// errRejected marks an event that failed the auth rules.
type errRejected struct{ reason string }

func (e errRejected) Error() string { return "rejected: " + e.reason }

// ReceivePDUs handles the PDUs of a /send transaction from origin, in
// order, and returns the error of each PDU that was not processed by its
// event ID ("" for one processed). PDUs that cannot be named are left
// out. An event the auth rules reject has been processed: it is kept as
// rejected, and its answer is {} as Synapse gives it; errors are for PDUs
// that could not be taken in (invalid, badly signed, of a room this
// server is not in, missing what they need).
func (s *Service) ReceivePDUs(ctx context.Context, origin string, pdus []json.RawMessage) map[string]string {
	out := map[string]string{}
	for _, raw := range pdus {
		id, err := s.receivePDU(ctx, origin, raw)
		if id == "" {
			continue
		}
		var rej errRejected
		if errors.As(err, &rej) {
			s.opts.Logger.WithFields(map[string]any{"origin": origin, "event_id": id}).WithError(err).Debug("PDU rejected by the auth rules")
			out[id] = ""
			continue
		}
		if err != nil {
			s.opts.Logger.WithFields(map[string]any{"origin": origin, "event_id": id}).WithError(err).Debug("PDU not accepted")
			out[id] = err.Error()
			if ctx.Err() != nil {
				out[id] = "not processed in time"
			}
			continue
		}
		out[id] = ""
	}
	return out
}

// fallbackID names a PDU of a room this server cannot read: its
// event_id (v1, v2) or its reference hash as current versions compute it.
func fallbackID(raw json.RawMessage) string {
	var withID struct {
		EventID string `json:"event_id"`
	}
	if json.Unmarshal(raw, &withID) == nil && withID.EventID != "" {
		return withID.EventID
	}
	if ev, err := gomatrixserverlib.MustGetRoomVersion(gomatrixserverlib.RoomVersionV10).NewEventFromUntrustedJSON(raw); err == nil {
		return ev.EventID()
	}
	return ""
}

func (s *Service) receivePDU(ctx context.Context, origin string, raw json.RawMessage) (string, error) {
	var head struct {
		RoomID string `json:"room_id"`
	}
	if err := json.Unmarshal(raw, &head); err != nil || head.RoomID == "" {
		return fallbackID(raw), errors.New("the PDU has no room_id")
	}
	room, err := s.db.Room(ctx, head.RoomID)
	if errors.Is(err, storage.ErrNotFound) {
		return fallbackID(raw), errors.New("this server is not in the room")
	} else if err != nil {
		return fallbackID(raw), err
	}
	impl, err := gomatrixserverlib.GetRoomVersion(gomatrixserverlib.RoomVersion(room.RoomVersion))
	if err != nil {
		return fallbackID(raw), fmt.Errorf("unsupported room version %q", room.RoomVersion)
	}
	ev, err := impl.NewEventFromUntrustedJSON(raw)
	if err != nil {
		return fallbackID(raw), fmt.Errorf("invalid event: %v", err)
	}
	if len(room.Extremities) == 0 {
		// Known from an invite or a knock (or its end) only: nothing of
		// the room is placed here, and nothing is until a join, but for
		// the room's answer to a local user's knock (knock.go).
		if ok, err := s.receiveKnockAnswer(ctx, origin, ev); ok || err != nil {
			return ev.EventID(), err
		}
		return ev.EventID(), errors.New("this server is not in the room")
	}
	defer s.lock(head.RoomID)()
	budget := maxFetched
	return ev.EventID(), s.receive(ctx, origin, ev, &budget, true)
}

// receive runs the pipeline for one event of a room this server is in
// (the room's lock held). fill allows fetching missing prev_events.
func (s *Service) receive(ctx context.Context, origin string, ev gomatrixserverlib.PDU, budget *int, fill bool) error {
	return s.receiveAs(ctx, origin, ev, budget, fill, nil)
}

// receiveAs is receive with the write's federation settings: fed, when
// set, sends the event on to the room's other servers (a join or leave
// this server is the resident of).
func (s *Service) receiveAs(ctx context.Context, origin string, ev gomatrixserverlib.PDU, budget *int, fill bool, fed *federate) error {
	if stored, err := s.db.RoomEventsByID(ctx, []string{ev.EventID()}); err != nil {
		return err
	} else if len(stored) == 1 && !stored[0].Outlier {
		if stored[0].Rejected {
			return errRejected{"rejected before"}
		}
		return nil // a duplicate
	}
	if err := checkReferences(ev); err != nil {
		return err
	}
	if err := gomatrixserverlib.VerifyEventSignatures(ctx, ev, s.opts.KeyRing, userIDForSender); err != nil {
		return fmt.Errorf("bad signature: %v", err)
	}
	if err := s.checkAuthEvents(ctx, origin, ev, budget); err != nil {
		var rej errRejected
		if errors.As(err, &rej) {
			s.storeRejected(ctx, ev)
		}
		return err
	}
	for attempt := 0; ; attempt++ {
		err := s.place(ctx, origin, ev, budget, fill, fed)
		if errors.Is(err, storage.ErrRoomMoved) && attempt < maxAttempts {
			continue // another daemon wrote to the room: decide again
		}
		var rej errRejected
		if errors.As(err, &rej) {
			s.storeRejected(ctx, ev)
		}
		return err
	}
}

// federate is how a received event goes on to other servers.
type federate struct {
	skip []string // servers that have it
}

// storeRejected keeps a rejected event so that it is not fetched again.
func (s *Service) storeRejected(ctx context.Context, ev gomatrixserverlib.PDU) {
	r := record(ev)
	r.Rejected = true
	res, err := s.db.IngestRoomEvents(ctx, storage.RoomIngest{RoomID: r.RoomID, Event: &r, Now: s.opts.Now().UnixMilli()})
	if err != nil {
		s.opts.Logger.WithError(err).WithField("event_id", r.EventID).Warn("storing a rejected event failed")
		return
	}
	s.written(res)
}

// checkAuthEvents checks an event against its own auth events, fetching
// those missing from origin.
func (s *Service) checkAuthEvents(ctx context.Context, origin string, ev gomatrixserverlib.PDU, budget *int) error {
	ids := authEventIDs(ev)
	stored, err := s.eventsByID(ctx, origin, ev.Version(), ev.RoomID().String(), ids, budget)
	if err != nil {
		return err
	}
	ae := gomatrixserverlib.NewAuthEvents(nil)
	var listed []gomatrixserverlib.PDU
	for _, a := range stored {
		if a.Rejected {
			return errRejected{"auth event " + a.EventID + " was rejected"}
		}
		if a.RoomID != ev.RoomID().String() {
			return errRejected{"auth event " + a.EventID + " is of another room"}
		}
		p, err := pdu(a)
		if err != nil {
			return err
		}
		if slices.Contains(ev.AuthEventIDs(), a.EventID) {
			listed = append(listed, p)
		}
		if err := ae.AddEvent(p); err != nil {
			return errRejected{err.Error()}
		}
	}
	if roomversion.Is12(ev.Version()) {
		// No two auth events for one state key, none outside the
		// selection (the create event among them).
		if err := authrules.CheckAuthEvents(ev, listed); err != nil {
			return errRejected{"its auth events: " + err.Error()}
		}
	}
	if err := allowed(ev, &ae); err != nil {
		return errRejected{"not allowed by its auth events: " + err.Error()}
	}
	return nil
}

// authEventIDs lists the events an event is checked against: its
// auth_events, and in version 12 the room's create event, which they do
// not list (the room ID is its hash).
func authEventIDs(ev gomatrixserverlib.PDU) []string {
	ids := ev.AuthEventIDs()
	if roomversion.Is12(ev.Version()) && ev.Type() != spec.MRoomCreate {
		create := roomversion.CreateEventID(ev.RoomID().String())
		if !slices.Contains(ids, create) {
			ids = append(slices.Clone(ids), create)
		}
	}
	return ids
}

// eventsByID returns the stored events ids, fetching from origin and
// storing as outliers those missing (each checked in turn against its own
// auth events). An event that cannot be had is an error; one fetched
// that is of another room than roomID rejects the event it was fetched
// for.
func (s *Service) eventsByID(ctx context.Context, origin string, version gomatrixserverlib.RoomVersion, roomID string, ids []string, budget *int) ([]storage.RoomEvent, error) {
	stored, err := s.db.RoomEventsByID(ctx, ids)
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, e := range stored {
		have[e.EventID] = true
	}
	for _, id := range ids {
		if have[id] {
			continue
		}
		e, err := s.fetchOutlier(ctx, origin, version, roomID, id, budget)
		if err != nil {
			return nil, err
		}
		stored = append(stored, e)
		have[id] = true
	}
	return stored, nil
}

// fetchOutlier fetches one event from origin, checks it against its own
// auth events (fetched in turn) and stores it as an outlier, rejected if
// it fails them.
func (s *Service) fetchOutlier(ctx context.Context, origin string, version gomatrixserverlib.RoomVersion, roomID, id string, budget *int) (storage.RoomEvent, error) {
	if *budget <= 0 {
		return storage.RoomEvent{}, fmt.Errorf("event %s is missing and too many events were fetched already", id)
	}
	*budget--
	if s.opts.Remote == nil {
		return storage.RoomEvent{}, fmt.Errorf("event %s is missing", id)
	}
	raw, err := s.opts.Remote.GetEvent(ctx, origin, id)
	if err != nil {
		return storage.RoomEvent{}, fmt.Errorf("event %s is missing and could not be fetched: %v", id, err)
	}
	var head struct {
		RoomID string `json:"room_id"`
	}
	if json.Unmarshal(raw, &head) == nil && head.RoomID != roomID {
		// Not stored: this server may not know that room at all.
		return storage.RoomEvent{}, errRejected{"event " + id + " is of another room"}
	}
	ev, err := gomatrixserverlib.MustGetRoomVersion(version).NewEventFromUntrustedJSON(raw)
	if err != nil {
		return storage.RoomEvent{}, fmt.Errorf("fetched event %s is invalid: %v", id, err)
	}
	if ev.EventID() != id {
		return storage.RoomEvent{}, fmt.Errorf("asked for event %s, got %s", id, ev.EventID())
	}
	if err := checkReferences(ev); err != nil {
		return storage.RoomEvent{}, fmt.Errorf("fetched event %s: %v", id, err)
	}
	if err := gomatrixserverlib.VerifyEventSignatures(ctx, ev, s.opts.KeyRing, userIDForSender); err != nil {
		return storage.RoomEvent{}, fmt.Errorf("fetched event %s: bad signature: %v", id, err)
	}
	r := record(ev)
	if err := s.checkAuthEvents(ctx, origin, ev, budget); err != nil {
		var rej errRejected
		if !errors.As(err, &rej) {
			return storage.RoomEvent{}, err
		}
		r.Rejected = true
	}
	if _, err := s.db.IngestRoomEvents(ctx, storage.RoomIngest{RoomID: r.RoomID, Outliers: []storage.RoomEvent{r},
		Now: s.opts.Now().UnixMilli()}); err != nil {
		return storage.RoomEvent{}, err
	}
	r.Outlier = true
	return r, nil
}

// place decides the state before an event, checks it against that state
// and the current one, and writes it.
func (s *Service) place(ctx context.Context, origin string, ev gomatrixserverlib.PDU, budget *int, fill bool, fed *federate) error {
	roomID := ev.RoomID().String()
	before, err := s.stateBefore(ctx, origin, ev, budget, fill)
	if err != nil {
		return err
	}
	ae, err := authEventsFrom(before.events)
	if err != nil {
		return errRejected{err.Error()}
	}
	if err := allowed(ev, ae); err != nil {
		return errRejected{"not allowed by the state before it: " + err.Error()}
	}
	room, err := s.db.Room(ctx, roomID)
	if err != nil {
		return err
	}
	r := record(ev)
	needed := neededKeys(ev)
	current, err := s.db.RoomStateEvents(ctx, roomID, needed)
	if err != nil {
		return err
	}
	currentPDUs, err := pdus(current)
	if err != nil {
		return err
	}
	cae, err := authEventsFrom(currentPDUs)
	if err == nil {
		err = allowed(ev, cae)
	}
	in := storage.RoomIngest{RoomID: roomID, Event: &r, StateAfter: before.after, StateBefore: before.ids,
		Extremities: room.Extremities, Now: s.opts.Now().UnixMilli()}
	if err != nil {
		// Allowed by the state before it, not by the room's state now:
		// placed, hidden, and not built upon.
		r.SoftFailed = true
		s.opts.Logger.WithField("event_id", r.EventID).WithError(err).Debug("event soft-failed")
	} else {
		in.NewExtremities = []string{ev.EventID()}
		for _, x := range room.Extremities {
			if !slices.Contains(ev.PrevEventIDs(), x) {
				in.NewExtremities = append(in.NewExtremities, x)
			}
		}
		if len(in.NewExtremities) == 1 {
			in.CurrentAfterEvent = true
		} else if in.CurrentState, err = s.resolveExtremities(ctx, ev, before, in.NewExtremities); err != nil {
			return err
		}
	}
	if !r.SoftFailed {
		if red, err := s.redaction(ctx, ev); err != nil {
			return err
		} else if red != nil {
			in.Redactions = []storage.RoomRedaction{*red}
		}
	}
	if fed != nil {
		in.Federate, in.SkipServers = true, fed.skip
	}
	res, err := s.db.IngestRoomEvents(ctx, in)
	if err != nil {
		return err
	}
	s.written(res)
	return nil
}

// neededKeys lists the state an event's auth events come from.
func neededKeys(ev gomatrixserverlib.PDU) []storage.StateKey {
	var keys []storage.StateKey
	for _, t := range gomatrixserverlib.StateNeededForAuth([]gomatrixserverlib.PDU{ev}).Tuples() {
		keys = append(keys, storage.StateKey{Type: t.EventType, StateKey: t.StateKey})
	}
	return keys
}

func authEventsFrom(evs []gomatrixserverlib.PDU) (*gomatrixserverlib.AuthEvents, error) {
	ae := gomatrixserverlib.NewAuthEvents(nil)
	for _, e := range evs {
		if err := ae.AddEvent(e); err != nil {
			return nil, err
		}
	}
	return &ae, nil
}

// priorState is the state before an event: the state after one placed
// event (after; events holds the keys the auth rules need) or a full
// list (ids; events holds all of them).
type priorState struct {
	after  string
	ids    []string
	events []gomatrixserverlib.PDU
}

// stateBefore decides the state before an event from its prev_events,
// fetching what is missing.
func (s *Service) stateBefore(ctx context.Context, origin string, ev gomatrixserverlib.PDU, budget *int, fill bool) (priorState, error) {
	prevs, err := s.statePrevs(ctx, ev.PrevEventIDs())
	if err != nil {
		return priorState{}, err
	}
	placed, err := s.placedAmong(ctx, ev.RoomID().String(), prevs)
	if err != nil {
		return priorState{}, err
	}
	if len(placed) < len(prevs) && fill && s.opts.Remote != nil {
		s.fillGap(ctx, origin, ev, budget)
		if placed, err = s.placedAmong(ctx, ev.RoomID().String(), prevs); err != nil {
			return priorState{}, err
		}
	}
	if len(placed) == len(prevs) && len(prevs) == 1 {
		stored, err := s.db.RoomStateAfter(ctx, prevs[0], neededKeys(ev))
		if err != nil {
			return priorState{}, err
		}
		evs, err := pdus(stored)
		return priorState{after: prevs[0], events: evs}, err
	}
	if len(placed) == len(prevs) && len(prevs) > 1 {
		var states [][]gomatrixserverlib.PDU
		for _, p := range prevs {
			st, err := s.fullStateAfter(ctx, p)
			if err != nil {
				return priorState{}, err
			}
			states = append(states, st)
		}
		resolved, err := s.resolve(ctx, ev.Version(), states)
		if err != nil {
			return priorState{}, err
		}
		return priorState{ids: eventIDs(resolved), events: resolved}, nil
	}
	// A gap remains: the state before the event as its sender has it.
	if s.opts.Remote == nil {
		return priorState{}, errors.New("prev_events are missing")
	}
	stateIDs, authIDs, err := s.opts.Remote.StateIDs(ctx, origin, ev.RoomID().String(), ev.EventID())
	if err != nil {
		return priorState{}, fmt.Errorf("prev_events are missing and the state before the event could not be fetched: %v", err)
	}
	if err := s.fetchState(ctx, origin, ev, stateIDs, authIDs, budget); err != nil {
		return priorState{}, err
	}
	if _, err := s.eventsByID(ctx, origin, ev.Version(), ev.RoomID().String(), authIDs, budget); err != nil {
		return priorState{}, err
	}
	stored, err := s.eventsByID(ctx, origin, ev.Version(), ev.RoomID().String(), stateIDs, budget)
	if err != nil {
		return priorState{}, err
	}
	seen := map[gomatrixserverlib.StateKeyTuple]bool{}
	var evs []gomatrixserverlib.PDU
	for _, e := range stored {
		if e.Rejected || e.StateKey == nil || e.RoomID != ev.RoomID().String() {
			continue // not state: left out
		}
		k := gomatrixserverlib.StateKeyTuple{EventType: e.Type, StateKey: *e.StateKey}
		if seen[k] {
			return priorState{}, errors.New("the state fetched has two events for one key")
		}
		seen[k] = true
		p, err := pdu(e)
		if err != nil {
			return priorState{}, err
		}
		evs = append(evs, p)
	}
	return priorState{ids: eventIDs(evs), events: evs}, nil
}

// fetchState fetches the state before ev and its auth chain with one
// /state when this server misses a tenth or more of the events /state_ids
// named (as Synapse does; fewer are fetched one by one with /event), and
// stores those named as outliers, oldest first, each checked against its
// own auth events. Events the answer holds that /state_ids did not name,
// or that are invalid or badly signed, are left out.
func (s *Service) fetchState(ctx context.Context, origin string, ev gomatrixserverlib.PDU, stateIDs, authIDs []string, budget *int) error {
	wanted := map[string]bool{}
	for _, id := range append(slices.Clone(stateIDs), authIDs...) {
		wanted[id] = true
	}
	stored, err := s.db.RoomEventsByID(ctx, slices.Collect(maps.Keys(wanted)))
	if err != nil {
		return err
	}
	missing := len(wanted) - len(stored)
	if missing == 0 || missing*10 < len(wanted) {
		return nil
	}
	state, chain, err := s.opts.Remote.State(ctx, origin, ev.RoomID().String(), ev.EventID())
	if err != nil {
		s.opts.Logger.WithError(err).WithField("origin", origin).Debug("/state failed; events are fetched one by one")
		return nil
	}
	have := map[string]bool{}
	for _, e := range stored {
		have[e.EventID] = true
	}
	impl := gomatrixserverlib.MustGetRoomVersion(ev.Version())
	var got []gomatrixserverlib.PDU
	for _, raw := range append(chain, state...) {
		e, err := impl.NewEventFromUntrustedJSON(raw)
		if err != nil || !wanted[e.EventID()] || have[e.EventID()] || e.RoomID().String() != ev.RoomID().String() {
			continue
		}
		have[e.EventID()] = true
		got = append(got, e)
	}
	sort.SliceStable(got, func(i, j int) bool { return got[i].Depth() < got[j].Depth() })
	for _, e := range got {
		if checkReferences(e) != nil || gomatrixserverlib.VerifyEventSignatures(ctx, e, s.opts.KeyRing, userIDForSender) != nil {
			continue
		}
		r := record(e)
		if err := s.checkAuthEvents(ctx, origin, e, budget); err != nil {
			var rej errRejected
			if !errors.As(err, &rej) {
				continue // fetched one by one later, or missing
			}
			r.Rejected = true
		}
		if _, err := s.db.IngestRoomEvents(ctx, storage.RoomIngest{RoomID: r.RoomID, Outliers: []storage.RoomEvent{r},
			Now: s.opts.Now().UnixMilli()}); err != nil {
			return err
		}
	}
	return nil
}

// maxRejectedHops bounds the rejected events walked through by
// statePrevs; a longer chain is a gap.
const maxRejectedHops = 10

// statePrevs returns the events whose states make the state before an
// event: its prev_events, a rejected one replaced by its own prev_events.
// A rejected event changes no state: the state after it is the state
// before it, never one the event is part of (which the state of its
// sender, from /state_ids, would be).
func (s *Service) statePrevs(ctx context.Context, prevs []string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	pending := prevs
	for hop := 0; len(pending) > 0; hop++ {
		stored, err := s.db.RoomEventsByID(ctx, pending)
		if err != nil {
			return nil, err
		}
		rejected := map[string]storage.RoomEvent{}
		for _, e := range stored {
			if e.Rejected {
				rejected[e.EventID] = e
			}
		}
		var next []string
		for _, id := range pending {
			if seen[id] {
				continue
			}
			seen[id] = true
			r, ok := rejected[id]
			if !ok || hop == maxRejectedHops {
				out = append(out, id)
				continue
			}
			p, err := pdu(r)
			if err != nil {
				return nil, err
			}
			next = append(next, p.PrevEventIDs()...)
		}
		pending = next
	}
	return out, nil
}

// placedAmong returns the IDs among ids of events placed in a room (not
// outliers, not rejected). An event of another room among them rejects
// the event they are the prev_events of.
func (s *Service) placedAmong(ctx context.Context, roomID string, ids []string) ([]string, error) {
	stored, err := s.db.RoomEventsByID(ctx, ids)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range stored {
		if e.RoomID != roomID {
			return nil, errRejected{"prev_event " + e.EventID + " is of another room"}
		}
		if !e.Outlier && !e.Rejected {
			out = append(out, e.EventID)
		}
	}
	return out, nil
}

// fillGap asks origin for the events between the room's extremities and
// ev, and receives them oldest first (without filling their own gaps:
// each is then placed on the state its sender gives). Events older than
// this server's history of the room (a branch from before its join) are
// not asked for, and not taken when sent anyway: they would enter the
// timeline as new.
func (s *Service) fillGap(ctx context.Context, origin string, ev gomatrixserverlib.PDU, budget *int) {
	room, err := s.db.Room(ctx, ev.RoomID().String())
	if err != nil {
		return
	}
	minDepth, err := s.db.RoomMinDepth(ctx, ev.RoomID().String())
	if err != nil {
		return
	}
	raws, err := s.opts.Remote.MissingEvents(ctx, origin, ev.RoomID().String(), room.Extremities, []string{ev.EventID()},
		missingEventsLimit, minDepth)
	if err != nil {
		s.opts.Logger.WithError(err).WithField("origin", origin).Debug("get_missing_events failed")
		return
	}
	impl := gomatrixserverlib.MustGetRoomVersion(ev.Version())
	var got []gomatrixserverlib.PDU
	for _, raw := range raws {
		if *budget <= 0 {
			break
		}
		*budget--
		e, err := impl.NewEventFromUntrustedJSON(raw)
		if err != nil || e.RoomID().String() != ev.RoomID().String() || e.EventID() == ev.EventID() || e.Depth() < minDepth {
			continue
		}
		got = append(got, e)
	}
	sort.SliceStable(got, func(i, j int) bool { return got[i].Depth() < got[j].Depth() })
	for _, e := range got {
		if err := s.receive(ctx, origin, e, budget, false); err != nil {
			s.opts.Logger.WithError(err).WithField("event_id", e.EventID()).Debug("a missing event was not accepted")
		}
	}
}

// fullStateAfter returns the whole state after a placed event.
func (s *Service) fullStateAfter(ctx context.Context, eventID string) ([]gomatrixserverlib.PDU, error) {
	stored, err := s.db.RoomStateAfter(ctx, eventID, nil)
	if err != nil {
		return nil, err
	}
	return pdus(stored)
}

// resolveExtremities is the room's current state with new extremities:
// their states resolved. ev (one of them) has the state before.
func (s *Service) resolveExtremities(ctx context.Context, ev gomatrixserverlib.PDU, before priorState, extremities []string) ([]string, error) {
	var states [][]gomatrixserverlib.PDU
	for _, x := range extremities {
		if x != ev.EventID() {
			st, err := s.fullStateAfter(ctx, x)
			if err != nil {
				return nil, err
			}
			states = append(states, st)
			continue
		}
		st := before.events
		if before.after != "" {
			var err error
			if st, err = s.fullStateAfter(ctx, before.after); err != nil {
				return nil, err
			}
		}
		st = slices.Clone(st)
		if ev.StateKey() != nil {
			st = slices.DeleteFunc(st, func(e gomatrixserverlib.PDU) bool {
				return e.Type() == ev.Type() && *e.StateKey() == *ev.StateKey()
			})
			st = append(st, ev)
		}
		states = append(states, st)
	}
	resolved, err := s.resolve(ctx, ev.Version(), states)
	if err != nil {
		return nil, err
	}
	return eventIDs(resolved), nil
}

// resolve resolves several states of a room into one. States that agree
// need no resolution.
func (s *Service) resolve(ctx context.Context, version gomatrixserverlib.RoomVersion, states [][]gomatrixserverlib.PDU) ([]gomatrixserverlib.PDU, error) {
	byKey := map[gomatrixserverlib.StateKeyTuple]map[string]gomatrixserverlib.PDU{}
	var all []gomatrixserverlib.PDU
	seen := map[string]bool{}
	for _, st := range states {
		for _, e := range st {
			k := gomatrixserverlib.StateKeyTuple{EventType: e.Type(), StateKey: *e.StateKey()}
			if byKey[k] == nil {
				byKey[k] = map[string]gomatrixserverlib.PDU{}
			}
			byKey[k][e.EventID()] = e
			if !seen[e.EventID()] {
				seen[e.EventID()] = true
				all = append(all, e)
			}
		}
	}
	conflicted := false
	for k, evs := range byKey {
		if len(evs) > 1 {
			conflicted = true
			break
		}
		// A key missing from one of the states conflicts too.
		n := 0
		for _, st := range states {
			for _, e := range st {
				if e.Type() == k.EventType && *e.StateKey() == k.StateKey {
					n++
					break
				}
			}
		}
		if n != len(states) {
			conflicted = true
			break
		}
	}
	if !conflicted {
		return all, nil
	}
	authChain, rejected, err := s.authChain(ctx, all)
	if err != nil {
		return nil, err
	}
	isRejected := func(id string) bool { return rejected[id] }
	if roomversion.Is12(version) {
		return resolveV21(states, authChain, isRejected)
	}
	return gomatrixserverlib.ResolveConflicts(version, all, authChain, userIDForSender, isRejected)
}

// authChain returns the stored auth chain of events, and which of its
// events were rejected.
func (s *Service) authChain(ctx context.Context, evs []gomatrixserverlib.PDU) ([]gomatrixserverlib.PDU, map[string]bool, error) {
	rejected := map[string]bool{}
	seen := map[string]bool{}
	var next []string
	for _, e := range evs {
		for _, id := range authEventIDs(e) {
			if !seen[id] {
				seen[id] = true
				next = append(next, id)
			}
		}
	}
	var out []gomatrixserverlib.PDU
	for len(next) > 0 {
		stored, err := s.db.RoomEventsByID(ctx, next)
		if err != nil {
			return nil, nil, err
		}
		next = nil
		for _, st := range stored {
			p, err := pdu(st)
			if err != nil {
				return nil, nil, err
			}
			if st.Rejected {
				rejected[st.EventID] = true
			}
			out = append(out, p)
			for _, id := range authEventIDs(p) {
				if !seen[id] {
					seen[id] = true
					next = append(next, id)
				}
			}
		}
	}
	return out, rejected, nil
}

func eventIDs(evs []gomatrixserverlib.PDU) []string {
	out := make([]string, 0, len(evs))
	for _, e := range evs {
		out = append(out, e.EventID())
	}
	return out
}
