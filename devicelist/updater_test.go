package devicelist

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/internal/clock"
	"github.com/keyserver/keyserver/internal/workertest"
	"github.com/keyserver/keyserver/storage"
)

// The retry decisions after a failed resync, against the fake store: the
// wait depends on how the server failed and doubles per attempt, a refusal
// of the federation client is not an attempt, every stale user of the
// server is held back as long, and a success forgets the server's failure.
func TestResyncDecisions(t *testing.T) {
	ctx := context.Background()
	db := newFakeStore()
	clk := clock.NewFake()
	var failWith error
	calls := 0
	u := New(db, func(ctx context.Context, server, userID string) error { calls++; return failWith },
		Options{Clock: clk, Jitter: workertest.NoJitter, Logger: workertest.Quiet(), TimeoutBase: 10 * time.Second, TimeoutMax: 40 * time.Second,
			ErrorBase: time.Minute, ErrorMax: 3 * time.Minute})
	now := func() int64 { return clk.Now().UnixMilli() }
	db.mark("@a:down.test", "down.test", 0)
	db.mark("@b:down.test", "down.test", 0)
	db.mark("@c:up.test", "up.test", 0)
	try := func(user string) {
		e, _ := db.entry(user)
		u.resyncOne(ctx, e)
	}

	for _, tc := range []struct {
		name     string
		err      func() error
		attempts int
		wait     time.Duration
	}{
		{"timeout", func() error { return errors.New("i/o timeout") }, 1, 10 * time.Second},
		{"timeout again", func() error { return errors.New("i/o timeout") }, 2, 20 * time.Second},
		{"error answer", func() error { return &fedclient.HTTPError{Status: 500} }, 3, 3 * time.Minute}, // 1 min·2², capped
		{"Retry-After beyond the backoff", func() error { return &fedclient.HTTPError{Status: 429, RetryAfter: time.Hour} }, 4, time.Hour},
		{"timeout capped", func() error { return errors.New("i/o timeout") }, 5, 40 * time.Second},
		{"client refused", func() error { return &fedclient.BackoffError{Until: clk.Now().Add(7 * time.Minute)} }, 5, 7 * time.Minute},
		{"client refused, nearly over", func() error { return &fedclient.BackoffError{Until: clk.Now().Add(time.Millisecond)} }, 5, time.Second},
	} {
		failWith = tc.err()
		before := calls
		try("@a:down.test")
		if calls != before+1 {
			t.Fatalf("%s: not attempted", tc.name)
		}
		a, _ := db.entry("@a:down.test")
		if a.Attempts != tc.attempts || a.RetryAtTS != now()+tc.wait.Milliseconds() {
			t.Fatalf("%s: attempts %d, retry in %v; want %d, %v", tc.name, a.Attempts,
				time.Duration(a.RetryAtTS-now())*time.Millisecond, tc.attempts, tc.wait)
		}
		if b, _ := db.entry("@b:down.test"); b.RetryAtTS != a.RetryAtTS {
			t.Fatalf("%s: the server's other user retries at %d, not %d", tc.name, b.RetryAtTS, a.RetryAtTS)
		}
		if c, _ := db.entry("@c:up.test"); c.RetryAtTS != 0 {
			t.Fatalf("%s: another server's user was held back", tc.name)
		}
		// Not tried again before its time.
		try("@b:down.test")
		if calls != before+1 {
			t.Fatalf("%s: a held-back user was resynced", tc.name)
		}
		clk.Advance(tc.wait)
	}

	// A user whose mark went (resynced on demand meanwhile) is not fetched.
	db.remove("@c:up.test")
	before := calls
	a, _ := db.entry("@a:down.test")
	u.resyncOne(ctx, a)
	u.resyncOne(ctx, storage.StaleUser{UserID: "@c:up.test", ServerName: "up.test"})
	if calls != before+1 {
		t.Fatalf("%d resyncs, want 1 (the unmarked user is skipped)", calls-before)
	}

	// After a success the server is no longer held back here: a sign of
	// life costs no write.
	clk.Advance(time.Second)
	failWith = nil
	try("@b:down.test")
	u.ServerAlive("down.test")
	u.retryAlive(ctx)
	if n := db.called("RetryServerNow"); n != 0 {
		t.Fatalf("RetryServerNow called %d times for a server that answers", n)
	}
}

// Due users go to their server's shard once: a user being worked on is not
// handed out again, and a user that does not fit in a full shard stays due
// for the next round instead of being marked as worked on.
func TestDispatchOncePerUser(t *testing.T) {
	ctx := context.Background()
	db := newFakeStore()
	clk := clock.NewFake()
	u := New(db, nil, Options{Shards: 1, Clock: clk, Jitter: workertest.NoJitter, Logger: workertest.Quiet()})
	room := cap(u.shards[0])
	for i := 0; i < room+6; i++ {
		db.mark(fmt.Sprintf("@u%03d:s.test", i), "s.test", 0)
	}
	u.dispatch(ctx)
	if n := u.InFlight(); n != room {
		t.Fatalf("%d users in flight, want %d (the shard's room)", n, room)
	}
	u.dispatch(ctx)
	if n := len(u.shards[0]); n != room {
		t.Fatalf("%d users queued after a second round, want %d", n, room)
	}
	// The shard resyncs one: the next round hands out one more, not a
	// user already queued.
	first := <-u.shards[0]
	db.remove(first.UserID)
	u.done(first.UserID)
	u.dispatch(ctx)
	seen := map[string]bool{first.UserID: true}
	for len(u.shards[0]) > 0 {
		s := <-u.shards[0]
		if seen[s.UserID] {
			t.Fatalf("%s handed out twice", s.UserID)
		}
		seen[s.UserID] = true
	}
	if len(seen) != room+1 {
		t.Fatalf("%d users handed out, want %d", len(seen), room+1)
	}
}

// At start the users already due are spread over a window of 200 ms per
// user, at most StartSpread, keeping their attempt counts.
func TestStartSpreadsDueUsers(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		users  int
		window time.Duration
	}{{10, 2 * time.Second}, {100, 5 * time.Second}} {
		db := newFakeStore()
		clk := clock.NewFake()
		var drawn []int64
		maxJitter := func(n int64) int64 { drawn = append(drawn, n); return n - 1 }
		u := New(db, nil, Options{Clock: clk, Jitter: maxJitter, Logger: workertest.Quiet(), StartSpread: 5 * time.Second})
		for i := 0; i < tc.users; i++ {
			db.mark(fmt.Sprintf("@u%d:s.test", i), "s.test", clk.Now().UnixMilli()-int64(i))
		}
		db.mark("@later:s.test", "s.test", clk.Now().Add(time.Hour).UnixMilli())
		u.spreadStart(ctx)
		if len(drawn) != tc.users || drawn[0] != int64(tc.window)+1 {
			t.Fatalf("%d users: %d draws of up to %v, want %d of %v", tc.users, len(drawn), time.Duration(drawn[0]), tc.users, tc.window)
		}
		for id, s := range db.users {
			want := clk.Now().Add(tc.window).UnixMilli()
			if id == "@later:s.test" {
				want = clk.Now().Add(time.Hour).UnixMilli()
			}
			if s.RetryAtTS != want {
				t.Fatalf("%s retries at %d, want %d", id, s.RetryAtTS, want)
			}
		}
	}
}

// Run sleeps until the next user is due, by the clock, and then resyncs it.
func TestRunWaitsForTheNextDueUser(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	db := newFakeStore()
	clk := clock.NewFake()
	var mu sync.Mutex
	var resynced []string
	u := New(db, func(ctx context.Context, server, userID string) error {
		mu.Lock()
		resynced = append(resynced, userID)
		mu.Unlock()
		db.remove(userID)
		return nil
	}, Options{Shards: 2, Clock: clk, Jitter: workertest.NoJitter, Logger: workertest.Quiet()})
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(resynced) }
	db.mark("@a:s.test", "s.test", clk.Now().Add(90*time.Second).UnixMilli())
	done := make(chan struct{})
	go func() { defer close(done); u.Run(ctx) }()
	defer func() { cancel(); <-done }()

	workertest.WaitUntil(t, "the updater to wait", func() bool { return clk.Waiting() == 1 })
	clk.Advance(time.Minute) // waits are at most a minute
	workertest.WaitUntil(t, "the updater to wait again", func() bool { return clk.Waiting() == 1 })
	clk.Advance(29 * time.Second)
	workertest.WaitUntil(t, "the updater to wait again", func() bool { return clk.Waiting() == 1 })
	if n := count(); n != 0 {
		t.Fatal("resynced before it was due")
	}
	clk.Advance(time.Second)
	workertest.WaitUntil(t, "the resync", func() bool { return count() == 1 })
}

// A sign of life from a held-back server, which arrives on the path of
// each of its requests, returns without waiting for the database: the
// write that makes its users due is made in the background, once for a
// burst of requests.
func TestServerAliveDoesNotWait(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	db := newFakeStore()
	clk := clock.NewFake()
	var mu sync.Mutex
	fail := true
	resynced := 0
	u := New(db, func(ctx context.Context, server, userID string) error {
		mu.Lock()
		defer mu.Unlock()
		if fail {
			return errors.New("i/o timeout")
		}
		resynced++
		db.remove(userID)
		return nil
	}, Options{Clock: clk, Jitter: workertest.NoJitter, Logger: workertest.Quiet()})
	db.mark("@a:down.test", "down.test", 0)
	a, _ := db.entry("@a:down.test")
	u.resyncOne(ctx, a) // fails: the server is held back
	if e, _ := db.entry("@a:down.test"); e.RetryAtTS == 0 {
		t.Fatal("the server was not held back")
	}
	mu.Lock()
	fail = false
	mu.Unlock()
	db.block = make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); u.Run(ctx) }()
	defer func() { cancel(); <-done }()

	returned := func(f func()) {
		t.Helper()
		ch := make(chan struct{})
		go func() { defer close(ch); f() }()
		workertest.WaitUntil(t, "ServerAlive to return", func() bool {
			select {
			case <-ch:
				return true
			default:
				return false
			}
		})
	}
	returned(func() { u.ServerAlive("down.test") })
	workertest.WaitUntil(t, "the background write", func() bool { return db.called("RetryServerNow") == 1 })
	// The write is stuck in the database; more requests still return.
	returned(func() {
		for i := 0; i < 100; i++ {
			u.ServerAlive("down.test")
		}
	})
	close(db.block)
	workertest.WaitUntil(t, "the resync", func() bool { mu.Lock(); defer mu.Unlock(); return resynced == 1 })
	if n := db.called("RetryServerNow"); n != 1 {
		t.Fatalf("%d writes for one burst of requests, want 1", n)
	}
}
