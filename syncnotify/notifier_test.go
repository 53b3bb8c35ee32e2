package syncnotify

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

func fired(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// A stream advance wakes every waiter; a change of key counts wakes only
// the user's; shutdown releases all; only users with an open subscription
// are kept.
func TestNotifierWakes(t *testing.T) {
	n := New()
	a1, a2, b := n.Subscribe("@a:x"), n.Subscribe("@a:x"), n.Subscribe("@b:x")
	if w := n.Waiting(); w != 2 {
		t.Fatalf("%d users waiting, want 2", w)
	}
	streamA, streamB := a1.Stream(), b.Stream()
	n.UserKeysChanged("@a:x", "@nobody:x")
	if !fired(a1.User()) || !fired(a2.User()) || fired(b.User()) {
		t.Fatal("key counts woke the wrong waiters")
	}
	if fired(streamA) {
		t.Fatal("key counts advanced the stream")
	}
	n.StreamAdvanced()
	if !fired(streamA) || !fired(streamB) {
		t.Fatal("a stream advance did not wake every waiter")
	}
	if fired(a1.Stream()) {
		t.Fatal("the next advance's channel is already closed")
	}
	a1.Close()
	a2.Close()
	if w := n.Waiting(); w != 1 {
		t.Fatalf("%d users waiting after @a:x left, want 1", w)
	}
	n.Close()
	n.Close()
	if !fired(b.Closing()) {
		t.Fatal("shutdown did not release the waiter")
	}
}

type watcher struct {
	calls atomic.Int32
	fail  error
}

func (w *watcher) WatchStream(ctx context.Context, advanced func()) error {
	w.calls.Add(1)
	advanced()
	if w.fail != nil {
		return w.fail
	}
	<-ctx.Done()
	return nil
}

// Watch turns the database's advances into wake-ups until ctx ends.
func TestWatch(t *testing.T) {
	n := New()
	sub := n.Subscribe("@a:x")
	stream := sub.Stream()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{}
	done := make(chan struct{})
	log := logrus.New()
	log.SetOutput(io.Discard)
	go func() { defer close(done); n.Watch(ctx, w, log) }()
	select {
	case <-stream: // closed by the watcher's advance
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher's advance woke nobody")
	}
	cancel()
	<-done
	if c := w.calls.Load(); c != 1 {
		t.Fatalf("%d watches, want 1", c)
	}
	// A failing watch is not retried once ctx has ended.
	w2 := &watcher{fail: errors.New("connection lost")}
	n.Watch(ctx, w2, log)
	if c := w2.calls.Load(); c != 0 {
		t.Fatalf("watched %d times after the end", c)
	}
}
