package sqlstore

import (
	"context"

	"github.com/keyserver/keyserver/storage"
)

// StartRoomWrite starts WriteRoomEvents and returns a function that waits
// for its result, which the caller must call, soon. Writes of one room
// started one after the other are made in that order, so that a write
// may be built on one started before it and not yet committed (its Head
// that one's NewHead): if that one fails, the later one fails too, with
// storage.ErrRoomMoved, its head never having been the room's.
//
// On SQLite the write joins the write queue at once, and often the
// commit of the writes before it. So does a plain message on PostgreSQL
// (writeMessages) when the room's write before it, if any, is one too:
// the message batches are written one after the other, and a batch
// writes its messages in order. Any other write waits for the room's
// write before it to end (a transaction that locked the room first would
// find it not yet moved on).
func (s *Store) StartRoomWrite(ctx context.Context, w storage.RoomWrite) func() (storage.RoomWriteResult, error) {
	res := new(storage.RoomWriteResult)
	if s.batcher != nil {
		p := &pendingWrite{ctx: ctx, fn: s.roomWrite(ctx, w, res)}
		waited, err := s.batcher.enqueue(p)
		return func() (_ storage.RoomWriteResult, err2 error) {
			defer named("StartRoomWrite", &err2)
			if err != nil {
				return storage.RoomWriteResult{}, err
			}
			ch, err := s.batcher.await(p, waited)
			res.Change = ch
			return *res, err
		}
	}
	f := &roomFlight{done: make(chan struct{})}
	var members memberList
	if s.messages != nil && isPlainMessage(w) {
		members, f.batched = s.cachedMembers(w.StateSnapshot)
	}
	prevV, _ := s.roomWrites.Swap(w.RoomID, f)
	prev, _ := prevV.(*roomFlight)
	end := func() {
		s.roomWrites.CompareAndDelete(w.RoomID, f)
		close(f.done)
	}
	if f.batched && (prev == nil || prev.batched) {
		p := &pendingWrite{ctx: ctx, message: &w, members: members}
		waited, err := s.messages.enqueue(p)
		return func() (_ storage.RoomWriteResult, err2 error) {
			defer end()
			defer named("WriteRoomEvents", &err2)
			if err != nil {
				return storage.RoomWriteResult{}, err
			}
			if _, err := s.messages.await(p, waited); err != nil {
				return storage.RoomWriteResult{}, err
			}
			return p.roomResult, nil
		}
	}
	return func() (storage.RoomWriteResult, error) {
		defer end()
		if prev != nil {
			select {
			case <-prev.done:
			case <-ctx.Done():
				return storage.RoomWriteResult{}, ctx.Err()
			}
		}
		if f.batched {
			return s.writeMessage(ctx, w, members)
		}
		return s.WriteRoomEvents(ctx, w)
	}
}

// roomFlight is a room write started on PostgreSQL (StartRoomWrite):
// done is closed when it ends; batched says whether it is a message
// written by writeMessages.
type roomFlight struct {
	done    chan struct{}
	batched bool
}
