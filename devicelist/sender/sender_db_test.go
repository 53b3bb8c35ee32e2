package sender

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/internal/clock"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/internal/workertest"
	"github.com/keyserver/keyserver/storage"
)

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
	db := workertest.OpenStore(t, "local.test")
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
		return pos.Pos
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

	clk := clock.NewFake()
	tr := &recordingTransport{fail: true}
	sender := New(db, tr, Options{ServerName: "local.test", Clock: clk, MinRetry: time.Minute, MaxRetry: time.Hour,
		Sweep: time.Hour, Jitter: workertest.NoJitter, Logger: workertest.Quiet()})
	go sender.Run(ctx)
	start := clk.Now()
	workertest.WaitUntil(t, "the first attempt", func() bool { a, _ := tr.counts(); return a == 1 })
	// Advance only once the sender waits for the retry.
	workertest.WaitUntil(t, "the wait for the retry", func() bool { return clk.WaitsUntil(start.Add(time.Minute)) })
	clk.Advance(59 * time.Second)
	if a, _ := tr.counts(); a != 1 {
		t.Fatal("retried before the backoff ended")
	}
	clk.Advance(time.Second)
	workertest.WaitUntil(t, "the second attempt", func() bool { a, _ := tr.counts(); return a == 2 })
	tr.mu.Lock()
	tr.fail = false
	sameID := tr.ids[0] == tr.ids[1]
	tr.mu.Unlock()
	if !sameID {
		t.Fatal("a retried batch changed its transaction ID")
	}
	sender.DestinationAlive("remote.test") // ends the two-minute wait at once
	workertest.WaitUntil(t, "delivery", func() bool { _, d := tr.counts(); return d == 1 })
	edus := tr.txns[0].EDUs
	if len(edus) != 2 || edus[0].Type != "m.device_list_update" {
		t.Fatalf("EDUs %v", edus)
	}
	workertest.WaitUntil(t, "the queue to empty", func() bool { p, _ := db.PendingDestinations(ctx); return len(p) == 0 })

	// The next update chains to the last one delivered.
	rename("D2", "x")
	sender.Poke()
	workertest.WaitUntil(t, "the next delivery", func() bool { _, d := tr.counts(); return d == 2 })
	want := fmt.Sprintf(`"prev_id":[%d]`, d2)
	if got := string(tr.txns[1].EDUs[0].Content); !strings.Contains(got, want) {
		t.Fatalf("EDU %s lacks %s", got, want)
	}
	workertest.WaitUntil(t, "the worker to go away", func() bool { return sender.Busy() == 0 })
}

// Of two daemons on one database, the one holding a destination's lease
// sends; the other's worker stands down instead of spinning.
func TestSenderLeaseHeldElsewhere(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db := workertest.OpenStore(t, "local.test")
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
	clk := clock.NewFake()
	now := clk.Now().UnixMilli()
	if ok, err := db.AcquireDestination(ctx, "remote.test", "other-daemon", now, now+60_000); err != nil || !ok {
		t.Fatalf("lease: %v %v", ok, err)
	}
	tr := &recordingTransport{}
	counted := &leaseCounter{Database: db}
	sender := New(counted, tr, Options{ServerName: "local.test", Clock: clk, Sweep: time.Hour, Logger: workertest.Quiet()})
	go sender.Run(ctx)
	workertest.WaitUntil(t, "the worker to try and stand down", func() bool {
		return counted.calls.Load() >= 1 && sender.Busy() == 0 && clk.WaitsUntil(clk.Now().Add(time.Hour))
	})
	if n := counted.calls.Load(); n != 1 {
		t.Fatalf("%d lease attempts: the worker kept trying", n)
	}
	if a, _ := tr.counts(); a != 0 {
		t.Fatal("sent without the lease")
	}
	// Once the other daemon's lease has expired, the next sweep sends.
	clk.Advance(2 * time.Hour)
	workertest.WaitUntil(t, "delivery after the lease expired", func() bool { _, d := tr.counts(); return d == 1 })
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

// failingDB is a database whose chosen methods fail, as they would while
// the database server is unreachable; the others work.
type failingDB struct {
	storage.Database
	workertest.Faults
}

func newFailingDB(db storage.Database) *failingDB { return &failingDB{Database: db} }

func (f *failingDB) ReleaseDestination(ctx context.Context, dest, owner string) error {
	if err := f.Fail("ReleaseDestination"); err != nil {
		return err
	}
	return f.Database.ReleaseDestination(ctx, dest, owner)
}

// A lease the sender cannot give back is logged, once a minute.
func TestSenderLogsDatabaseErrors(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, tdb testdb.Database) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		store := workertest.Open(t, tdb)
		alice := "@alice:local.test"
		if _, err := store.CreateAccount(ctx, alice, "x", nil); err != nil {
			t.Fatal(err)
		}
		for _, u := range []string{alice, "@bob:remote.test"} {
			if _, err := store.SetMembership(ctx, "!r:x", u, storage.MembershipJoin, 0); err != nil {
				t.Fatal(err)
			}
		}
		login := func(device string) {
			if _, err := store.Login(ctx, storage.NewLogin{UserID: alice, DeviceID: device, TokenHash: device}); err != nil {
				t.Fatal(err)
			}
		}
		db := newFailingDB(store)
		db.SetFailing("ReleaseDestination")
		clk := clock.NewFake()
		log, hook := logtest.NewNullLogger()
		tr := &recordingTransport{}
		sender := New(db, tr, Options{ServerName: "local.test", Clock: clk, Sweep: time.Hour, Jitter: workertest.NoJitter, Logger: log})
		done := make(chan struct{})
		go func() { defer close(done); sender.Run(ctx) }()
		defer func() { cancel(); <-done }()

		// deliver queues a change and waits until its worker is gone (it
		// has given back the lease, or tried to, and logged).
		deliver := func(device string, n int) {
			t.Helper()
			login(device)
			sender.Poke()
			workertest.WaitUntil(t, "delivery", func() bool {
				_, d := tr.counts()
				return d == n && db.Called("ReleaseDestination") >= n && sender.Busy() == 0
			})
		}
		deliver("D1", 1)
		if w := workertest.Warnings(hook, "releasing a destination's lease"); len(w) != 1 {
			t.Fatalf("warnings %v, want 1", w)
		}
		deliver("D2", 2)
		if w := workertest.Warnings(hook, "releasing a destination's lease"); len(w) != 1 {
			t.Fatalf("repeated error logged again: %v", w)
		}
		clk.Advance(time.Minute)
		deliver("D3", 3)
		// A worker may give the lease back more than once per delivery
		// (when woken again before it goes), so the count is at least the
		// one of the second delivery.
		if w := workertest.Warnings(hook, "releasing a destination's lease"); len(w) != 2 || w[1] == nil || w[1].(int) < 1 {
			t.Fatalf("after a minute: %v, want a second line counting those left out", w)
		}
	})
}
