package roomserver

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/keyserver/keyserver/storage"
)

// Backfill: the history of a room from before this server's first event
// of it (a room joined over federation starts at the join) is asked of
// the room's servers when a client pages back past it (/messages).
//
// The events the history stops at (backward extremities) are the unknown
// prev_events of the room's lowest events. They are asked of the room's
// joined servers in turn (the server of the room ID first: its creator's,
// which holds the whole history) with /backfill; the first answer that
// brings a valid event is taken. Each event of it goes through the
// receive pipeline as an event of /send does, oldest first: a valid
// format for the room version, its signatures, the auth rules against its
// own auth events (fetched from that server when missing) and against
// the state before it (the state after its prev_events once they are
// placed; for the oldest, the state the server gives with /state_ids).
// An event failing the auth rules is kept as rejected, one badly signed
// or invalid is dropped. The events are placed below the room's timeline
// (storage.RoomIngest.HistoryPos: negative stream positions, the newest
// highest), where /sync never reads and /messages paging back does; the
// room's current state and forward extremities do not change.

// maxBackfillWindow is how many of a room's lowest events are looked at
// for the prev_events its history stops at.
const maxBackfillWindow = 10

// backfillLock serialises the backfills of a room: each takes the
// positions below the room's lowest.
func (s *Service) backfillLock(roomID string) func() {
	m, _ := s.backfills.LoadOrStore(roomID, &sync.Mutex{})
	mu := m.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

// backwardExtremities returns the events the room's history stops at:
// the prev_events of its lowest events that are not placed (unknown, or
// known only as outliers).
func (s *Service) backwardExtremities(ctx context.Context, roomID string) ([]string, error) {
	lowest, err := s.db.RoomMessages(ctx, roomID, math.MinInt64, math.MaxInt64, maxBackfillWindow, true)
	if err != nil {
		return nil, err
	}
	var prevs []string
	for _, ev := range lowest {
		p, err := pdu(ev)
		if err != nil {
			return nil, err
		}
		for _, id := range p.PrevEventIDs() {
			if !slices.Contains(prevs, id) {
				prevs = append(prevs, id)
			}
		}
	}
	if len(prevs) == 0 {
		return nil, nil
	}
	stored, err := s.db.RoomEventsByID(ctx, prevs)
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	for _, e := range stored {
		if !e.Outlier || e.Rejected {
			have[e.EventID] = true
		}
	}
	var out []string
	for _, id := range prevs {
		if !have[id] {
			out = append(out, id)
		}
	}
	return out, nil
}

// backfillServers lists the servers to ask for a room's history: its
// joined servers but this one, the server of the room ID first.
func (s *Service) backfillServers(ctx context.Context, roomID string) ([]string, error) {
	joined, err := s.db.RoomJoinedServers(ctx, roomID)
	if err != nil {
		return nil, err
	}
	creator := s.roomServer(ctx, roomID)
	var out []string
	for _, server := range joined {
		if server != s.opts.ServerName {
			out = append(out, server)
		}
	}
	slices.SortStableFunc(out, func(a, b string) int {
		switch {
		case a == creator && b != creator:
			return -1
		case b == creator && a != creator:
			return 1
		}
		return strings.Compare(a, b)
	})
	return out, nil
}

// backfill asks the room's servers for up to limit events of the history
// before what this server holds, and places those that are valid. It
// returns how many were placed; 0 when the history is whole or no server
// gave any.
func (s *Service) backfill(ctx context.Context, roomID string, limit int) (int, error) {
	if s.opts.Remote == nil {
		return 0, nil
	}
	defer s.backfillLock(roomID)()
	from, err := s.backwardExtremities(ctx, roomID)
	if err != nil || len(from) == 0 {
		return 0, err
	}
	room, err := s.db.Room(ctx, roomID)
	if err != nil {
		return 0, err
	}
	impl, err := gomatrixserverlib.GetRoomVersion(gomatrixserverlib.RoomVersion(room.RoomVersion))
	if err != nil {
		return 0, nil
	}
	servers, err := s.backfillServers(ctx, roomID)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.RemoteTimeout)
	defer cancel()
	limit = min(max(limit, 1), MaxBackfill)
	log := s.opts.Logger.WithField("room_id", roomID)
	for _, server := range servers {
		// A server that hangs takes half of the time at most: the next
		// is asked in the rest.
		askCtx, cancelAsk := context.WithTimeout(ctx, s.opts.RemoteTimeout/2)
		raws, err := s.opts.Remote.Backfill(askCtx, server, roomID, from, limit)
		cancelAsk()
		if err != nil {
			log.WithError(err).WithField("server", server).Debug("backfill failed")
			if ctx.Err() != nil {
				return 0, nil
			}
			continue
		}
		n, err := s.placeHistory(ctx, server, impl, roomID, raws)
		if err != nil {
			return n, err
		}
		if n > 0 {
			log.WithFields(map[string]any{"server": server, "events": n}).Debug("history backfilled")
			return n, nil
		}
	}
	return 0, nil
}

// placeHistory takes the events of a /backfill answer from origin (the
// first MaxBackfill), oldest first, and returns how many it placed.
func (s *Service) placeHistory(ctx context.Context, origin string, impl gomatrixserverlib.IRoomVersion, roomID string, raws []json.RawMessage) (int, error) {
	var evs []gomatrixserverlib.PDU
	seen := map[string]bool{}
	for _, raw := range raws[:min(len(raws), MaxBackfill)] {
		ev, err := impl.NewEventFromUntrustedJSON(raw)
		if err != nil || ev.RoomID().String() != roomID || seen[ev.EventID()] {
			continue
		}
		seen[ev.EventID()] = true
		evs = append(evs, ev)
	}
	slices.SortStableFunc(evs, func(a, b gomatrixserverlib.PDU) int {
		if a.Depth() != b.Depth() {
			return cmp.Compare(a.Depth(), b.Depth())
		}
		return strings.Compare(a.EventID(), b.EventID())
	})
	lowest, err := s.db.RoomLowestPos(ctx, roomID)
	if err != nil {
		return 0, err
	}
	budget := maxFetched
	placed := 0
	for i, ev := range evs {
		pos := lowest - storage.StreamPos(len(evs)-i) // the newest highest
		ok, err := s.receiveHistory(ctx, origin, ev, &budget, pos)
		var rej errRejected
		switch {
		case errors.As(err, &rej):
			s.opts.Logger.WithField("event_id", ev.EventID()).WithError(err).Debug("a backfilled event is rejected")
		case err != nil && ctx.Err() == nil && isStorageError(err):
			return placed, err
		case err != nil:
			s.opts.Logger.WithField("event_id", ev.EventID()).WithError(err).Debug("a backfilled event is not taken")
		case ok:
			placed++
		}
	}
	return placed, nil
}

// receiveHistory runs the receive pipeline for a backfilled event and
// places it at pos; false when it was placed already.
func (s *Service) receiveHistory(ctx context.Context, origin string, ev gomatrixserverlib.PDU, budget *int, pos storage.StreamPos) (bool, error) {
	if stored, err := s.db.RoomEventsByID(ctx, []string{ev.EventID()}); err != nil {
		return false, storageErr{err}
	} else if len(stored) == 1 && (!stored[0].Outlier || stored[0].Rejected) {
		return false, nil
	}
	if err := checkReferences(ev); err != nil {
		return false, err
	}
	if err := gomatrixserverlib.VerifyEventSignatures(ctx, ev, s.opts.KeyRing, userIDForSender); err != nil {
		return false, fmt.Errorf("bad signature: %v", err)
	}
	if err := s.checkAuthEvents(ctx, origin, ev, budget); err != nil {
		var rej errRejected
		if errors.As(err, &rej) {
			s.storeRejected(ctx, ev)
		}
		return false, err
	}
	before := priorState{ids: []string{}} // the create event: nothing before it
	if len(ev.PrevEventIDs()) > 0 {
		var err error
		if before, err = s.stateBefore(ctx, origin, ev, budget, false); err != nil {
			return false, err
		}
	}
	ae, err := authEventsFrom(before.events)
	if err == nil {
		err = allowed(ev, ae)
	}
	if err != nil {
		s.storeRejected(ctx, ev)
		return false, errRejected{"not allowed by the state before it: " + err.Error()}
	}
	r := record(ev)
	in := storage.RoomIngest{RoomID: r.RoomID, Event: &r, StateAfter: before.after, StateBefore: before.ids, HistoryPos: pos,
		Now: s.opts.Now().UnixMilli()}
	if red, err := s.redaction(ctx, ev); err != nil {
		return false, storageErr{err}
	} else if red != nil {
		in.Redactions = []storage.RoomRedaction{*red}
	}
	if _, err := s.db.IngestRoomEvents(ctx, in); err != nil {
		return false, storageErr{err}
	}
	return true, nil
}

// storageErr marks a failure of the database, which ends a backfill,
// from one of an event or of another server, which skips the event.
type storageErr struct{ err error }

func (e storageErr) Error() string { return e.err.Error() }
func (e storageErr) Unwrap() error { return e.err }

func isStorageError(err error) bool {
	var se storageErr
	return errors.As(err, &se)
}
