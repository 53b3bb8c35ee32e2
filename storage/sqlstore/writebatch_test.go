package sqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// insertAlias is a write that leaves a row to find.
func insertAlias(name string) string {
	return fmt.Sprintf(`INSERT INTO room_aliases (alias, room_id, creator) VALUES ('#%s:x', '!r:x', '@c:x')`, name)
}

func aliasExists(t *testing.T, s *sqlstore.Store, name string) bool {
	t.Helper()
	_, err := s.RoomAlias(context.Background(), "#"+name+":x")
	if err != nil && !errors.Is(err, storage.ErrNotFound) {
		t.Fatal(err)
	}
	return err == nil
}

var gates atomic.Int64

// gate starts a write that holds the writer (on SQLite; on PostgreSQL
// just a transaction) until release is called.
func gate(t *testing.T, s *sqlstore.Store) (release func()) {
	t.Helper()
	running, open := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := s.TestWrite(context.Background(), func(exec func(string, ...any) error, _ func() error) error {
			close(running)
			<-open
			return exec(insertAlias(fmt.Sprint("gate", gates.Add(1))))
		})
		done <- err
	}()
	<-running
	return func() {
		close(open)
		if err := <-done; err != nil {
			t.Errorf("the gate's write: %v", err)
		}
	}
}

// Writes that wait while one is written are each answered for what they
// did alone: a failed one is rolled back and gets its error, a panicking
// one panics in its caller, one whose caller gave up is not made, the
// others are committed with positions of their own. On SQLite they share
// one transaction.
func TestWaitingWritesAreEachTheirOwn(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		s := open(t, db)
		release := gate(t, s)
		boom := errors.New("boom")
		cancelled, cancel := context.WithCancel(context.Background())
		cancel()
		type result struct {
			ch     storage.Change
			err    error
			panicV any
		}
		writes := []struct {
			name string
			ctx  context.Context
			fn   func(exec func(string, ...any) error, pos func() error) error
		}{
			{"a", context.Background(), func(exec func(string, ...any) error, pos func() error) error {
				if err := exec(insertAlias("a")); err != nil {
					return err
				}
				return pos()
			}},
			{"b", context.Background(), func(exec func(string, ...any) error, pos func() error) error {
				if err := exec(insertAlias("b")); err != nil {
					return err
				}
				if err := pos(); err != nil {
					return err
				}
				return boom
			}},
			{"c", context.Background(), func(exec func(string, ...any) error, pos func() error) error {
				if err := exec(insertAlias("c")); err != nil {
					return err
				}
				return pos()
			}},
			{"d", context.Background(), func(exec func(string, ...any) error, pos func() error) error {
				if err := exec(insertAlias("d")); err != nil {
					return err
				}
				panic("d panics")
			}},
			{"e", cancelled, func(exec func(string, ...any) error, pos func() error) error {
				return exec(insertAlias("e"))
			}},
		}
		results := make([]result, len(writes))
		var wg sync.WaitGroup
		for i, w := range writes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { results[i].panicV = recover() }()
				results[i].ch, results[i].err = s.TestWrite(w.ctx, w.fn)
			}()
			if db.Name == "sqlite3" {
				// In this order, all waiting for the writer.
				testutil.Eventually(t, "the write to wait", func() bool { return s.QueuedWrites() == i+1 })
			}
		}
		before := s.Batches()
		release()
		wg.Wait()

		a, b, c, d, e := results[0], results[1], results[2], results[3], results[4]
		if a.err != nil || c.err != nil || a.panicV != nil || c.panicV != nil {
			t.Fatalf("a: %v %v, c: %v %v", a.err, a.panicV, c.err, c.panicV)
		}
		if a.ch.Pos == 0 || c.ch.Pos == 0 || a.ch.Pos == c.ch.Pos {
			t.Errorf("positions a %d, c %d: want two of their own", a.ch.Pos, c.ch.Pos)
		}
		if !errors.Is(b.err, boom) {
			t.Errorf("b: %v, want its own error", b.err)
		}
		if d.panicV != "d panics" {
			t.Errorf("d: panic %v, err %v; want its panic raised in its caller", d.panicV, d.err)
		}
		if !errors.Is(e.err, context.Canceled) && db.Name == "sqlite3" {
			t.Errorf("e: %v, want context.Canceled", e.err)
		}
		for name, want := range map[string]bool{"a": true, "b": false, "c": true, "d": false} {
			if got := aliasExists(t, s, name); got != want {
				t.Errorf("alias %s stored: %v, want %v", name, got, want)
			}
		}
		if db.Name == "sqlite3" {
			if aliasExists(t, s, "e") {
				t.Error("a write whose caller gave up was made")
			}
			// The gate's transaction, then one for the four that waited.
			if n := s.Batches() - before; n != 2 {
				t.Errorf("%d transactions after the gate opened, want 2", n)
			}
		}
		// Statements that would each have been a transaction, waiting
		// with a transaction: the one that fails is undone, the one
		// before it stays, as without waiting.
		release = gate(t, s)
		stmtsDone, txDone := make(chan error, 1), make(chan error, 1)
		go func() {
			stmtsDone <- s.TestStatements(context.Background(), insertAlias("s1"), insertAlias("s1"))
		}()
		if db.Name == "sqlite3" {
			testutil.Eventually(t, "the statements to wait", func() bool { return s.QueuedWrites() == 1 })
		}
		go func() {
			_, err := s.TestWrite(context.Background(), func(exec func(string, ...any) error, _ func() error) error {
				return exec(insertAlias("t1"))
			})
			txDone <- err
		}()
		if db.Name == "sqlite3" {
			testutil.Eventually(t, "the transaction to wait", func() bool { return s.QueuedWrites() == 2 })
		}
		release()
		if err := <-stmtsDone; err == nil {
			t.Error("a statement inserting an alias twice succeeded")
		}
		if err := <-txDone; err != nil {
			t.Errorf("the transaction beside it: %v", err)
		}
		if !aliasExists(t, s, "s1") || !aliasExists(t, s, "t1") {
			t.Error("the statement before the failed one, or the transaction beside them, was lost")
		}

		// The writer goes on after all that.
		if _, err := s.TestWrite(context.Background(), func(exec func(string, ...any) error, _ func() error) error {
			return exec(insertAlias("after"))
		}); err != nil || !aliasExists(t, s, "after") {
			t.Errorf("a write after the batch: %v", err)
		}
	})
}

// Closing an SQLite store lets the writes already waiting for its writer
// finish; a write after it fails without being made. (PostgreSQL writes
// wait for no writer of the store.)
func TestCloseFinishesWaitingWrites(t *testing.T) {
	db := testutil.SQLite(t)
	s, err := sqlstore.Open(context.Background(), db.URI, "x")
	if err != nil {
		t.Fatal(err)
	}
	release := gate(t, s)
	errs := make(chan error, 3)
	for i := range 3 {
		go func() {
			_, err := s.TestWrite(context.Background(), func(exec func(string, ...any) error, _ func() error) error {
				return exec(insertAlias(fmt.Sprint("w", i)))
			})
			errs <- err
		}()
	}
	testutil.Eventually(t, "three writes to wait", func() bool { return s.QueuedWrites() == 3 })
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	release()
	for range 3 {
		if err := <-errs; err != nil {
			t.Errorf("a waiting write: %v", err)
		}
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if _, err := s.TestWrite(context.Background(), func(exec func(string, ...any) error, _ func() error) error {
		return exec(insertAlias("late"))
	}); err == nil {
		t.Error("a write after Close succeeded")
	}
	s2 := open(t, db)
	for i := range 3 {
		if !aliasExists(t, s2, fmt.Sprint("w", i)) {
			t.Errorf("write w%d was not kept", i)
		}
	}
}
