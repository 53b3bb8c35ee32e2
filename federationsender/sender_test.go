package federationsender

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyserver/keyserver/crosssigning"
	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/internal/clock"
	"github.com/keyserver/keyserver/internal/workertest"
	"github.com/keyserver/keyserver/storage"
)

// scriptedTransport records transactions and answers with the errors it
// is given, one per call (nil: delivered); during, when set, runs inside
// each call.
type scriptedTransport struct {
	mu     sync.Mutex
	errs   []error
	ids    []string
	txns   []fedclient.Transaction
	during func()
}

func (s *scriptedTransport) SendTransaction(ctx context.Context, dest, txnID string, t fedclient.Transaction) error {
	s.mu.Lock()
	during := s.during
	var err error
	if len(s.errs) > 0 {
		err, s.errs = s.errs[0], s.errs[1:]
	}
	s.ids = append(s.ids, txnID)
	if err == nil {
		s.txns = append(s.txns, t)
	}
	s.mu.Unlock()
	if during != nil {
		during()
	}
	return err
}

func (s *scriptedTransport) attempts() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

func (s *scriptedTransport) delivered() []fedclient.Transaction {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]fedclient.Transaction(nil), s.txns...)
}

// startTest makes a sender on q that is running as far as its bookkeeping
// goes, without workers, so a test drives process itself.
func startTest(q Store, tr Transport, o Options) *Sender {
	if o.Logger == nil {
		o.Logger = workertest.Quiet()
	}
	if o.Jitter == nil {
		o.Jitter = workertest.NoJitter
	}
	o.ServerName = "local.test"
	if o.FormatUpdate == nil {
		o.FormatUpdate = crosssigning.UpdateEDU
	}
	s := New(q, tr, o)
	s.running = true
	return s
}

// take hands the next ready destination to the test, as a worker would.
func take(t *testing.T, s *Sender) *destination {
	t.Helper()
	s.mu.Lock()
	n := len(s.queue)
	s.mu.Unlock()
	if n == 0 {
		t.Fatal("no destination is ready")
	}
	return s.next()
}

// Failed deliveries wait base·2^(n-1) plus jitter, but at most about 30 s
// while the destination was reached within the hour; the batch keeps its
// transaction ID; a refusal of the federation client is not an attempt
// and waits as long as the client asks; while it waits the destination's
// lease is paused (anyone may take it) and its failures are stored; a sign
// of life ends the wait and zeroes the failures, and one during a failing
// send makes it try again at once.
func TestRetryDecisions(t *testing.T) {
	ctx := context.Background()
	q := newFakeQueue()
	q.add("down.test", 3)
	clk := clock.NewFake()
	tr := &scriptedTransport{}
	var drawn []int64
	s := startTest(q, tr, Options{Clock: clk, MinRetry: 5 * time.Second, MaxRetry: time.Hour,
		Jitter: func(n int64) int64 { drawn = append(drawn, n); return 0 }})
	s.wake("down.test", false)
	start := clk.Now()

	for i, tc := range []struct {
		err  error
		wait time.Duration
	}{
		{errors.New("connection refused"), 5 * time.Second},
		{&fedclient.HTTPError{Status: 502}, 10 * time.Second},
		{errors.New("i/o timeout"), 20 * time.Second},
		{errors.New("i/o timeout"), 30 * time.Second}, // capped: reached within the hour
		{errors.New("i/o timeout"), 30 * time.Second},
		{&fedclient.BackoffError{}, 7 * time.Minute},
	} {
		if be, ok := tc.err.(*fedclient.BackoffError); ok {
			be.Until = clk.Now().Add(7 * time.Minute)
		}
		tr.errs = []error{tc.err}
		d := take(t, s)
		s.process(ctx, d)
		if tr.attempts() != i+1 {
			t.Fatalf("step %d: %d attempts", i, tr.attempts())
		}
		if d.state != waiting || !d.retryAt.Equal(clk.Now().Add(tc.wait)) {
			t.Fatalf("step %d: state %v, retry in %v, want waiting %v", i, d.state, d.retryAt.Sub(clk.Now()), tc.wait)
		}
		if l, ok := q.lease("down.test"); !ok || l.owner != s.owner || l.expires != 0 {
			t.Fatalf("step %d: lease %v, want paused under %s", i, l, s.owner)
		}
		attempts := min(i+1, 5) // the refusal is not an attempt
		if r := q.retries["down.test"]; r.Attempts != attempts || r.FailingSince != start.UnixMilli() || r.RetryAt != d.retryAt.UnixMilli() {
			t.Fatalf("step %d: stored %+v, want %d attempts since the start, retry at %d", i, r, attempts, d.retryAt.UnixMilli())
		}
		if next, ok := s.resume(clk.Now()); !ok || !next.Equal(d.retryAt) {
			t.Fatalf("step %d: next look in %v", i, next.Sub(clk.Now()))
		}
		clk.Advance(tc.wait - time.Millisecond)
		if s.resume(clk.Now()); d.state != waiting {
			t.Fatalf("step %d: woken before its time", i)
		}
		clk.Advance(time.Millisecond)
		s.resume(clk.Now())
	}
	// Jitter: up to a quarter added to an uncapped wait, taken off a capped one.
	if want := []int64{int64(5*time.Second)/4 + 1, int64(10*time.Second)/4 + 1}; drawn[0] != want[0] || drawn[1] != want[1] {
		t.Fatalf("jitter drawn from %v, want a quarter of the wait first", drawn)
	}
	tr.mu.Lock()
	for _, id := range tr.ids {
		if id != tr.ids[0] {
			t.Fatalf("transaction IDs %v: a retried batch changed its ID", tr.ids)
		}
	}
	tr.mu.Unlock()

	// A sign of life during a failing send: tried again at once, from zero.
	d := take(t, s)
	tr.errs = []error{errors.New("connection reset")}
	tr.during = func() { s.DestinationAlive("down.test") }
	s.process(ctx, d)
	if d.state != queued || d.attempt != 0 {
		t.Fatalf("state %v, %d attempts after a failure with a sign of life, want queued from zero", d.state, d.attempt)
	}
	tr.during = nil
	tr.errs = []error{errors.New("connection reset")}
	s.process(ctx, take(t, s))
	if d.state != waiting || !d.retryAt.Equal(clk.Now().Add(5*time.Second)) {
		t.Fatalf("the next failure waits %v, want the first step's 5s", d.retryAt.Sub(clk.Now()))
	}
	// A sign of life while it waits ends the wait; new updates do not.
	s.wake("down.test", false)
	if d.state != waiting {
		t.Fatal("new updates ended a backoff")
	}
	s.DestinationAlive("down.test")
	if d.state != queued || d.attempt != 0 {
		t.Fatalf("a sign of life left it %v with %d attempts", d.state, d.attempt)
	}
	s.process(ctx, take(t, s))
	if got := tr.delivered(); len(got) != 1 || len(got[0].EDUs) != 3 {
		t.Fatalf("delivered %v", got)
	}
	if q.left("down.test") != 0 || s.Busy() != 0 {
		t.Fatalf("after delivery: %d left, %d busy", q.left("down.test"), s.Busy())
	}
	if _, held := q.lease("down.test"); held {
		t.Fatal("the lease was not given back")
	}
	if _, failing := q.retries["down.test"]; failing {
		t.Fatal("a delivery left the stored failures")
	}
}

// A destination silent for over an hour waits as long again as it has
// been silent beyond the hour, up to the cap; within the hour, at most 30 s.
func TestRetryDelay(t *testing.T) {
	s := New(newFakeQueue(), &scriptedTransport{}, Options{FormatUpdate: crosssigning.UpdateEDU, Jitter: workertest.NoJitter})
	for _, tc := range []struct {
		attempt int
		silent  time.Duration
		want    time.Duration
	}{
		{1, 0, 5 * time.Second},
		{3, time.Minute, 20 * time.Second},
		{4, 2 * time.Minute, 30 * time.Second},
		{100, 59 * time.Minute, 30 * time.Second},
		{120, time.Hour, 30 * time.Second},
		{121, time.Hour + 10*time.Minute, 10 * time.Minute},
		{122, 2 * time.Hour, time.Hour},
		{123, 30 * time.Hour, time.Hour},
	} {
		if got := s.retryDelay(tc.attempt, tc.silent); got != tc.want {
			t.Errorf("attempt %d, silent %v: wait %v, want %v", tc.attempt, tc.silent, got, tc.want)
		}
	}
	// Jitter only shortens a capped wait: never over 30 s within the hour.
	s = New(newFakeQueue(), &scriptedTransport{}, Options{FormatUpdate: crosssigning.UpdateEDU, Jitter: func(n int64) int64 { return n - 1 }})
	if got := s.retryDelay(10, time.Minute); got > 30*time.Second || got < 22*time.Second {
		t.Errorf("capped wait with the most jitter: %v", got)
	}
}

// A destination whose failures were forgotten elsewhere (another daemon
// reached it or heard from it, or an operator asked) is tried at once;
// one stored as failing by another daemon has its sign of life written.
func TestSharedRetryState(t *testing.T) {
	ctx := context.Background()
	q := newFakeQueue()
	q.add("down.test", 1)
	clk := clock.NewFake()
	tr := &scriptedTransport{errs: []error{errors.New("connection refused")}}
	s := startTest(q, tr, Options{Clock: clk})
	s.wake("down.test", false)
	d := take(t, s)
	s.process(ctx, d)
	if d.state != waiting {
		t.Fatal("not waiting after a failure")
	}
	s.maintain(ctx)
	if d.state != waiting || !s.isFailing("down.test") {
		t.Fatal("its own stored failure woke it")
	}
	q.mu.Lock()
	delete(q.retries, "down.test")
	q.mu.Unlock()
	s.maintain(ctx)
	if d.state != queued || d.attempt != 0 {
		t.Fatalf("state %v, %d attempts once its failures were forgotten elsewhere", d.state, d.attempt)
	}
	s.process(ctx, take(t, s))
	if len(tr.delivered()) != 1 {
		t.Fatal("not delivered")
	}

	// Failing as another daemon stored it: a sign of life here is written.
	q.mu.Lock()
	q.retries["other.test"] = storage.DestinationRetry{Destination: "other.test", Attempts: 9, RetryAt: clk.Now().Add(time.Hour).UnixMilli()}
	q.mu.Unlock()
	s.maintain(ctx)
	s.DestinationAlive("other.test")
	s.DestinationAlive("healthy.test")
	s.mu.Lock()
	resets := len(s.resets)
	_, other := s.resets["other.test"]
	s.mu.Unlock()
	if resets != 1 || !other {
		t.Fatalf("resets %v, want other.test alone", s.resets)
	}
}

// A destination with more than 100 updates gets them in transactions of
// 100, oldest first, and goes to the back of the line between batches, so
// another destination is served in between.
func TestBatchesTakeTurns(t *testing.T) {
	ctx := context.Background()
	q := newFakeQueue()
	q.add("big.test", 250)
	q.add("small.test", 1)
	tr := &scriptedTransport{}
	s := startTest(q, tr, Options{Clock: clock.NewFake()})
	s.WakeAll(ctx)
	var order []string
	for s.Busy() > 0 {
		d := take(t, s)
		order = append(order, d.name)
		s.process(ctx, d)
	}
	if want := "[big.test small.test big.test big.test]"; fmt.Sprint(order) != want {
		t.Fatalf("turns %v, want %s", order, want)
	}
	var sizes []int
	var last int64
	for _, txn := range tr.delivered() {
		sizes = append(sizes, len(txn.EDUs))
		for _, e := range txn.EDUs {
			var c struct {
				UserID   string `json:"user_id"`
				StreamID int64  `json:"stream_id"`
			}
			if err := json.Unmarshal(e.Content, &c); err != nil {
				t.Fatal(err)
			}
			if c.UserID == "@alice:local.test" && len(txn.EDUs) > 1 {
				if c.StreamID <= last {
					t.Fatalf("stream %d after %d: not oldest first", c.StreamID, last)
				}
				last = c.StreamID
			}
		}
	}
	if fmt.Sprint(sizes) != "[100 1 100 50]" {
		t.Fatalf("transaction sizes %v", sizes)
	}
}

// A destination whose lease another daemon holds is left to it, without
// reading its queue; once that lease has expired, the next sweep sends.
func TestLeaseHeldByAnotherDaemon(t *testing.T) {
	ctx := context.Background()
	q := newFakeQueue()
	q.add("remote.test", 1)
	clk := clock.NewFake()
	q.leases["remote.test"] = fakeLease{"other-daemon", clk.Now().Add(time.Minute).UnixMilli()}
	tr := &scriptedTransport{}
	s := startTest(q, tr, Options{Clock: clk})
	s.WakeAll(ctx)
	s.process(ctx, take(t, s))
	if s.Busy() != 0 || q.called("PendingUpdates/100") != 0 || tr.attempts() != 0 {
		t.Fatalf("busy %d, %d reads, %d sends with the lease held elsewhere", s.Busy(), q.called("PendingUpdates/100"), tr.attempts())
	}
	clk.Advance(time.Minute + time.Millisecond)
	s.WakeAll(ctx)
	s.process(ctx, take(t, s))
	if len(tr.delivered()) != 1 {
		t.Fatal("not sent after the other lease expired")
	}
}

// Updates queued by another daemon while this one held the lease are
// found by the look after giving it back; those queued here meanwhile by
// the wake.
func TestLooksAgainAfterGivingBackTheLease(t *testing.T) {
	ctx := context.Background()
	q := newFakeQueue()
	q.add("remote.test", 1)
	tr := &scriptedTransport{}
	s := startTest(q, tr, Options{Clock: clock.NewFake()})
	s.WakeAll(ctx)
	// Another daemon queues an update during the send (it cannot take the
	// lease, so it does not send).
	tr.during = func() { q.add("remote.test", 1); tr.during = nil }
	s.process(ctx, take(t, s))
	if s.Busy() != 1 {
		t.Fatal("the destination was forgotten with an update pending")
	}
	s.process(ctx, take(t, s))
	if len(tr.delivered()) != 2 || s.Busy() != 0 {
		t.Fatalf("%d delivered, %d busy", len(tr.delivered()), s.Busy())
	}
	// Queued here while a worker had it: its wake sees to it.
	q.add("remote.test", 1)
	s.WakeAll(ctx)
	d := take(t, s)
	tr.during = func() { s.wake("remote.test", false) }
	s.process(ctx, d)
	tr.during = nil
	if d.state != queued {
		t.Fatalf("state %v after a wake during the send", d.state)
	}
}

// blockingTransport holds every send until released, counting the sends
// in flight.
type blockingTransport struct {
	mu        sync.Mutex
	inFlight  int
	peak      int
	delivered map[string]int
	release   chan struct{}
}

func (b *blockingTransport) SendTransaction(ctx context.Context, dest, txnID string, t fedclient.Transaction) error {
	b.mu.Lock()
	b.inFlight++
	b.peak = max(b.peak, b.inFlight)
	b.mu.Unlock()
	select {
	case <-b.release:
	case <-ctx.Done(): // the test ended early: let the sender stop
		return ctx.Err()
	}
	b.mu.Lock()
	b.inFlight--
	b.delivered[dest]++
	b.mu.Unlock()
	return nil
}

func (b *blockingTransport) state() (inFlight, peak, delivered int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inFlight, b.peak, len(b.delivered)
}

// However many destinations have updates, no more than the pool's workers
// are sent to at once, and every one is served.
func TestPoolBoundsConcurrentSends(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	q := newFakeQueue()
	for i := 0; i < 40; i++ {
		q.add(fmt.Sprintf("s%02d.test", i), 1)
	}
	tr := &blockingTransport{delivered: map[string]int{}, release: make(chan struct{})}
	s := New(q, tr, Options{FormatUpdate: crosssigning.UpdateEDU, ServerName: "local.test", Workers: 3, Clock: clock.NewFake(), Logger: workertest.Quiet(), Jitter: workertest.NoJitter})
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	workertest.WaitUntil(t, "the pool to be busy", func() bool { n, _, _ := tr.state(); return n == 3 })
	// The workers start on the first destinations while the sweep is
	// still adding the others: all 40 are known soon, none sent yet.
	workertest.WaitUntil(t, "every destination known", func() bool { return s.Busy() == 40 })
	if _, _, d := tr.state(); d != 0 {
		t.Fatalf("%d destinations served before any send was released", d)
	}
	close(tr.release)
	workertest.WaitUntil(t, "every destination", func() bool { _, _, d := tr.state(); return d == 40 && s.Busy() == 0 })
	if _, peak, _ := tr.state(); peak != 3 {
		t.Fatalf("%d sends at once with 3 workers", peak)
	}
}

// A sign of life, a poke and a look at the sender's state never wait on
// the database, whichever call of the workers is stuck in it.
func TestSignalsDoNotWaitOnTheDatabase(t *testing.T) {
	for _, op := range []string{"PendingDestinations", "AcquireDestination", "PendingUpdates/100",
		"MarkUpdatesSent", "ReleaseDestination", "PendingUpdates/1"} {
		t.Run(op, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			q := newFakeQueue()
			q.add("a.test", 1)
			hold := make(chan struct{})
			q.hold[op] = hold
			tr := &scriptedTransport{}
			s := New(q, tr, Options{FormatUpdate: crosssigning.UpdateEDU, ServerName: "local.test", Workers: 2, Clock: clock.NewFake(), Logger: workertest.Quiet(), Jitter: workertest.NoJitter})
			done := make(chan struct{})
			go func() { defer close(done); s.Run(ctx) }()
			defer func() { cancel(); <-done }()
			workertest.WaitUntil(t, "a worker to be stuck in "+op, func() bool { return q.blocked(op) > 0 })
			signalled := make(chan struct{})
			go func() {
				defer close(signalled)
				s.DestinationAlive("a.test")
				s.DestinationAlive("b.test")
				s.Poke()
				s.Busy()
			}()
			workertest.WaitUntil(t, "the signals to return", func() bool {
				select {
				case <-signalled:
					return true
				default:
					return false
				}
			})
			close(hold)
			workertest.WaitUntil(t, "delivery", func() bool { return len(tr.delivered()) == 1 && s.Busy() == 0 })
		})
	}
}

// A database error while a failed destination waits retries the database
// soon, but does not send before the destination's own retry time.
func TestDatabaseTroubleKeepsTheBackoff(t *testing.T) {
	ctx := context.Background()
	q := newFakeQueue()
	q.add("down.test", 1)
	clk := clock.NewFake()
	tr := &scriptedTransport{errs: []error{errors.New("connection refused")}}
	s := startTest(q, tr, Options{Clock: clk, MinRetry: time.Second, MaxRetry: time.Hour})
	s.wake("down.test", false)
	d := take(t, s)
	s.process(ctx, d)
	retryAt := d.retryAt
	if !retryAt.Equal(clk.Now().Add(time.Second)) {
		t.Fatalf("retry in %v", retryAt.Sub(clk.Now()))
	}
	// A second failure: two seconds.
	clk.Advance(time.Second)
	s.resume(clk.Now())
	tr.errs = []error{errors.New("connection refused")}
	s.process(ctx, take(t, s))
	retryAt = d.retryAt
	if !retryAt.Equal(clk.Now().Add(2 * time.Second)) {
		t.Fatalf("retry in %v", retryAt.Sub(clk.Now()))
	}
	// The database fails when the lease is taken again, before the retry
	// time: the destination's backoff stands.
	q.mu.Lock()
	q.failing["AcquireDestination"] = true
	q.mu.Unlock()
	s.mu.Lock()
	s.enqueue(d)
	s.mu.Unlock()
	s.process(ctx, take(t, s))
	if !d.retryAt.Equal(retryAt) {
		t.Fatalf("database trouble moved the retry from %v to %v", retryAt, d.retryAt)
	}
}

// However many workers there are, they make at most DatabaseSlots
// database calls at once, leaving the rest of the pool to requests; the
// others wait for a slot, and every destination is still served.
func TestWorkersShareFewDatabaseSlots(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	q := newFakeQueue()
	for i := 0; i < 20; i++ {
		q.add(fmt.Sprintf("s%02d.test", i), 1)
	}
	held := make(chan struct{})
	q.mu.Lock()
	q.hold["AcquireDestination"] = held
	q.mu.Unlock()
	tr := &blockingTransport{delivered: map[string]int{}, release: make(chan struct{})}
	close(tr.release)
	s := New(q, tr, Options{FormatUpdate: crosssigning.UpdateEDU, ServerName: "local.test", Workers: 6, DatabaseSlots: 2, Clock: clock.NewFake(),
		Logger: workertest.Quiet(), Jitter: workertest.NoJitter})
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	workertest.WaitUntil(t, "two workers in the database and four waiting for a slot", func() bool {
		return q.blocked("AcquireDestination") == 2 && s.dbSlots.Waiting() == 4
	})
	q.mu.Lock()
	delete(q.hold, "AcquireDestination")
	q.mu.Unlock()
	close(held)
	workertest.WaitUntil(t, "every destination", func() bool { _, _, d := tr.state(); return d == 20 && s.Busy() == 0 })
}

// Two daemons sharing a database are one server to the servers they send
// to, which take a transaction ID seen before for a retry: their
// transaction IDs never meet, even when both start in the same
// millisecond.
func TestDaemonsNeverShareTransactionIDs(t *testing.T) {
	clk := clock.NewFake()
	seen := map[string]bool{}
	for range 2 {
		q := newFakeQueue()
		q.add("remote.test", 3)
		tr := &scriptedTransport{}
		s := startTest(q, tr, Options{Clock: clk})
		s.Poke()
		s.WakeAll(context.Background())
		s.process(context.Background(), take(t, s))
		if len(tr.ids) != 1 {
			t.Fatalf("%d transactions sent, want 1", len(tr.ids))
		}
		if seen[tr.ids[0]] {
			t.Fatalf("two daemons both sent transaction %q", tr.ids[0])
		}
		seen[tr.ids[0]] = true
	}
}

// hangingTransport holds every send until its context ends, then fails;
// once open, it delivers.
type hangingTransport struct {
	mu        sync.Mutex
	open      bool
	hanging   int
	owners    []string
	delivered int
}

func (h *hangingTransport) SendTransaction(ctx context.Context, dest, txnID string, t fedclient.Transaction) error {
	h.mu.Lock()
	h.owners = append(h.owners, strings.Split(txnID, ".")[0])
	if h.open {
		h.delivered++
		h.mu.Unlock()
		return nil
	}
	h.hanging++
	h.mu.Unlock()
	<-ctx.Done()
	h.mu.Lock()
	h.hanging--
	h.mu.Unlock()
	return ctx.Err()
}

func (h *hangingTransport) state() (hanging, delivered int, owners []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.hanging, h.delivered, append([]string(nil), h.owners...)
}

// When the database no longer knows the daemon as alive (its hold broke),
// its sends stop at once, for another daemon may take its leases; it holds
// again under a new name and sends under that one.
func TestLostHoldStopsTheSends(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	q := newFakeQueue()
	q.add("remote.test", 1)
	tr := &hangingTransport{}
	clk := clock.NewFake()
	s := New(q, tr, Options{FormatUpdate: crosssigning.UpdateEDU, ServerName: "local.test", Clock: clk, Sweep: time.Hour, Logger: workertest.Quiet(), Jitter: workertest.NoJitter})
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	workertest.WaitUntil(t, "a send in flight", func() bool { h, _, _ := tr.state(); return h == 1 })
	holds := q.holdsMade()
	if len(holds) != 1 {
		t.Fatalf("%d holds", len(holds))
	}
	tr.mu.Lock()
	tr.open = true
	tr.mu.Unlock()
	close(holds[0].lost)
	workertest.WaitUntil(t, "delivery under a new hold", func() bool { _, d, _ := tr.state(); return d == 1 })
	_, _, owners := tr.state()
	holds = q.holdsMade()
	if len(holds) != 2 || owners[0] != holds[0].owner || owners[len(owners)-1] != holds[1].owner || holds[0].owner == holds[1].owner {
		t.Fatalf("sent as %v, holds %v", owners, holds)
	}
}
