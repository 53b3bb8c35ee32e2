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
// is used for): a message, whose auth events are the create event, the
// power levels and its sender's membership, is built without reading the
// database again while the room's state stays as it is.
//
// When this daemon changes a room's state, what was read of the snapshot
// before is carried over to the new one (carry): otherwise every join
// would make each member's next message read its membership again, with
// the room's pipe held.
type stateCache struct {
	mu        sync.Mutex
	snapshots map[int64]snapshotEntries
	n         int // entries in all snapshots
}

// snapshotEntries are what was read of one snapshot; a nil event: the
// key is not in the snapshot.
type snapshotEntries map[storage.StateKey]gomatrixserverlib.PDU

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
	entries := c.snapshots[snapshot]
	for _, k := range keys {
		ev, ok := entries[k]
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
	entries = c.entries(snapshot, len(missing))
	for _, k := range missing {
		c.put(entries, k, nil)
	}
	for _, ev := range found {
		c.put(entries, storage.StateKey{Type: ev.Type(), StateKey: *ev.StateKey()}, ev)
	}
	return append(out, found...), nil
}

// carry moves what was read of snapshot from to snapshot to, which is
// from with ev's key set to ev (a state event this daemon wrote). The
// old snapshot is read again from the database if it is still needed.
func (c *stateCache) carry(from, to int64, ev gomatrixserverlib.PDU) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old, ok := c.snapshots[from]
	if !ok || from == to {
		return
	}
	delete(c.snapshots, from)
	if _, taken := c.snapshots[to]; taken {
		c.n -= len(old)
		return
	}
	c.snapshots[to] = old
	c.put(old, storage.StateKey{Type: ev.Type(), StateKey: *ev.StateKey()}, ev)
}

// entries returns a snapshot's entries, making room for n more; mu held.
func (c *stateCache) entries(snapshot int64, n int) snapshotEntries {
	if c.snapshots == nil || c.n+n > maxStateCacheEntries {
		c.snapshots, c.n = map[int64]snapshotEntries{}, 0
	}
	e := c.snapshots[snapshot]
	if e == nil {
		e = snapshotEntries{}
		c.snapshots[snapshot] = e
	}
	return e
}

// put sets an entry; mu held.
func (c *stateCache) put(e snapshotEntries, k storage.StateKey, ev gomatrixserverlib.PDU) {
	if _, ok := e[k]; !ok {
		c.n++
	}
	e[k] = ev
}
