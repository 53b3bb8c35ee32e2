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

// A stream advance wakes the waiters of the users it names (nil: all); a
// change of key counts wakes only the user's; shutdown releases all; only
// users with an open subscription are kept.
func TestNotifierWakes(t *testing.T) {
	n := New()
	a1, a2, b := n.Subscribe("@a:x"), n.Subscribe("@a:x"), n.Subscribe("@b:x")
	if w := n.Waiting(); w != 2 {
		t.Fatalf("%d users waiting, want 2", w)
	}
	n.UserKeysChanged("@a:x", "@nobody:x")
	if !fired(a1.User()) || !fired(a2.User()) || fired(b.User()) {
		t.Fatal("key counts woke the wrong waiters")
	}
	if fired(a1.Stream()) {
		t.Fatal("key counts advanced the stream")
	}
	n.StreamAdvanced([]string{"@b:x", "@nobody:x"})
	if fired(a1.Stream()) || fired(a2.Stream()) || !fired(b.Stream()) {
		t.Fatal("a change concerning @b:x woke the wrong waiters")
	}
	n.StreamAdvanced([]string{})
	if fired(a1.Stream()) || fired(b.Stream()) {
		t.Fatal("a change concerning nobody woke a waiter")
	}
	// Advances merge while one is pending.
	n.StreamAdvanced([]string{"@a:x"})
	n.StreamAdvanced([]string{"@a:x"})
	if !fired(a1.Stream()) || fired(a1.Stream()) {
		t.Fatal("two pending advances did not merge into one wake-up")
	}
	if !fired(a2.Stream()) {
		t.Fatal("the second waiter of @a:x was not woken")
	}
	n.StreamAdvanced(nil)
	if !fired(a1.Stream()) || !fired(a2.Stream()) || !fired(b.Stream()) {
		t.Fatal("an advance concerning anyone did not wake every waiter")
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

func (w *watcher) WatchStream(ctx context.Context, advanced func(users []string)) error {
	w.calls.Add(1)
	advanced([]string{"@a:x"})
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
	other := n.Subscribe("@b:x")
	stream := sub.Stream()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{}
	done := make(chan struct{})
	log := logrus.New()
	log.SetOutput(io.Discard)
	go func() { defer close(done); n.Watch(ctx, w, log) }()
	select {
	case <-stream: // the watcher's advance
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher's advance woke nobody")
	}
	cancel()
	<-done
	if fired(other.Stream()) {
		t.Fatal("the advance woke a user it does not concern")
	}
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

// A waiter without a goroutine is called for the events of its user only,
// with what happened, and at shutdown; after shutdown, at once.
func TestNotifierSubscribeFunc(t *testing.T) {
	n := New()
	var got []Event
	sub := n.SubscribeFunc("@a:x", func(e Event) { got = append(got, e) })
	n.StreamAdvanced([]string{"@b:x"})
	n.UserKeysChanged("@b:x")
	if len(got) != 0 {
		t.Fatalf("woken by another user's events: %v", got)
	}
	n.StreamAdvanced([]string{"@a:x"})
	n.UserKeysChanged("@a:x")
	n.StreamAdvanced(nil)
	n.Close()
	want := []Event{StreamEvent, UserEvent, StreamEvent, ClosingEvent}
	if len(got) != len(want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("events %v, want %v", got, want)
		}
	}
	sub.Close()
	if w := n.Waiting(); w != 0 {
		t.Fatalf("%d users waiting after Close, want 0", w)
	}
	var late []Event
	n.SubscribeFunc("@c:x", func(e Event) { late = append(late, e) }).Close()
	if len(late) != 1 || late[0] != ClosingEvent {
		t.Fatalf("subscribing after shutdown: %v, want [closing]", late)
	}
}
