package keyserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// fakeClock is a Clock the test moves by hand: waits end only when it
// advances past them.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []fakeTimer
}

type fakeTimer struct {
	at time.Time
	ch chan time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.UnixMilli(1_700_000_000_000)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	c.timers = append(c.timers, fakeTimer{c.now.Add(d), ch})
	return ch
}

// Advance moves the clock and fires the waits that have ended.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.timers[:0]
	for _, t := range c.timers {
		if !t.at.After(c.now) {
			t.ch <- c.now
		} else {
			kept = append(kept, t)
		}
	}
	c.timers = kept
}

func openStore(t *testing.T, serverName string) *sqlstore.Store {
	t.Helper()
	s, err := sqlstore.Open(context.Background(), "file:"+filepath.Join(t.TempDir(), "ks.db"), serverName)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func noJitter(int64) int64 { return 0 }

func quiet() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// Users of one server are resynced one at a time; servers in different
// shards go in parallel.
func TestUpdaterShardsByServer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db := openStore(t, "local.test")
	u := NewUpdater(db, nil, UpdaterOptions{Shards: 4, Clock: newFakeClock(), Jitter: noJitter, Logger: quiet()})
	// Two servers in different shards.
	servers := []string{"s0.test"}
	for i := 1; len(servers) < 2; i++ {
		if s := fmt.Sprintf("s%d.test", i); u.shardOf(s) != u.shardOf(servers[0]) {
			servers = append(servers, s)
		}
	}
	for _, srv := range servers {
		for i := 0; i < 4; i++ {
			if err := db.MarkRemoteStale(ctx, fmt.Sprintf("@u%d:%s", i, srv), srv, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	var mu sync.Mutex
	inFlight, peak := map[string]int{}, map[string]int{}
	total, peakTotal, done := 0, 0, 0
	release := make(chan struct{})
	u.resync = func(ctx context.Context, server, userID string) error {
		mu.Lock()
		inFlight[server]++
		total++
		peak[server] = max(peak[server], inFlight[server])
		peakTotal = max(peakTotal, total)
		mu.Unlock()
		<-release
		mu.Lock()
		inFlight[server]--
		total--
		done++
		mu.Unlock()
		_, err := db.ReplaceRemoteDeviceList(ctx, storage.RemoteDeviceList{UserID: userID, StreamID: 1}, server)
		return err
	}
	go u.Run(ctx)
	waitUntil(t, "both servers to be worked on", func() bool { mu.Lock(); defer mu.Unlock(); return total == 2 })
	close(release)
	waitUntil(t, "all resyncs", func() bool { mu.Lock(); defer mu.Unlock(); return done == 8 })
	for _, srv := range servers {
		if peak[srv] != 1 {
			t.Errorf("%s had %d resyncs in flight at once", srv, peak[srv])
		}
	}
	if peakTotal != 2 {
		t.Errorf("servers in different shards were not worked on together (peak %d)", peakTotal)
	}
	waitUntil(t, "the queue to empty", func() bool {
		due, _ := db.DueStaleUsers(ctx, 1<<62, 100)
		return len(due) == 0
	})
}

// A failed resync is retried after a backoff written to the database,
// longer after an error answer than after a timeout, doubling per attempt,
// at least any Retry-After; the rest of the server waits as long; and a
// restarted updater keeps to the schedule.
func TestUpdaterBackoff(t *testing.T) {
	ctx := context.Background()
	db := openStore(t, "local.test")
	clk := newFakeClock()
	o := UpdaterOptions{Clock: clk, Jitter: noJitter, TimeoutBase: time.Minute, TimeoutMax: 8 * time.Minute,
		ErrorBase: 5 * time.Minute, ErrorMax: time.Hour, Logger: quiet()}
	var failWith error
	calls := 0
	u := NewUpdater(db, func(ctx context.Context, server, userID string) error { calls++; return failWith }, o)
	for _, user := range []string{"@a:down.test", "@b:down.test"} {
		if err := db.MarkRemoteStale(ctx, user, "down.test", 0); err != nil {
			t.Fatal(err)
		}
	}
	entry := func(user string) storage.StaleUser {
		e, ok, err := db.StaleEntry(ctx, user)
		if err != nil || !ok {
			t.Fatalf("%s: %v %v", user, ok, err)
		}
		return e
	}
	now := func() int64 { return clk.Now().UnixMilli() }
	try := func(user string) { u.resyncOne(ctx, entry(user)) }

	for _, tc := range []struct {
		name     string
		err      error
		attempts int
		wait     time.Duration
	}{
		{"timeout", errors.New("i/o timeout"), 1, time.Minute},
		{"timeout again", errors.New("i/o timeout"), 2, 2 * time.Minute},
		{"error answer", &fedclient.HTTPError{Status: 502}, 3, 20 * time.Minute},
		{"Retry-After", &fedclient.HTTPError{Status: 429, RetryAfter: 2 * time.Hour}, 4, 2 * time.Hour},
		{"client backoff", nil, 4, 3 * time.Hour}, // the error is made below, at its time
	} {
		failWith = tc.err
		if tc.err == nil {
			failWith = &fedclient.BackoffError{Until: clk.Now().Add(tc.wait)}
		}
		before := calls
		try("@a:down.test")
		if calls != before+1 {
			t.Fatalf("%s: resync not attempted", tc.name)
		}
		e := entry("@a:down.test")
		if e.Attempts != tc.attempts || e.RetryAtTS != now()+tc.wait.Milliseconds() {
			t.Fatalf("%s: attempts %d retry in %v, want %d and %v", tc.name, e.Attempts,
				time.Duration(e.RetryAtTS-now())*time.Millisecond, tc.attempts, tc.wait)
		}
		// The server's other stale user is held back as long.
		if b := entry("@b:down.test"); b.RetryAtTS < e.RetryAtTS {
			t.Fatalf("%s: the server's other user is due earlier (%d < %d)", tc.name, b.RetryAtTS, e.RetryAtTS)
		}
		// Not retried before its time, even by a new updater.
		restarted := NewUpdater(db, u.resync, o)
		restarted.resyncOne(ctx, entry("@a:down.test"))
		if calls != before+1 {
			t.Fatalf("%s: retried before its time", tc.name)
		}
		clk.Advance(tc.wait)
	}

	// The server shows it is up: everything of it is due at once.
	failWith = nil
	u.ServerAlive(ctx, "down.test")
	if due, _ := db.DueStaleUsers(ctx, now(), 10); len(due) != 2 {
		t.Fatalf("after ServerAlive %d users due, want 2", len(due))
	}
}

// recordingTransport captures transactions and fails while told to.
type recordingTransport struct {
	mu   sync.Mutex
	txns []fedclient.Transaction
	ids  []string
	fail bool
}

func (r *recordingTransport) SendTransaction(ctx context.Context, dest, txnID string, t fedclient.Transaction) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ids = append(r.ids, txnID)
	if r.fail {
		return errors.New("connection refused")
	}
	r.txns = append(r.txns, t)
	return nil
}

func (r *recordingTransport) counts() (attempts, delivered int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ids), len(r.txns)
}

// Only the newest pending update of a device is sent, prev_ids chain per
// destination, failures back off and a sign of life ends the wait.
func TestSenderDedupPrevIDAndBackoff(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db := openStore(t, "local.test")
	svc := New(db, Options{ServerName: "local.test", BcryptCost: 4, Logger: quiet()})
	alice := "@alice:local.test"
	if _, err := db.CreateAccount(ctx, alice, "x", nil); err != nil {
		t.Fatal(err)
	}
	login := func(device string) storage.StreamPos {
		r, err := db.Login(ctx, storage.NewLogin{UserID: alice, DeviceID: device, TokenHash: device})
		if err != nil {
			t.Fatal(err)
		}
		return r.Pos
	}
	rename := func(device, name string) storage.StreamPos {
		pos, err := db.SetDeviceDisplayName(ctx, alice, device, name)
		if err != nil {
			t.Fatal(err)
		}
		return pos
	}
	d1 := login("D1") // not queued: nobody remote shares a room yet
	for _, u := range []string{alice, "@bob:remote.test"} {
		if _, err := db.SetMembership(ctx, "!r:x", u, storage.MembershipJoin, 0); err != nil {
			t.Fatal(err)
		}
	}
	rename("D1", "one")
	latest := rename("D1", "two") // replaces the pending "one"
	d2 := login("D2")
	pending, err := db.PendingUpdates(ctx, "remote.test", 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 2 || pending[0].StreamID != int64(latest) || pending[1].StreamID != int64(d2) {
		t.Fatalf("pending %+v, want D1 at %d and D2 at %d", pending, latest, d2)
	}
	// Never sent here: the chain starts at the last change before the room
	// was shared (what a fetch of the list then reports), not at the
	// replaced "one", which never went out.
	if pending[0].PrevID != int64(d1) || pending[1].PrevID != int64(latest) {
		t.Fatalf("prev_ids %d, %d, want %d, %d", pending[0].PrevID, pending[1].PrevID, d1, latest)
	}

	clk := newFakeClock()
	tr := &recordingTransport{fail: true}
	sender := NewSender(db, tr, SenderOptions{ServerName: "local.test", Clock: clk, MinRetry: time.Minute, MaxRetry: time.Hour,
		Sweep: time.Hour, Jitter: noJitter, Logger: quiet()})
	svc.sender = sender
	go sender.Run(ctx)
	waitUntil(t, "the first attempt", func() bool { a, _ := tr.counts(); return a == 1 })
	clk.Advance(59 * time.Second)
	if a, _ := tr.counts(); a != 1 {
		t.Fatal("retried before the backoff ended")
	}
	clk.Advance(time.Second)
	waitUntil(t, "the second attempt", func() bool { a, _ := tr.counts(); return a == 2 })
	tr.mu.Lock()
	tr.fail = false
	sameID := tr.ids[0] == tr.ids[1]
	tr.mu.Unlock()
	if !sameID {
		t.Fatal("a retried batch changed its transaction ID")
	}
	sender.DestinationAlive("remote.test") // ends the two-minute wait at once
	waitUntil(t, "delivery", func() bool { _, d := tr.counts(); return d == 1 })
	edus := tr.txns[0].EDUs
	if len(edus) != 2 || edus[0].Type != "m.device_list_update" {
		t.Fatalf("EDUs %v", edus)
	}
	waitUntil(t, "the queue to empty", func() bool { p, _ := db.PendingDestinations(ctx); return len(p) == 0 })

	// The next update chains to the last one delivered.
	next := rename("D2", "x")
	svc.localChange(next)
	waitUntil(t, "the next delivery", func() bool { _, d := tr.counts(); return d == 2 })
	want := fmt.Sprintf(`"prev_id":[%d]`, d2)
	if got := string(tr.txns[1].EDUs[0].Content); !strings.Contains(got, want) {
		t.Fatalf("EDU %s lacks %s", got, want)
	}
	waitUntil(t, "the worker to go away", func() bool { return sender.Busy() == 0 })
}

// Of two daemons on one database, the one holding a destination's lease
// sends; the other's worker stands down instead of spinning.
func TestSenderLeaseHeldElsewhere(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db := openStore(t, "local.test")
	alice := "@alice:local.test"
	if _, err := db.CreateAccount(ctx, alice, "x", nil); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{alice, "@bob:remote.test"} {
		if _, err := db.SetMembership(ctx, "!r:x", u, storage.MembershipJoin, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Login(ctx, storage.NewLogin{UserID: alice, DeviceID: "D1", TokenHash: "t"}); err != nil {
		t.Fatal(err)
	}
	clk := newFakeClock()
	now := clk.Now().UnixMilli()
	if ok, err := db.AcquireDestination(ctx, "remote.test", "other-daemon", now, now+60_000); err != nil || !ok {
		t.Fatalf("lease: %v %v", ok, err)
	}
	tr := &recordingTransport{}
	counted := &leaseCounter{Database: db}
	sender := NewSender(counted, tr, SenderOptions{ServerName: "local.test", Clock: clk, Sweep: time.Hour, Logger: quiet()})
	go sender.Run(ctx)
	waitUntil(t, "the worker to try and stand down", func() bool { return counted.calls.Load() >= 1 && sender.Busy() == 0 })
	if n := counted.calls.Load(); n != 1 {
		t.Fatalf("%d lease attempts: the worker kept trying", n)
	}
	if a, _ := tr.counts(); a != 0 {
		t.Fatal("sent without the lease")
	}
	// Once the other daemon's lease has expired, the next sweep sends.
	clk.Advance(2 * time.Hour)
	waitUntil(t, "delivery after the lease expired", func() bool { _, d := tr.counts(); return d == 1 })
}

// leaseCounter counts lease attempts.
type leaseCounter struct {
	storage.Database
	calls atomic.Int32
}

func (l *leaseCounter) AcquireDestination(ctx context.Context, dest, owner string, now, expires int64) (bool, error) {
	l.calls.Add(1)
	return l.Database.AcquireDestination(ctx, dest, owner, now, expires)
}
