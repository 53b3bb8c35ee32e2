// Package workertest holds what the background workers' tests (the
// device-list sender and updater) share: stores to run against, a bounded
// wait for a condition, a quiet logger, jitter switched off, and database
// failures switched on by operation.
package workertest

import (
	"context"
	"errors"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// OpenStore opens a store on a fresh SQLite file, closed when the test ends.
func OpenStore(t *testing.T, serverName string) *sqlstore.Store {
	t.Helper()
	s, err := sqlstore.Open(context.Background(), "file:"+filepath.Join(t.TempDir(), "ks.db"), serverName)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Open opens a store on db for the server "local.test", closed when the
// test ends.
func Open(t *testing.T, db testdb.Database) *sqlstore.Store {
	t.Helper()
	s, err := sqlstore.Open(context.Background(), db.URI, "local.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// WaitUntil polls cond until it holds, failing the test after ten seconds.
func WaitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// NoJitter is a jitter function that adds nothing.
func NoJitter(int64) int64 { return 0 }

// Quiet is a logger that writes nowhere.
func Quiet() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// ErrDBDown is the error of an operation Faults makes fail.
var ErrDBDown = errors.New("database is down")

// Faults makes chosen operations of a test store fail, as they would while
// the database server is unreachable, and counts the calls of each. A
// wrapper of the store calls Fail with the operation's name first.
type Faults struct {
	mu      sync.Mutex
	failing map[string]bool
	calls   map[string]int
}

// SetFailing makes exactly the named operations fail from now on.
func (f *Faults) SetFailing(ops ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failing = map[string]bool{}
	for _, op := range ops {
		f.failing[op] = true
	}
}

// Called is how often op was called.
func (f *Faults) Called(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

// Fail counts a call of op and returns ErrDBDown when op is failing.
func (f *Faults) Fail(op string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.calls == nil {
		f.calls = map[string]int{}
	}
	f.calls[op]++
	if f.failing[op] {
		return ErrDBDown
	}
	return nil
}

// Warnings lists the warning lines logged with msg about ErrDBDown, and
// the "suppressed" count of each.
func Warnings(hook *logtest.Hook, msg string) []any {
	var out []any
	for _, e := range hook.AllEntries() {
		if err, ok := e.Data[logrus.ErrorKey].(error); ok && e.Level == logrus.WarnLevel && e.Message == msg && errors.Is(err, ErrDBDown) {
			out = append(out, e.Data["suppressed"])
		}
	}
	return out
}
