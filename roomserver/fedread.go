package roomserver

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// What other servers read of our rooms over federation: single events,
// the state before an event with its auth chain, events they miss and
// history (backfill). Events are served as stored, signed PDUs in
// federation format; rejected events never are.
//
// Who may read: a server with a user joined to the room (in its current
// state), or with a user joined in the state before the event asked about
// (it was in the room then, and was sent the event). Under "shared"
// history visibility, the default, a member sees the whole history; under
// "invited" and "joined", the events from before any of its users was
// invited or joined come redacted (forServer). A server that left still
// reads the events from before it left.

// Limits of the walks over the room graph.
const (
	// DefaultMissingEvents is get_missing_events' limit when none is given.
	DefaultMissingEvents = 10
	// MaxMissingEvents caps get_missing_events' limit (as Synapse does):
	// a server missing more fetches the state instead.
	MaxMissingEvents = 20
	// MaxBackfill caps backfill's limit.
	MaxBackfill = 100
	// maxStateChecks bounds the events whose state before them is looked
	// at to let a server that is not in the room read (see mayRead).
	maxStateChecks = 10
)

// StateIDsResponse answers /state_ids.
type StateIDsResponse struct {
	PDUIDs       []string `json:"pdu_ids"`
	AuthChainIDs []string `json:"auth_chain_ids"`
}

// StateResponse answers /state.
type StateResponse struct {
	PDUs      []json.RawMessage `json:"pdus"`
	AuthChain []json.RawMessage `json:"auth_chain"`
}

// MissingEventsRequest is the body of /get_missing_events.
type MissingEventsRequest struct {
	EarliestEvents []string `json:"earliest_events"`
	LatestEvents   []string `json:"latest_events"`
	// Limit: DefaultMissingEvents when nil, at most MaxMissingEvents.
	Limit    *int  `json:"limit"`
	MinDepth int64 `json:"min_depth"`
}

// FederationEvent returns one event for origin; outliers included.
func (s *Service) FederationEvent(ctx context.Context, origin, eventID string) (json.RawMessage, error) {
	ev, err := s.db.RoomEvent(ctx, eventID) // never a rejected one
	if errors.Is(err, storage.ErrNotFound) {
		return nil, errNoEvent(eventID)
	} else if err != nil {
		return nil, err
	}
	if err := s.mayRead(ctx, origin, ev.RoomID, []storage.RoomEvent{ev}); err != nil {
		return nil, err
	}
	out, err := s.forServer(ctx, origin, []storage.RoomEvent{ev})
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// FederationStateIDs returns the IDs of the state before an event and of
// its auth chain.
func (s *Service) FederationStateIDs(ctx context.Context, origin, roomID, eventID string) (StateIDsResponse, error) {
	state, chain, err := s.stateForServer(ctx, origin, roomID, eventID)
	if err != nil {
		return StateIDsResponse{}, err
	}
	return StateIDsResponse{PDUIDs: eventIDs(state), AuthChainIDs: eventIDs(chain)}, nil
}

// FederationState returns the state before an event and its auth chain.
func (s *Service) FederationState(ctx context.Context, origin, roomID, eventID string) (StateResponse, error) {
	state, chain, err := s.stateForServer(ctx, origin, roomID, eventID)
	if err != nil {
		return StateResponse{}, err
	}
	return StateResponse{PDUs: rawEvents(state), AuthChain: rawEvents(chain)}, nil
}

// FederationEventAuth returns the auth chain of an event.
func (s *Service) FederationEventAuth(ctx context.Context, origin, roomID, eventID string) ([]json.RawMessage, error) {
	ev, err := s.readableEvent(ctx, origin, roomID, eventID)
	if err != nil {
		return nil, err
	}
	p, err := pdu(ev)
	if err != nil {
		return nil, err
	}
	chain, err := s.servedAuthChain(ctx, roomID, []gomatrixserverlib.PDU{p})
	if err != nil {
		return nil, err
	}
	return rawEvents(chain), nil
}

// FederationMissingEvents walks prev_events breadth-first from the
// latest events (not returned themselves), not past the earliest events,
// leaving out events below min_depth, and returns up to limit events,
// oldest first.
func (s *Service) FederationMissingEvents(ctx context.Context, origin, roomID string, req MissingEventsRequest) ([]json.RawMessage, error) {
	limit := DefaultMissingEvents
	if req.Limit != nil {
		limit = *req.Limit
	}
	if limit < 1 {
		return nil, mxerr.InvalidParam("limit must be positive")
	}
	limit = min(limit, MaxMissingEvents)
	if len(req.LatestEvents) == 0 {
		return nil, mxerr.BadJSON("latest_events must name at least one event")
	}
	for _, id := range append(slices.Clone(req.LatestEvents), req.EarliestEvents...) {
		if strings.ContainsRune(id, 0) {
			return nil, mxerr.BadJSON("%q is not an event ID", id)
		}
	}
	if err := s.roomExists(ctx, roomID); err != nil {
		return nil, err
	}
	latest, err := s.eventsOfRoom(ctx, roomID, req.LatestEvents)
	if err != nil {
		return nil, err
	}
	if err := s.mayRead(ctx, origin, roomID, latest); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, id := range req.EarliestEvents {
		seen[id] = true
	}
	for _, ev := range latest {
		seen[ev.EventID] = true
	}
	found, err := s.walkPrevEvents(ctx, roomID, latest, seen, limit, req.MinDepth)
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(found, func(a, b storage.RoomEvent) int {
		if a.Depth != b.Depth {
			return cmp.Compare(a.Depth, b.Depth)
		}
		return strings.Compare(a.EventID, b.EventID)
	})
	return s.forServer(ctx, origin, found)
}

// FederationBackfill returns the events from and their ancestors,
// breadth-first over prev_events, up to limit (at most MaxBackfill),
// newest first.
func (s *Service) FederationBackfill(ctx context.Context, origin, roomID string, from []string, limit int) ([]json.RawMessage, error) {
	if limit < 1 {
		return nil, mxerr.InvalidParam("limit must be positive")
	}
	limit = min(limit, MaxBackfill)
	if err := s.roomExists(ctx, roomID); err != nil {
		return nil, err
	}
	start, err := s.eventsOfRoom(ctx, roomID, from)
	if err != nil {
		return nil, err
	}
	if err := s.mayRead(ctx, origin, roomID, start); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, ev := range start {
		seen[ev.EventID] = true
	}
	out := start[:min(len(start), limit)]
	more, err := s.walkPrevEvents(ctx, roomID, out, seen, limit-len(out), 0)
	if err != nil {
		return nil, err
	}
	out = append(out, more...)
	slices.SortStableFunc(out, func(a, b storage.RoomEvent) int {
		if a.Depth != b.Depth {
			return cmp.Compare(b.Depth, a.Depth)
		}
		return strings.Compare(a.EventID, b.EventID)
	})
	return s.forServer(ctx, origin, out)
}

func errNoEvent(eventID string) error { return mxerr.NotFound("unknown event %s", eventID) }

func (s *Service) roomExists(ctx context.Context, roomID string) error {
	if _, err := s.db.Room(ctx, roomID); errors.Is(err, storage.ErrNotFound) {
		return errNoRoom(roomID)
	} else if err != nil {
		return err
	}
	return nil
}

// readableEvent returns an event of a room that origin may read: 404 for
// an unknown room, 403 when origin may not read it (decided before the
// event is looked at, so that whether it exists is not told), 404 for an
// unknown or rejected event, or one of another room.
func (s *Service) readableEvent(ctx context.Context, origin, roomID, eventID string) (storage.RoomEvent, error) {
	if err := s.roomExists(ctx, roomID); err != nil {
		return storage.RoomEvent{}, err
	}
	evs, err := s.eventsOfRoom(ctx, roomID, []string{eventID})
	if err != nil {
		return storage.RoomEvent{}, err
	}
	if err := s.mayRead(ctx, origin, roomID, evs); err != nil {
		return storage.RoomEvent{}, err
	}
	if len(evs) == 0 {
		return storage.RoomEvent{}, errNoEvent(eventID)
	}
	return evs[0], nil
}

// stateForServer returns the state before an event and the auth chain
// of that state; 404 when the event has none (an outlier).
func (s *Service) stateForServer(ctx context.Context, origin, roomID, eventID string) (state, chain []gomatrixserverlib.PDU, err error) {
	if _, err := s.readableEvent(ctx, origin, roomID, eventID); err != nil {
		return nil, nil, err
	}
	stored, err := s.db.RoomStateBefore(ctx, eventID)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, nil, mxerr.NotFound("the state before event %s is not known", eventID)
	} else if err != nil {
		return nil, nil, err
	}
	if state, err = pdus(stored); err != nil {
		return nil, nil, err
	}
	chain, err = s.servedAuthChain(ctx, roomID, state)
	return state, chain, err
}

// eventsOfRoom returns the stored events among ids that belong to the
// room and are not rejected, in the order of ids.
func (s *Service) eventsOfRoom(ctx context.Context, roomID string, ids []string) ([]storage.RoomEvent, error) {
	evs, err := s.db.RoomEventsByID(ctx, ids)
	if err != nil {
		return nil, err
	}
	byID := make(map[string]storage.RoomEvent, len(evs))
	for _, ev := range evs {
		if ev.RoomID == roomID && !ev.Rejected {
			byID[ev.EventID] = ev
		}
	}
	out := make([]storage.RoomEvent, 0, len(byID))
	for _, id := range ids {
		if ev, ok := byID[id]; ok {
			out = append(out, ev)
			delete(byID, id) // an ID named twice is returned once
		}
	}
	return out, nil
}

// mayRead checks that origin may read the room's events at the given
// events (see the rule at the top of this file): 403 M_FORBIDDEN if not.
func (s *Service) mayRead(ctx context.Context, origin, roomID string, at []storage.RoomEvent) error {
	current, err := s.db.RoomJoinedServers(ctx, roomID)
	if err != nil {
		return err
	}
	if _, in := slices.BinarySearch(current, origin); in {
		return nil
	}
	// A server that is not in the room cannot make us load the state
	// before every event it names: the first few are enough.
	for _, ev := range at[:min(len(at), maxStateChecks)] {
		before, err := s.db.RoomStateBefore(ctx, ev.EventID)
		if errors.Is(err, storage.ErrNotFound) {
			continue // an outlier: no state known before it
		} else if err != nil {
			return err
		}
		if serversJoinedIn(before)[origin] {
			return nil
		}
	}
	return mxerr.Forbidden("%s has no user in room %s", origin, roomID)
}

// serversJoinedIn returns the servers of the users joined in a state.
func serversJoinedIn(state []storage.RoomEvent) map[string]bool {
	out := map[string]bool{}
	for _, ev := range state {
		if ev.Type == spec.MRoomMember && ev.StateKey != nil && ev.Membership == spec.Join {
			if server := matrixid.Server(*ev.StateKey); server != "" {
				out[server] = true
			}
		}
	}
	return out
}

// servedAuthChain is the stored auth chain of events (authChain) as it is
// served: without rejected events or events of another room, sorted by
// depth, then ID.
func (s *Service) servedAuthChain(ctx context.Context, roomID string, evs []gomatrixserverlib.PDU) ([]gomatrixserverlib.PDU, error) {
	all, rejected, err := s.authChain(ctx, evs)
	if err != nil {
		return nil, err
	}
	chain := make([]gomatrixserverlib.PDU, 0, len(all))
	for _, ev := range all {
		if !rejected[ev.EventID()] && ev.RoomID().String() == roomID {
			chain = append(chain, ev)
		}
	}
	slices.SortFunc(chain, func(a, b gomatrixserverlib.PDU) int {
		if a.Depth() != b.Depth() {
			return cmp.Compare(a.Depth(), b.Depth())
		}
		return strings.Compare(a.EventID(), b.EventID())
	})
	return chain, nil
}

// walkPrevEvents walks prev_events breadth-first from the given events
// (not returned), skipping events in seen (which it adds to), events not
// stored, of another room or rejected, and events below minDepth (their
// ancestors are deeper still below), and returns up to limit events in
// the order found.
func (s *Service) walkPrevEvents(ctx context.Context, roomID string, from []storage.RoomEvent, seen map[string]bool, limit int, minDepth int64) ([]storage.RoomEvent, error) {
	var out []storage.RoomEvent
	var next []string
	add := func(ev storage.RoomEvent) error {
		p, err := pdu(ev)
		if err != nil {
			return err
		}
		for _, id := range p.PrevEventIDs() {
			if !seen[id] {
				seen[id] = true
				next = append(next, id)
			}
		}
		return nil
	}
	for _, ev := range from {
		if err := add(ev); err != nil {
			return nil, err
		}
	}
	for len(next) > 0 && len(out) < limit {
		level, err := s.eventsOfRoom(ctx, roomID, next)
		if err != nil {
			return nil, err
		}
		next = nil
		for _, ev := range level {
			if ev.Depth < minDepth {
				continue
			}
			if len(out) == limit {
				break
			}
			out = append(out, ev)
			if err := add(ev); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}
