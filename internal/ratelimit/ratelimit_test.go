package ratelimit

import (
	"testing"
	"time"
)

func TestTokenBucket(t *testing.T) {
	now := time.Unix(0, 0)
	l := New(2, 3, func() time.Time { return now })
	for i := 0; i < 3; i++ {
		if ok, _ := l.Allow("a"); !ok {
			t.Fatalf("request %d of the burst refused", i)
		}
	}
	ok, wait := l.Allow("a")
	if ok || wait != 500*time.Millisecond {
		t.Fatalf("over the burst: %v %v", ok, wait)
	}
	if ok, _ := l.Allow("b"); !ok {
		t.Fatal("another key was limited")
	}
	now = now.Add(500 * time.Millisecond)
	if ok, _ := l.Allow("a"); !ok {
		t.Fatal("not refilled at the rate")
	}
	if ok, _ := l.Allow("a"); ok {
		t.Fatal("refilled too much")
	}
	// Idle keys are forgotten.
	now = now.Add(time.Hour)
	l.Allow("c")
	if n := l.Size(); n != 1 {
		t.Fatalf("%d buckets kept after an hour idle", n)
	}
	if ok, _ := New(0, 0, nil).Allow("x"); !ok {
		t.Fatal("a zero rate should allow everything")
	}
}

func TestPeekTakesNothing(t *testing.T) {
	now := time.Unix(0, 0)
	l := New(1, 2, func() time.Time { return now })
	for i := 0; i < 5; i++ {
		if ok, _ := l.Peek("a"); !ok {
			t.Fatalf("peek %d refused", i)
		}
	}
	l.Allow("a")
	l.Allow("a")
	if ok, wait := l.Peek("a"); ok || wait != time.Second {
		t.Fatalf("peek with the bucket empty: %v %v", ok, wait)
	}
}
