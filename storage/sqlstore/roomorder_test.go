package sqlstore_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// createRoomOfA writes room !r:x, created and joined by @a:x, and returns
// it as read back.
func createRoomOfA(t *testing.T, s *sqlstore.Store) storage.Room {
	t.Helper()
	ctx := context.Background()
	empty, a := "", "@a:x"
	if _, err := s.WriteRoomEvents(ctx, storage.RoomWrite{Create: &storage.Room{RoomID: "!r:x", RoomVersion: "10", Creator: a},
		RoomID: "!r:x", Events: []storage.RoomEvent{
			roomEvent("$create", "m.room.create", &empty, "", 1),
			roomEvent("$join", "m.room.member", &a, "join", 2),
		}}); err != nil {
		t.Fatal(err)
	}
	room, err := s.Room(ctx, "!r:x")
	if err != nil || room.Head == 0 {
		t.Fatalf("room %+v %v", room, err)
	}
	return room
}

// Room writes started one after the other are made in that order: a
// write built on one not yet committed (its Head that one's NewHead)
// succeeds after it; one built on a head the room never had fails with
// ErrRoomMoved, and so does every write built on that one, changing
// nothing.
func TestRoomWritesStartedInOrder(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		if _, err := s.CreateAccount(ctx, "@a:x", "x", nil); err != nil {
			t.Fatal(err)
		}
		a := "@a:x"
		room := createRoomOfA(t, s)
		// A chain of messages, each started before the one before it is
		// waited for.
		const n = 8
		waits := make([]func() (storage.RoomWriteResult, error), n)
		head, prev := room.Head, room.Extremities
		var ids []string
		batches := s.MessageBatches()
		for i := range n {
			id := "$m" + string(rune('a'+i))
			ids = append(ids, id)
			w := storage.RoomWrite{RoomID: "!r:x", Extremities: prev, Head: head, StateSnapshot: room.StateSnapshot,
				NewHead: int64(1000 + i), Events: []storage.RoomEvent{roomEvent(id, "m.room.message", nil, "", int64(3+i))}}
			waits[i] = s.StartRoomWrite(ctx, w)
			head, prev = w.NewHead, []string{id}
		}
		var positions []storage.StreamPos
		for i, wait := range waits {
			res, err := wait()
			if err != nil {
				t.Fatalf("message %d: %v", i, err)
			}
			if res.Head != int64(1000+i) || res.StateSnapshot != room.StateSnapshot {
				t.Fatalf("message %d left head %d, snapshot %d", i, res.Head, res.StateSnapshot)
			}
			positions = append(positions, res.Pos)
		}
		if !slices.IsSorted(positions) || positions[0] == positions[n-1] {
			t.Fatalf("positions %v: not in the order started", positions)
		}
		// On PostgreSQL the chain, all started before the first was
		// waited for, is written by one batch.
		if got := s.MessageBatches() - batches; db.Name == "postgres" && got != 1 {
			t.Fatalf("the chain of %d messages took %d message batches, want 1", n, got)
		}
		after, err := s.Room(ctx, "!r:x")
		if err != nil || after.Head != head || !slices.Equal(after.Extremities, prev) || after.Depth != 2+n {
			t.Fatalf("room after the chain %+v %v", after, err)
		}
		evs, err := s.RoomEventsByID(ctx, ids)
		if err != nil || len(evs) != n {
			t.Fatalf("%d of %d messages stored: %v", len(evs), n, err)
		}

		// Built on a head the room does not have, and one built on that.
		pos, _ := s.CurrentPos(ctx)
		bad := s.StartRoomWrite(ctx, storage.RoomWrite{RoomID: "!r:x", Extremities: prev, Head: head + 1, NewHead: 1,
			StateSnapshot: after.StateSnapshot, Events: []storage.RoomEvent{roomEvent("$bad", "m.room.message", nil, "", 20)}})
		onBad := s.StartRoomWrite(ctx, storage.RoomWrite{RoomID: "!r:x", Extremities: []string{"$bad"}, Head: 1, NewHead: 2,
			StateSnapshot: after.StateSnapshot, Events: []storage.RoomEvent{roomEvent("$onbad", "m.room.message", nil, "", 21)}})
		if _, err := bad(); !errors.Is(err, storage.ErrRoomMoved) {
			t.Fatalf("a write on a head the room does not have: %v", err)
		}
		if _, err := onBad(); !errors.Is(err, storage.ErrRoomMoved) {
			t.Fatalf("a write built on a failed one: %v", err)
		}
		if now, _ := s.CurrentPos(ctx); now != pos {
			t.Fatalf("refused writes moved the stream %d -> %d", pos, now)
		}
		if evs, err := s.RoomEventsByID(ctx, []string{"$bad", "$onbad"}); err != nil || len(evs) != 0 {
			t.Fatalf("refused events stored: %v %v", eventIDs(evs), err)
		}
		if r, err := s.Room(ctx, "!r:x"); err != nil || r.Head != head || !slices.Equal(r.Extremities, prev) {
			t.Fatalf("room after refused writes %+v %v", r, err)
		}
		// A retried transaction whose first made its event: refused,
		// nothing written; and a write built on it fails too.
		txn := &storage.RoomTxn{UserID: a, DeviceID: "D", Path: "p"}
		first := storage.RoomWrite{RoomID: "!r:x", Extremities: prev, Head: head, NewHead: 77, StateSnapshot: after.StateSnapshot,
			Txn: txn, Events: []storage.RoomEvent{roomEvent("$first", "m.room.message", nil, "", 30)}}
		if _, err := s.StartRoomWrite(ctx, first)(); err != nil {
			t.Fatal(err)
		}
		retry := first
		retry.Head, retry.NewHead, retry.Extremities = 77, 78, []string{"$first"}
		retry.Events = []storage.RoomEvent{roomEvent("$retry", "m.room.message", nil, "", 31)}
		onRetry := storage.RoomWrite{RoomID: "!r:x", Extremities: []string{"$retry"}, Head: 78, NewHead: 79, StateSnapshot: after.StateSnapshot,
			Events: []storage.RoomEvent{roomEvent("$onretry", "m.room.message", nil, "", 32)}}
		waitRetry, waitOn := s.StartRoomWrite(ctx, retry), s.StartRoomWrite(ctx, onRetry)
		if _, err := waitRetry(); !errors.Is(err, storage.ErrTxnDone) {
			t.Fatalf("a repeated transaction: %v", err)
		}
		if _, err := waitOn(); !errors.Is(err, storage.ErrRoomMoved) {
			t.Fatalf("a write built on a repeated transaction: %v", err)
		}
		if id, err := s.RoomTxnEvent(ctx, *txn); err != nil || id != "$first" {
			t.Fatalf("the transaction's event: %q %v", id, err)
		}
		if evs, err := s.RoomEventsByID(ctx, []string{"$retry", "$onretry"}); err != nil || len(evs) != 0 {
			t.Fatalf("refused events stored: %v %v", eventIDs(evs), err)
		}
		// On PostgreSQL messages go several to a statement.
		if db.Name == "postgres" && s.MessageBatches() == 0 {
			t.Fatal("no message went through PostgreSQL's message batches")
		}
		// A head names a room: an unknown one is not found.
		if _, err := s.StartRoomWrite(ctx, storage.RoomWrite{RoomID: "!nowhere:x", Head: 5, Extremities: []string{"$x"},
			Events: []storage.RoomEvent{roomEvent("$x", "m.room.message", nil, "", 1)}})(); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("a write to an unknown room: %v", err)
		}
	})
}

// On PostgreSQL a message whose client transaction another write takes
// while the message's batch runs (inserted before, committed after the
// batch looked) is refused with ErrTxnDone, and the room does not keep the
// head the message would have left: a message built on it fails too, and
// the room's extremity stays.
func TestRoomMessageTxnTakenMeanwhile(t *testing.T) {
	db := testutil.Postgres(t)
	ctx := context.Background()
	s := open(t, db)
	a := "@a:x"
	room := createRoomOfA(t, s)
	// A first message makes the room's members known to the batches.
	if _, err := s.StartRoomWrite(ctx, storage.RoomWrite{RoomID: "!r:x", Extremities: room.Extremities, Head: room.Head, NewHead: 10,
		StateSnapshot: room.StateSnapshot, Events: []storage.RoomEvent{roomEvent("$m0", "m.room.message", nil, "", 3)}})(); err != nil {
		t.Fatal(err)
	}
	batches := s.MessageBatches()

	// Another writer has the transaction, not yet committed.
	txn := &storage.RoomTxn{UserID: a, DeviceID: "D", Path: "p"}
	other, err := s.WriteDB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback() //nolint:errcheck
	if _, err := other.ExecContext(ctx, `INSERT INTO room_txns (user_id, device_id, txn_path, event_id, created_ts) VALUES ($1, $2, $3, $4, 0)`,
		txn.UserID, txn.DeviceID, txn.Path, "$elsewhere"); err != nil {
		t.Fatal(err)
	}
	taken := s.StartRoomWrite(ctx, storage.RoomWrite{RoomID: "!r:x", Extremities: []string{"$m0"}, Head: 10, NewHead: 11, Txn: txn,
		StateSnapshot: room.StateSnapshot, Events: []storage.RoomEvent{roomEvent("$taken", "m.room.message", nil, "", 4)}})
	onTaken := s.StartRoomWrite(ctx, storage.RoomWrite{RoomID: "!r:x", Extremities: []string{"$taken"}, Head: 11, NewHead: 12,
		StateSnapshot: room.StateSnapshot, Events: []storage.RoomEvent{roomEvent("$ontaken", "m.room.message", nil, "", 5)}})
	errs := make(chan error, 2)
	go func() {
		_, err := taken()
		errs <- err
		_, err = onTaken()
		errs <- err
	}()
	// The batch waits for the other writer's transaction.
	testutil.Eventually(t, "the batch to wait for the other transaction", func() bool {
		var n int
		err := s.WriteDB().QueryRowContext(ctx, `SELECT COUNT(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%write_room_messages%'`).Scan(&n)
		return err == nil && n > 0
	})
	if err := other.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; !errors.Is(err, storage.ErrTxnDone) {
		t.Fatalf("a message whose transaction was taken meanwhile: %v", err)
	}
	if err := <-errs; !errors.Is(err, storage.ErrRoomMoved) {
		t.Fatalf("a message built on it: %v", err)
	}
	if got := s.MessageBatches() - batches; got != 1 {
		t.Fatalf("the two messages took %d batches, want 1", got)
	}
	after, err := s.Room(ctx, "!r:x")
	if err != nil || after.Head == 11 || after.Head == 12 || !slices.Equal(after.Extremities, []string{"$m0"}) {
		t.Fatalf("room after the refused messages %+v %v", after, err)
	}
	if evs, err := s.RoomEventsByID(ctx, []string{"$taken", "$ontaken"}); err != nil || len(evs) != 0 {
		t.Fatalf("refused events stored: %v %v", eventIDs(evs), err)
	}
	// The room takes a message built on the head it has.
	if _, err := s.StartRoomWrite(ctx, storage.RoomWrite{RoomID: "!r:x", Extremities: after.Extremities, Head: after.Head, NewHead: 13,
		StateSnapshot: room.StateSnapshot, Events: []storage.RoomEvent{roomEvent("$next", "m.room.message", nil, "", 4)}})(); err != nil {
		t.Fatal(err)
	}
}

// A message with a client transaction whose room has moved is refused
// with ErrRoomMoved and leaves the transaction free: the same request,
// built again on the room's head, is written.
func TestRoomMessageOnAMovedRoomLeavesItsTxn(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		room := createRoomOfA(t, s)
		// A first message makes the room's members known to the batches
		// (on PostgreSQL, the message function writes the next ones).
		if _, err := s.StartRoomWrite(ctx, storage.RoomWrite{RoomID: "!r:x", Extremities: room.Extremities, Head: room.Head, NewHead: 10,
			StateSnapshot: room.StateSnapshot, Events: []storage.RoomEvent{roomEvent("$m0", "m.room.message", nil, "", 3)}})(); err != nil {
			t.Fatal(err)
		}
		batches := s.MessageBatches()
		txn := &storage.RoomTxn{UserID: "@a:x", DeviceID: "D", Path: "p"}
		_, err := s.StartRoomWrite(ctx, storage.RoomWrite{RoomID: "!r:x", Extremities: []string{"$m0"}, Head: 11, NewHead: 20,
			Txn: txn, StateSnapshot: room.StateSnapshot, Events: []storage.RoomEvent{roomEvent("$stale", "m.room.message", nil, "", 4)}})()
		if !errors.Is(err, storage.ErrRoomMoved) {
			t.Fatalf("a message on a head the room does not have: %v", err)
		}
		if _, err := s.StartRoomWrite(ctx, storage.RoomWrite{RoomID: "!r:x", Extremities: []string{"$m0"}, Head: 10, NewHead: 21,
			Txn: txn, StateSnapshot: room.StateSnapshot, Events: []storage.RoomEvent{roomEvent("$again", "m.room.message", nil, "", 4)}})(); err != nil {
			t.Fatalf("the same transaction on the room's head: %v", err)
		}
		if db.Name == "postgres" && s.MessageBatches()-batches != 2 {
			t.Fatalf("%d message batches, want the two messages written by the function", s.MessageBatches()-batches)
		}
		if id, err := s.RoomTxnEvent(ctx, *txn); err != nil || id != "$again" {
			t.Fatalf("the transaction's event: %q %v", id, err)
		}
	})
}

// A database whose message function is the one of migration 20 (its
// signature had a spare head), as every database that ran migration 20
// has, gets the new one from migration 22, and only it.
func TestMessageFunctionReplacedByMigration22(t *testing.T) {
	db := testutil.Postgres(t)
	ctx := context.Background()
	old, err := sqlstore.OpenAtSchema(ctx, db.URI, 21)
	if err != nil {
		t.Fatal(err)
	}
	// Migration 20 as released made the function with a spare head.
	var args int
	if err := old.DB().QueryRowContext(ctx, `SELECT pronargs FROM pg_proc
		WHERE proname = 'write_room_messages' AND pronamespace = current_schema()::regnamespace`).Scan(&args); err != nil || args != 20 {
		t.Fatalf("migration 20 made a function of %d arguments (%v), want 20", args, err)
	}
	old.Close()
	s := open(t, db)
	var n int
	if err := s.DB().QueryRowContext(ctx, `SELECT COUNT(*) FROM pg_proc
		WHERE proname = 'write_room_messages' AND pronamespace = current_schema()::regnamespace`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d functions named write_room_messages (%v), want 1", n, err)
	}
	room := createRoomOfA(t, s)
	if _, err := s.StartRoomWrite(ctx, storage.RoomWrite{RoomID: "!r:x", Extremities: room.Extremities, Head: room.Head, NewHead: 30,
		Txn: &storage.RoomTxn{UserID: "@a:x", DeviceID: "D", Path: "p"}, StateSnapshot: room.StateSnapshot,
		Events: []storage.RoomEvent{roomEvent("$m", "m.room.message", nil, "", 3)}})(); err != nil {
		t.Fatalf("a message after the upgrade: %v", err)
	}
}
