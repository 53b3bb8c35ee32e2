package roomserver

import (
	"cmp"
	"context"
	"slices"
	"sync"

	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/storage"
)

// Lazy-loaded members (filter room.state.lazy_load_members).
//
// /sync's state then carries, of the m.room.member events, only those of
// the senders of the timeline's events and the syncing user's own, as
// they were at the start of the timeline. An incremental sync leaves out
// a member event the device was already sent (in the state or in a
// timeline) unless the filter sets include_redundant_members; an initial
// sync, a full_state sync and a room joined in the range send them all
// again. What each device was sent is remembered in memory by the daemon
// that answered (as Synapse does): with the position of the answer that
// carried it, so that a /sync repeated from an older token (an answer
// lost on the way) is sent them again, and a daemon that does not know
// (restarted, or another daemon of the database) sends them again, which
// is redundant but never wrong.

// StateFilter is the part of the room state filter this server applies.
type StateFilter struct {
	LazyLoadMembers         bool `json:"lazy_load_members"`
	IncludeRedundantMembers bool `json:"include_redundant_members"`
}

// maxLazyDevices and maxLazyMembers bound what the daemon remembers: of
// how many devices, and of how many members per device.
const (
	maxLazyDevices = 10000
	maxLazyMembers = 20000
)

// sentMember is a member event a device was sent, and the position of
// the /sync answer that carried it.
type sentMember struct {
	eventID string
	pos     storage.StreamPos
}

type lazyKey struct{ userID, deviceID string }

// lazySent remembers the member events sent to each device, per room and
// member.
type lazySent struct {
	mu      sync.Mutex
	devices map[lazyKey]map[string]map[string]sentMember
	count   map[lazyKey]int
}

// sent reports whether the device was sent the member event in an answer
// at or before position since (one the client has seen).
func (l *lazySent) sent(k lazyKey, roomID, userID, eventID string, since storage.StreamPos) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	m, ok := l.devices[k][roomID][userID]
	return ok && m.eventID == eventID && m.pos <= since
}

// forget drops what the device was sent of a room.
func (l *lazySent) forget(k lazyKey, roomID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rooms := l.devices[k]; rooms != nil {
		l.count[k] -= len(rooms[roomID])
		delete(rooms, roomID)
	}
}

// remember notes member events sent to the device in an answer at pos.
func (l *lazySent) remember(k lazyKey, roomID string, members map[string]string, pos storage.StreamPos) {
	if len(members) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.devices == nil {
		l.devices, l.count = map[lazyKey]map[string]map[string]sentMember{}, map[lazyKey]int{}
	}
	rooms := l.devices[k]
	if rooms == nil {
		if len(l.devices) >= maxLazyDevices {
			for other := range l.devices { // one out, any: it is sent its members again
				delete(l.devices, other)
				delete(l.count, other)
				break
			}
		}
		rooms = map[string]map[string]sentMember{}
		l.devices[k] = rooms
	}
	if l.count[k]+len(members) > maxLazyMembers {
		clear(rooms)
		l.count[k] = 0
	}
	room := rooms[roomID]
	if room == nil {
		room = map[string]sentMember{}
		rooms[roomID] = room
	}
	for userID, eventID := range members {
		if _, had := room[userID]; !had {
			l.count[k]++
		}
		room[userID] = sentMember{eventID: eventID, pos: pos}
	}
}

// lazyMembers applies lazy loading to the state of a room's /sync entry:
// state (the state before the timeline, whole when full, else what
// changed in a gap) keeps the member events of the timeline's senders and
// of the user, and gains those not in it as they were at the start of the
// timeline; an incremental sync drops those the device was sent already
// (unless the filter wants them redundantly).
func (s *Service) lazyMembers(ctx context.Context, req SyncRequest, roomID string, timeline, state []storage.RoomEvent, full bool) ([]storage.RoomEvent, error) {
	wanted := map[string]bool{req.UserID: true}
	for _, ev := range timeline {
		wanted[ev.Sender] = true
	}
	var out []storage.RoomEvent
	have := map[string]bool{}
	for _, ev := range state {
		if ev.Type == spec.MRoomMember && ev.StateKey != nil {
			if !wanted[*ev.StateKey] {
				continue
			}
			have[*ev.StateKey] = true
		}
		out = append(out, ev)
	}
	if !full && len(timeline) > 0 && timeline[0].StateBefore != 0 {
		var keys []storage.StateKey
		for userID := range wanted {
			if !have[userID] {
				keys = append(keys, storage.StateKey{Type: spec.MRoomMember, StateKey: userID})
			}
		}
		slices.SortFunc(keys, func(a, b storage.StateKey) int { return cmp.Compare(a.StateKey, b.StateKey) })
		members, err := s.db.RoomSnapshotEvents(ctx, timeline[0].StateBefore, keys)
		if err != nil {
			return nil, err
		}
		out = append(out, members...)
	}
	k := lazyKey{userID: req.UserID, deviceID: req.DeviceID}
	if full {
		s.lazy.forget(k, roomID)
	} else if !req.Filter.Room.State.IncludeRedundantMembers {
		kept := out[:0]
		for _, ev := range out {
			if ev.Type == spec.MRoomMember && ev.StateKey != nil && s.lazy.sent(k, roomID, *ev.StateKey, ev.EventID, req.From) {
				continue
			}
			kept = append(kept, ev)
		}
		out = kept
	}
	sent := map[string]string{}
	for _, ev := range append(slices.Clone(out), timeline...) {
		if ev.Type == spec.MRoomMember && ev.StateKey != nil {
			sent[*ev.StateKey] = ev.EventID
		}
	}
	s.lazy.remember(k, roomID, sent, req.To)
	return out, nil
}

// chunkMembers is the state of a lazy-loading /messages answer: the
// member events of the senders of its events as they were after the
// first of them (the newest paging back, the oldest paging forward), as
// Synapse answers. The answer has no state without events.
func (s *Service) chunkMembers(ctx context.Context, chunk []ClientEvent) ([]ClientEvent, error) {
	if len(chunk) == 0 {
		return nil, nil
	}
	seen := map[string]bool{}
	var keys []storage.StateKey
	for _, ev := range chunk {
		if !seen[ev.Sender] {
			seen[ev.Sender] = true
			keys = append(keys, storage.StateKey{Type: spec.MRoomMember, StateKey: ev.Sender})
		}
	}
	members, err := s.db.RoomStateAfter(ctx, chunk[0].EventID, keys)
	if err != nil {
		return nil, err
	}
	return clientEvents(members)
}

// heroMembers adds to a lazy-loading /sync entry with a summary the
// member events of its heroes that neither its state nor its timeline
// holds and the device was not sent, so that a client can name a room
// that has neither a name nor a canonical alias (as Synapse does; a room
// with either gets none).
func (s *Service) heroMembers(ctx context.Context, req SyncRequest, roomID string, room *JoinedRoom, full bool) error {
	have := map[string]bool{}
	for _, evs := range [][]ClientEvent{room.State.Events, room.Timeline.Events} {
		for _, ev := range evs {
			if ev.Type == spec.MRoomMember && ev.StateKey != nil {
				have[*ev.StateKey] = true
			}
		}
	}
	keys := []storage.StateKey{{Type: spec.MRoomName}, {Type: spec.MRoomCanonicalAlias}}
	for _, h := range room.Summary.Heroes {
		if !have[h] {
			keys = append(keys, storage.StateKey{Type: spec.MRoomMember, StateKey: h})
		}
	}
	if len(keys) == 2 {
		return nil
	}
	state, err := s.db.RoomStateEvents(ctx, roomID, keys)
	if err != nil {
		return err
	}
	k := lazyKey{userID: req.UserID, deviceID: req.DeviceID}
	var add []storage.RoomEvent
	sent := map[string]string{}
	for _, ev := range state {
		switch {
		case ev.Type == spec.MRoomName && eventContentField(ev.JSON, "name") != "",
			ev.Type == spec.MRoomCanonicalAlias && eventContentField(ev.JSON, "alias") != "":
			return nil // named: the heroes are not needed
		case ev.Type != spec.MRoomMember || ev.StateKey == nil:
		case !full && !req.Filter.Room.State.IncludeRedundantMembers && s.lazy.sent(k, roomID, *ev.StateKey, ev.EventID, req.From):
		default:
			add = append(add, ev)
			sent[*ev.StateKey] = ev.EventID
		}
	}
	evs, err := clientEvents(add)
	if err != nil {
		return err
	}
	room.State.Events = append(room.State.Events, evs...)
	s.lazy.remember(k, roomID, sent, req.To)
	return nil
}
