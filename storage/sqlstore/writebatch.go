package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/keyserver/keyserver/storage"
)

// SQLite has one writer, and much of what a small write costs it is the
// commit: the log frames of every page the transaction touched are written
// out, however few rows changed. So on SQLite the writes that queue up
// while one is being written are written together: the next writer in
// line takes every write waiting, runs each in a savepoint of one
// transaction, and commits once. Each write still gets its own result: a
// write whose function fails is rolled back to its savepoint and gets its
// error; the others are committed. Pages several writes touch (the stream
// counter, the last page of a table or index) are written once for all.
//
// A write that finds no other in progress is written at once by its own
// goroutine, alone, as it would be without batching. Writes run in the
// order they came, and a later write in a batch sees the earlier ones, as
// it would have after their commits. A caller is answered only after the
// commit that made its write durable.

// maxBatch bounds how many writes one transaction holds, so that a long
// queue is committed in steps and the first callers are not kept waiting
// for the last.
const maxBatch = 64

// errStoreClosed answers writes that come after Close.
var errStoreClosed = errors.New("the store is closed")

// pendingWrite is one write: either a transaction (fn) or statements that
// would have run without one (stmts).
type pendingWrite struct {
	ctx   context.Context
	fn    func(*txn) error
	stmts func(querier) error
	// message is a room message written by writeMessages (PostgreSQL),
	// with its room's members; its result goes to roomResult.
	message    *storage.RoomWrite
	members    memberList
	roomResult storage.RoomWriteResult
	// wake tells a waiting write that it was written (finished) or that
	// it is to write the next batch.
	wake     chan struct{}
	finished bool
	// Filled by the batch's writer before finished is set.
	change  storage.Change
	err     error
	panicV  any
	paniced bool
}

// writeBatcher is SQLite's queue of writes.
type writeBatcher struct {
	s *Store
	// run writes a batch (writeBatch; PostgreSQL's messages: writeMessages).
	run     func(batch []*pendingWrite)
	mu      sync.Mutex
	queue   []*pendingWrite // waiting, in order; the head writes next
	writing bool            // a batch is being written
	closed  bool
	pending sync.WaitGroup // writes accepted and not answered
	// batches counts the transactions written, for tests.
	batches atomic.Int64
}

func newWriteBatcher(s *Store) *writeBatcher { return &writeBatcher{s: s, run: s.writeBatch} }

// write makes w, alone or in a batch, and returns its result; a panic of
// its function is raised again here, on the caller's goroutine.
func (b *writeBatcher) write(w *pendingWrite) (storage.Change, error) {
	waited, err := b.enqueue(w)
	if err != nil {
		return storage.Change{}, err
	}
	return b.await(w, waited)
}

// enqueue puts w in the queue, after every write enqueued before it:
// writes are made in the order enqueued. waited says whether w waits for
// its turn. The caller must then call await, soon: a write that does not
// wait writes the next batch on the caller's goroutine, and those after
// it wait for that.
func (b *writeBatcher) enqueue(w *pendingWrite) (waited bool, err error) {
	w.wake = make(chan struct{}, 1)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false, errStoreClosed
	}
	b.pending.Add(1)
	b.queue = append(b.queue, w)
	waited = b.writing
	b.writing = true
	return waited, nil
}

// await waits for w's turn, writes its batch if it heads the queue, and
// returns its result.
func (b *writeBatcher) await(w *pendingWrite, waited bool) (storage.Change, error) {
	defer b.pending.Done()
	if waited {
		<-w.wake
	}
	if !w.finished {
		b.writeNext() // w heads the queue
	}
	if w.paniced {
		panic(w.panicV)
	}
	return w.change, w.err
}

// writeNext writes the writes at the head of the queue, then hands the
// turn to the first write still waiting, if any, and answers the others.
func (b *writeBatcher) writeNext() {
	b.mu.Lock()
	n := min(len(b.queue), maxBatch)
	batch := b.queue[:n:n]
	b.queue = b.queue[n:]
	b.mu.Unlock()

	b.run(batch)
	b.batches.Add(1)

	b.mu.Lock()
	for _, w := range batch {
		w.finished = true
	}
	var next *pendingWrite
	if len(b.queue) > 0 {
		next = b.queue[0]
	} else {
		b.writing = false
		b.queue = nil // let the backing array go
	}
	b.mu.Unlock()
	if next != nil {
		next.wake <- struct{}{}
	}
	for _, w := range batch[1:] { // the head is the caller of writeNext
		w.wake <- struct{}{}
	}
}

// close refuses new writes and waits for those accepted.
func (b *writeBatcher) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.pending.Wait()
}

// writeBatch writes the batch in one transaction.
func (s *Store) writeBatch(batch []*pendingWrite) {
	defer s.writeTurn()()
	ctx := context.Background() // each write's own context is not for the others
	live := liveWrites(batch)
	if len(live) == 0 {
		return
	}
	if len(live) == 1 && live[0].stmts != nil {
		// Alone, statements run as they would without batching: each a
		// transaction by itself.
		live[0].err = s.runPending(live[0], pool{db: s.wdb, cache: s.wstmts})
		return
	}
	tx, err := s.wdb.BeginTx(ctx, nil)
	s.wstmts.sent.Add(1)
	if err != nil {
		for _, w := range live {
			w.err = err
		}
		return
	}
	alone := len(live) == 1
	txns := make([]*txn, len(live))
	for i, w := range live {
		t := &txn{tx: tx, cache: s.wstmts}
		txns[i] = t
		if w.stmts != nil {
			// Statements that would each have been a transaction need no
			// savepoint: SQLite undoes a failed statement by itself, and
			// the ones before it stay, as they would have.
			w.err = s.runPending(w, t)
			continue
		}
		if !alone {
			if _, err := t.ExecContext(ctx, `SAVEPOINT write`); err != nil {
				w.err = err
				s.failBatch(tx, live)
				return
			}
		}
		w.err = s.runPending(w, t)
		if alone {
			break
		}
		if w.err != nil {
			// Rolling back to a savepoint keeps it; releasing it then
			// leaves the transaction as it was before the write.
			if _, err := t.ExecContext(ctx, `ROLLBACK TO write`); err != nil {
				w.err = errors.Join(w.err, fmt.Errorf("rolling back a failed write: %w", err))
				s.failBatch(tx, live)
				return
			}
		}
		if _, err := t.ExecContext(ctx, `RELEASE write`); err != nil {
			w.err = errors.Join(w.err, err)
			s.failBatch(tx, live)
			return
		}
	}
	if alone && live[0].err != nil { // a transaction of its own: nothing of it stays
		s.wstmts.sent.Add(1)
		_ = tx.Rollback()
		txns[0].prepareMissed(ctx)
		return
	}
	s.wstmts.sent.Add(1)
	if err := tx.Commit(); err != nil {
		for _, w := range live {
			if w.err == nil {
				w.err = err
			}
		}
		return
	}
	for i, w := range live {
		t := txns[i]
		t.prepareMissed(ctx)
		if w.err != nil {
			continue
		}
		for _, f := range t.afterCommit {
			f()
		}
		w.change = t.change()
	}
}

// liveWrites returns the writes of a batch whose callers still wait: a
// write whose caller gave up before its turn is not made, and gets its
// context's error.
func liveWrites(batch []*pendingWrite) []*pendingWrite {
	live := batch[:0:0]
	for _, w := range batch {
		if err := w.ctx.Err(); err != nil {
			w.err = err
			continue
		}
		live = append(live, w)
	}
	return live
}

// failBatch ends a transaction that cannot go on: every write of the
// batch fails, the ones that had succeeded with errBatchFailed.
func (s *Store) failBatch(tx interface{ Rollback() error }, live []*pendingWrite) {
	s.wstmts.sent.Add(1)
	_ = tx.Rollback()
	for _, w := range live {
		if w.err == nil {
			w.err = errBatchFailed
		}
	}
}

// errBatchFailed answers a write that succeeded in a transaction another
// write of its batch left unusable; it was not committed.
var errBatchFailed = errors.New("the transaction this write was part of failed")

// runPending runs one write's function in t, turning a panic into a result
// that its caller raises again.
func (s *Store) runPending(w *pendingWrite, q querier) (err error) {
	defer func() {
		if v := recover(); v != nil {
			w.paniced, w.panicV = true, v
			err = fmt.Errorf("panic: %v", v)
		}
	}()
	if w.stmts != nil {
		return w.stmts(q)
	}
	return w.fn(q.(*txn))
}
