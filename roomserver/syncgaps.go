package roomserver

import (
	"context"
	"errors"
	"math"

	"github.com/keyserver/keyserver/storage"
)

// Gaps in a /sync timeline.
//
// An event that came over federation with prev_events this server never
// placed (a gap get_missing_events did not fill, crossed with the state
// its sender gave; or the first event of a room joined over federation)
// follows history the timeline cannot show; so does one whose
// prev_events were fetched later from other servers (backfill), which
// places them below the stream's start. /sync then starts the timeline
// after the newest such gap and marks it limited, with a prev_batch from
// which /messages pages back (as Synapse does).

// afterGap returns the timeline's events from the newest one that
// follows a gap (a prev_event not placed here, unknown or known only as
// an outlier, or placed below the stream's start), and whether it found
// one.
func (s *Service) afterGap(ctx context.Context, evs []storage.RoomEvent) ([]storage.RoomEvent, bool, error) {
	if len(evs) == 0 {
		return evs, false, nil
	}
	inTimeline := make(map[string]bool, len(evs))
	for _, ev := range evs {
		inTimeline[ev.EventID] = true
	}
	prevs := make([][]string, len(evs))
	var ask []string
	for i, ev := range evs {
		p, err := pdu(ev)
		if err != nil {
			return nil, false, err
		}
		prevs[i] = p.PrevEventIDs()
		for _, id := range prevs[i] {
			if !inTimeline[id] {
				ask = append(ask, id)
			}
		}
	}
	follows := map[string]bool{} // prev_events that stand before the timeline in the stream
	if len(ask) > 0 {
		stored, err := s.db.RoomEventsByID(ctx, ask)
		if err != nil {
			return nil, false, err
		}
		for _, e := range stored {
			if (!e.Outlier || e.Rejected) && e.Pos >= 0 {
				follows[e.EventID] = true
			}
		}
	}
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Pos < 0 {
			break
		}
		for _, id := range prevs[i] {
			if !inTimeline[id] && !follows[id] {
				return evs[i:], true, nil
			}
		}
	}
	return evs, false, nil
}

// stateAtPos is a room's state after its events up to position at: the
// state after the newest of them (a gap's state, fetched from another
// server as outliers, is in the state after the event it came with, not
// before the event that follows).
func (s *Service) stateAtPos(ctx context.Context, roomID string, at storage.StreamPos) ([]storage.RoomEvent, error) {
	last, err := s.db.RoomMessages(ctx, roomID, math.MinInt64, at, 1, false)
	if err != nil {
		return nil, err
	}
	if len(last) == 0 {
		return nil, nil
	}
	state, err := s.db.RoomStateAfter(ctx, last[0].EventID, nil)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, nil
	}
	return state, err
}
