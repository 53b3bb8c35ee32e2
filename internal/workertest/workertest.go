// Package workertest holds what the background workers' tests (the
// device-list sender and updater) share: a store on a fresh SQLite file, a
// bounded wait for a condition, a quiet logger and jitter switched off.
package workertest

import (
	"context"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

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
