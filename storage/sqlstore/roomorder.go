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
// commit of the writes before it; on PostgreSQL it waits for the room's
// write before it to end (a transaction that locked the room first would
// find it not yet moved on), and a plain message then joins the messages
// of other rooms waiting to be written (writeMessages).
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
	done := make(chan struct{})
	prev, _ := s.roomWrites.Swap(w.RoomID, done)
	return func() (storage.RoomWriteResult, error) {
		defer func() {
			s.roomWrites.CompareAndDelete(w.RoomID, done)
			close(done)
		}()
		if prev != nil {
			select {
			case <-prev.(chan struct{}):
			case <-ctx.Done():
				return storage.RoomWriteResult{}, ctx.Err()
			}
		}
		if s.messages != nil && isPlainMessage(w) {
			return s.writeMessage(ctx, w)
		}
		return s.WriteRoomEvents(ctx, w)
	}
}
