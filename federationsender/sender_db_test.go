package federationsender

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

	"github.com/keyserver/keyserver/crosssigning"
	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/internal/clock"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/internal/workertest"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/postgres"
)

// recordingTransport captures transactions and fails while told to; with
// only set, a transaction to another destination is an error.
type recordingTransport struct {
	mu   sync.Mutex
	only string
	txns []fedclient.Transaction
	ids  []string // every attempt's transaction ID
	fail bool
}

func (r *recordingTransport) SendTransaction(ctx context.Context, dest, txnID string, t fedclient.Transaction) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.only != "" && dest != r.only {
		return fmt.Errorf("sent to %s", dest)
	}
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

func (r *recordingTransport) setFail(fail bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.fail = fail
}

// Only the newest pending update of a device is sent, prev_ids chain per
// destination, failures back off and a sign of life ends the wait.
func TestSenderDedupPrevIDAndBackoff(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, tdb testdb.Database) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		db := workertest.Open(t, tdb)
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
		sender := New(db, tr, Options{FormatUpdate: crosssigning.UpdateEDU, ServerName: "local.test", Clock: clk, MinRetry: time.Minute, MaxRetry: time.Hour, RecentRetry: 2 * time.Minute, Maintain: time.Hour,
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
	})
}

// leaseSetup makes a store on tdb with @alice:local.test sharing a room
// with @bob:remote.test, so that a login of hers queues an update for
// remote.test.
func leaseSetup(t *testing.T, tdb testdb.Database) (*leaseCounter, func(device string)) {
	ctx := context.Background()
	db := workertest.Open(t, tdb)
	alice := "@alice:local.test"
	if _, err := db.CreateAccount(ctx, alice, "x", nil); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{alice, "@bob:remote.test"} {
		if _, err := db.SetMembership(ctx, "!r:x", u, storage.MembershipJoin, 0); err != nil {
			t.Fatal(err)
		}
	}
	return &leaseCounter{Database: db}, func(device string) {
		t.Helper()
		if _, err := db.Login(ctx, storage.NewLogin{UserID: alice, DeviceID: device, TokenHash: device}); err != nil {
			t.Fatal(err)
		}
	}
}

// otherDaemon is a second daemon on the database of tdb, holding its
// leases under a name of its own (returned) until the returned function
// ends it as a kill would: its session ends without giving anything back.
// The function returns once the database has let go of it.
func otherDaemon(t *testing.T, tdb testdb.Database) (storage.Database, string, func()) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	other := workertest.Open(t, tdb)
	owner := "other-" + newOwner()
	lost, err := other.HoldOutboundOwner(ctx, owner)
	if err != nil {
		t.Fatal(err)
	}
	return other, owner, func() {
		cancel()
		<-lost
		if tdb.Name != "postgres" {
			return
		}
		workertest.WaitUntil(t, "the database to end the killed daemon's session", func() bool {
			var n int
			err := other.DB().QueryRow(`SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2
				AND classid = $1 AND objid = hashtext($2)::oid`, postgres.OutboundOwnerLock, owner).Scan(&n)
			return err == nil && n == 0
		})
	}
}

// runSender runs a sender on counted with a fake clock until the test
// ends.
func runSender(t *testing.T, counted *leaseCounter) (*Sender, *clock.Fake, *recordingTransport) {
	ctx, cancel := context.WithCancel(context.Background())
	clk := clock.NewFake()
	tr := &recordingTransport{}
	sender := New(counted, tr, Options{FormatUpdate: crosssigning.UpdateEDU, ServerName: "local.test", Clock: clk, Sweep: time.Hour, Logger: workertest.Quiet()})
	done := make(chan struct{})
	go func() { defer close(done); sender.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return sender, clk, tr
}

// leaseElsewhere has another daemon take remote.test's lease from now
// for d; kill ends that daemon.
func leaseElsewhere(t *testing.T, tdb testdb.Database, now time.Time, d time.Duration) (other storage.Database, owner string, kill func()) {
	other, owner, kill = otherDaemon(t, tdb)
	if held, _, err := other.AcquireDestination(context.Background(), "remote.test", owner, now.UnixMilli(), now.Add(d).UnixMilli()); err != nil || !held {
		t.Fatalf("lease: %v %v", held, err)
	}
	return other, owner, kill
}

// Of two daemons on one database, the one holding a destination's lease
// sends; the other's worker stands down instead of spinning, and sends
// once the lease has expired.
func TestSenderLeaseHeldElsewhere(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, tdb testdb.Database) {
		counted, login := leaseSetup(t, tdb)
		sender, clk, tr := runSender(t, counted)
		// Once this one runs (on SQLite it dropped every lease it found
		// at start), the other daemon takes the lease, then a change is
		// queued.
		workertest.WaitUntil(t, "the sender to start", func() bool { return counted.holds.Load() == 1 && clk.Waiting() > 0 })
		leaseElsewhere(t, tdb, clk.Now(), time.Minute)
		login("D1")
		sender.Poke()
		workertest.WaitUntil(t, "the worker to try and stand down", func() bool {
			return counted.calls.Load() >= 1 && sender.Busy() == 0
		})
		// Its maintenance, every second, does not take a live daemon's lease.
		for range 3 {
			clk.Advance(time.Second)
			workertest.WaitUntil(t, "maintenance", func() bool { return clk.WaitsUntil(clk.Now().Add(time.Second)) })
		}
		if n := counted.calls.Load(); n != 1 {
			t.Fatalf("%d lease attempts: the worker kept trying", n)
		}
		if a, _ := tr.counts(); a != 0 {
			t.Fatal("sent without the lease")
		}
		// Once the other daemon's lease has expired, the next sweep sends.
		clk.Advance(2 * time.Hour)
		workertest.WaitUntil(t, "delivery after the lease expired", func() bool { _, d := tr.counts(); return d == 1 })
	})
}

// A daemon that dies holding a lease (killed: nothing given back) keeps
// nobody from its destination. On SQLite the daemon that follows it on the
// database drops its leases at start; on PostgreSQL its lease is void as
// soon as its session ends, both for a daemon starting then and for one
// already running, which takes over within its next maintenance (1 s).
func TestSenderLeaseOfADeadDaemon(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, tdb testdb.Database) {
		counted, login := leaseSetup(t, tdb)
		// The predecessor held the lease for an hour more, and died.
		_, _, kill := leaseElsewhere(t, tdb, clock.NewFake().Now(), time.Hour)
		kill()
		login("D1")
		sender, clk, tr := runSender(t, counted)
		workertest.WaitUntil(t, "delivery at start, the clock not moved", func() bool { _, d := tr.counts(); return d == 1 })

		if tdb.Name != "postgres" {
			return // one daemon per SQLite database: nothing runs beside it
		}
		// A daemon running beside this one takes a lease and dies.
		workertest.WaitUntil(t, "the worker to go away", func() bool { return sender.Busy() == 0 })
		_, _, kill = leaseElsewhere(t, tdb, clk.Now(), time.Hour)
		login("D2")
		sender.Poke()
		workertest.WaitUntil(t, "the worker to stand down", func() bool { return counted.calls.Load() >= 2 && sender.Busy() == 0 })
		if _, d := tr.counts(); d != 1 {
			t.Fatal("sent under a live daemon's lease")
		}
		kill()
		workertest.WaitUntil(t, "maintenance to wait", func() bool { return clk.WaitsUntil(clk.Now().Add(time.Second)) })
		clk.Advance(time.Second)
		workertest.WaitUntil(t, "delivery once the sibling died", func() bool { _, d := tr.counts(); return d == 2 })
	})
}

// On PostgreSQL a daemon that gives a lease back tells the others: one
// whose worker wanted it sends at once, without waiting for a sweep.
func TestSenderWakesWhenALeaseIsReleasedElsewhere(t *testing.T) {
	tdb := testdb.Postgres(t)
	ctx := context.Background()
	counted, login := leaseSetup(t, tdb)
	sender, clk, tr := runSender(t, counted)
	workertest.WaitUntil(t, "the sender to start", func() bool { return counted.holds.Load() == 1 && clk.Waiting() > 0 })
	other, owner, _ := leaseElsewhere(t, tdb, clk.Now(), time.Hour)
	login("D1")
	sender.Poke()
	workertest.WaitUntil(t, "the worker to stand down", func() bool { return counted.calls.Load() >= 1 && sender.Busy() == 0 })
	if err := other.ReleaseDestination(ctx, "remote.test", owner); err != nil {
		t.Fatal(err)
	}
	workertest.WaitUntil(t, "delivery, the clock not moved", func() bool { _, d := tr.counts(); return d == 1 })
}

// leaseCounter counts lease attempts and holds.
type leaseCounter struct {
	storage.Database
	calls atomic.Int32
	holds atomic.Int32
}

func (l *leaseCounter) AcquireDestination(ctx context.Context, dest, owner string, now, expires int64) (bool, bool, error) {
	l.calls.Add(1)
	return l.Database.AcquireDestination(ctx, dest, owner, now, expires)
}

// OutboundOwners reports none: the tests' PostgreSQL database is shared
// with the daemons of other tests, whose comings and goings would wake
// the queues at moments these tests do not choose.
func (l *leaseCounter) OutboundOwners(ctx context.Context) ([]int64, error) { return nil, nil }

func (l *leaseCounter) HoldOutboundOwner(ctx context.Context, owner string) (<-chan struct{}, error) {
	defer l.holds.Add(1)
	return l.Database.HoldOutboundOwner(ctx, owner)
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
		sender := New(db, tr, Options{FormatUpdate: crosssigning.UpdateEDU, ServerName: "local.test", Clock: clk, Sweep: time.Hour, Jitter: workertest.NoJitter, Logger: log})
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
