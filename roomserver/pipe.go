package roomserver

import (
	"context"
	"sync"

	"github.com/keyserver/keyserver/storage"
)

// roomPipe is one room's local writes. One event is built at a time (mu),
// on head: the room as last read, or as this daemon's last write to it
// leaves it. A message (an event that changes no state) does not wait for
// the write before it to commit: it is built on that write's event and
// written after it (storage's StartRoomWrite keeps the order), so the
// messages of a busy room share commits instead of queueing for the
// room. If that write fails, so does this one (storage.ErrRoomMoved: its
// head was never the room's), and it is built again on the room as it is.
// Every other write of the room (state, joins, events of other servers)
// waits for the room's writes in flight, under mu, and the room is read
// again after it.
type roomPipe struct {
	mu   sync.Mutex
	head *storage.Room // nil: read the room
	last *flight       // the room's newest write started here
	// txns are the client transactions of writes in flight, so that a
	// retried request waits for its first one rather than sending again.
	txns map[storage.RoomTxn]*flight
}

// flight is a write in flight; err and eventID are set before done is
// closed.
type flight struct {
	done    chan struct{}
	err     error
	eventID string
}

func (f *flight) finished() bool {
	select {
	case <-f.done:
		return true
	default:
		return false
	}
}

// pipe returns a room's pipe.
func (s *Service) pipe(roomID string) *roomPipe {
	p, _ := s.pipes.LoadOrStore(roomID, &roomPipe{})
	return p.(*roomPipe)
}

// lock takes a room for a write that is not a message sent by send: the
// writes in flight end first, and the room is read again after it.
func (s *Service) lock(roomID string) func() {
	p := s.pipe(roomID)
	p.mu.Lock()
	p.drain()
	p.head = nil
	return p.mu.Unlock
}

// drain waits, with mu held, for the room's writes in flight (they do not
// need mu to end), and forgets the head if the last failed.
func (p *roomPipe) drain() {
	if p.last == nil {
		return
	}
	<-p.last.done
	p.settle()
}

// settle, with mu held, forgets the last write once it has ended, and the
// head it left if it failed.
func (p *roomPipe) settle() {
	if p.last == nil || !p.last.finished() {
		return
	}
	if p.last.err != nil {
		p.head = nil
	}
	p.last = nil
	clear(p.txns)
}

// inFlight returns the write in flight of a client transaction, if any.
func (p *roomPipe) inFlight(t *storage.RoomTxn) *flight {
	if t == nil || p.txns == nil {
		return nil
	}
	f := p.txns[*t]
	if f != nil && f.finished() {
		delete(p.txns, *t)
		return nil
	}
	return f
}

// current returns the head to build on, reading the room if need be.
func (p *roomPipe) current(ctx context.Context, db Store, roomID string) (storage.Room, error) {
	if p.head != nil {
		return *p.head, nil
	}
	room, err := db.Room(ctx, roomID)
	if err != nil {
		return room, err
	}
	p.head = &room
	return room, nil
}

// start starts a write with mu held, in the room's order (storage's
// StartRoomWrite), and returns the function that waits for its result,
// which must be called.
func (p *roomPipe) start(ctx context.Context, db Store, w storage.RoomWrite) func() (storage.RoomWriteResult, error) {
	f := &flight{done: make(chan struct{}), eventID: w.Events[len(w.Events)-1].EventID}
	wait := db.StartRoomWrite(ctx, w)
	p.last = f
	if w.Txn != nil {
		if p.txns == nil {
			p.txns = map[storage.RoomTxn]*flight{}
		}
		p.txns[*w.Txn] = f
	}
	return func() (storage.RoomWriteResult, error) {
		res, err := wait()
		f.err = err
		close(f.done)
		return res, err
	}
}
