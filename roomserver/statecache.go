package roomserver

import (
	"context"
	"sync"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/keyserver/keyserver/storage"
)

// stateCache keeps the state events read of state snapshots, parsed.
// A snapshot never changes once written, so an entry is never stale,
// whichever daemon wrote the snapshot (a redaction rewrites an event's
// JSON, but keeps every key the auth rules read, which is all the cache
// is used for): a message, whose auth events are
// the create event, the power levels and its sender's membership, is
// built without reading the database again while the room's state stays
// as it is.
type stateCache struct {
	mu      sync.Mutex
	entries map[stateCacheKey]gomatrixserverlib.PDU // nil: the key is not in the snapshot
}

type stateCacheKey struct {
	snapshot         int64
	evType, stateKey string
}

// maxStateCacheEntries bounds the cache; when it is full it starts over.
const maxStateCacheEntries = 50000

// SnapshotStore reads state snapshots.
type SnapshotStore interface {
	RoomSnapshotEvents(ctx context.Context, snapshot int64, keys []storage.StateKey) ([]storage.RoomEvent, error)
}

// snapshotState returns the events of a snapshot with the given keys,
// those that exist.
func (s *Service) snapshotState(ctx context.Context, snapshot int64, keys []storage.StateKey) ([]gomatrixserverlib.PDU, error) {
	c := &s.states
	var out []gomatrixserverlib.PDU
	var missing []storage.StateKey
	c.mu.Lock()
	for _, k := range keys {
		ev, ok := c.entries[stateCacheKey{snapshot, k.Type, k.StateKey}]
		switch {
		case !ok:
			missing = append(missing, k)
		case ev != nil:
			out = append(out, ev)
		}
	}
	c.mu.Unlock()
	if len(missing) == 0 {
		return out, nil
	}
	stored, err := s.db.RoomSnapshotEvents(ctx, snapshot, missing)
	if err != nil {
		return nil, err
	}
	found, err := pdus(stored)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil || len(c.entries)+len(missing) > maxStateCacheEntries {
		c.entries = map[stateCacheKey]gomatrixserverlib.PDU{}
	}
	for _, k := range missing {
		c.entries[stateCacheKey{snapshot, k.Type, k.StateKey}] = nil
	}
	for _, ev := range found {
		c.entries[stateCacheKey{snapshot, ev.Type(), *ev.StateKey()}] = ev
	}
	return append(out, found...), nil
}
