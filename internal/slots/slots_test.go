package slots

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Two slots: a third caller waits, counted, and gives up when its context
// ends; once a slot is free it runs.
func TestSlots(t *testing.T) {
	s := New(2)
	release := make(chan struct{})
	running := make(chan struct{}, 2)
	for range 2 {
		go func() {
			_ = s.Do(context.Background(), func() error { running <- struct{}{}; <-release; return nil })
		}()
	}
	<-running
	<-running
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() { gaveUp <- s.Do(ctx, func() error { t.Error("ran without a slot"); return nil }) }()
	deadline := time.Now().Add(10 * time.Second)
	for s.Waiting() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the third caller does not wait")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("a caller whose context ended: %v", err)
	}
	if s.Waiting() != 0 {
		t.Fatalf("%d waiting after it gave up", s.Waiting())
	}
	close(release)
	boom := errors.New("boom")
	if err := s.Do(context.Background(), func() error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Do returned %v, want f's error", err)
	}
}
