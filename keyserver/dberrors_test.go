package keyserver

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

var errDBDown = errors.New("database is down")

// failingDB is a database whose chosen methods fail, as they would while
// the database server is unreachable; the others work.
type failingDB struct {
	storage.Database
	mu      sync.Mutex
	failing map[string]bool
	calls   map[string]int
}

func newFailingDB(db storage.Database) *failingDB {
	return &failingDB{Database: db, failing: map[string]bool{}, calls: map[string]int{}}
}

func (f *failingDB) setFailing(ops ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failing = map[string]bool{}
	for _, op := range ops {
		f.failing[op] = true
	}
}

func (f *failingDB) called(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

func (f *failingDB) fail(op string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[op]++
	if f.failing[op] {
		return errDBDown
	}
	return nil
}

func (f *failingDB) StaleEntry(ctx context.Context, userID string) (storage.StaleUser, bool, error) {
	if err := f.fail("StaleEntry"); err != nil {
		return storage.StaleUser{}, false, err
	}
	return f.Database.StaleEntry(ctx, userID)
}

func (f *failingDB) RescheduleStale(ctx context.Context, userID string, attempts int, retryAt int64) error {
	if err := f.fail("RescheduleStale"); err != nil {
		return err
	}
	return f.Database.RescheduleStale(ctx, userID, attempts, retryAt)
}

func (f *failingDB) DeferServer(ctx context.Context, serverName string, until int64) error {
	if err := f.fail("DeferServer"); err != nil {
		return err
	}
	return f.Database.DeferServer(ctx, serverName, until)
}

func (f *failingDB) RetryServerNow(ctx context.Context, serverName string) error {
	if err := f.fail("RetryServerNow"); err != nil {
		return err
	}
	return f.Database.RetryServerNow(ctx, serverName)
}

func (f *failingDB) ReleaseDestination(ctx context.Context, dest, owner string) error {
	if err := f.fail("ReleaseDestination"); err != nil {
		return err
	}
	return f.Database.ReleaseDestination(ctx, dest, owner)
}

// warnings lists the warning lines logged with msg about errDBDown, and
// the "suppressed" count of each.
func warnings(hook *logtest.Hook, msg string) []any {
	var out []any
	for _, e := range hook.AllEntries() {
		if e.Level == logrus.WarnLevel && e.Message == msg && errors.Is(e.Data[logrus.ErrorKey].(error), errDBDown) {
			out = append(out, e.Data["suppressed"])
		}
	}
	return out
}

func openTestDB(t *testing.T, db testdb.Database) *sqlstore.Store {
	t.Helper()
	s, err := sqlstore.Open(context.Background(), db.URI, "local.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// The updater's database errors are logged, once a minute per kind with
// a count of those left out, instead of being dropped.
func TestUpdaterLogsDatabaseErrors(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, tdb testdb.Database) {
		ctx := context.Background()
		store := openTestDB(t, tdb)
		db := newFailingDB(store)
		clk := newFakeClock()
		log, hook := logtest.NewNullLogger()
		resyncs := 0
		u := NewUpdater(db, func(ctx context.Context, server, userID string) error {
			resyncs++
			return errors.New("i/o timeout")
		}, UpdaterOptions{Clock: clk, Jitter: noJitter, Logger: log})
		user := storage.StaleUser{UserID: "@a:down.test", ServerName: "down.test"}
		if err := store.MarkRemoteStale(ctx, user.UserID, user.ServerName, 0); err != nil {
			t.Fatal(err)
		}

		db.setFailing("StaleEntry")
		u.resyncOne(ctx, user)
		if w := warnings(hook, "reading a stale device list"); len(w) != 1 || resyncs != 0 {
			t.Fatalf("StaleEntry failing: warnings %v, %d resyncs", w, resyncs)
		}

		db.setFailing("RescheduleStale")
		u.resyncOne(ctx, user)
		if w := warnings(hook, "rescheduling a stale device list"); len(w) != 1 || resyncs != 1 {
			t.Fatalf("RescheduleStale failing: warnings %v, %d resyncs", w, resyncs)
		}

		db.setFailing("DeferServer")
		u.resyncOne(ctx, user)
		if w := warnings(hook, "holding back a failing server's stale device lists"); len(w) != 1 {
			t.Fatalf("DeferServer failing: warnings %v", w)
		}

		// A failure that holds the server back, then it shows it is up
		// while the database fails.
		db.setFailing()
		clk.Advance(24 * time.Hour)
		u.resyncOne(ctx, user)
		db.setFailing("RetryServerNow")
		u.ServerAlive(ctx, user.ServerName)
		if db.called("RetryServerNow") != 1 {
			t.Fatal("the server was not held back")
		}
		if w := warnings(hook, "making a server's stale users due"); len(w) != 1 {
			t.Fatalf("RetryServerNow failing: warnings %v", w)
		}

		// A day later the error is logged again; repeated within the
		// minute it is counted, not logged.
		db.setFailing("StaleEntry")
		for i := 0; i < 3; i++ {
			u.resyncOne(ctx, user)
		}
		if w := warnings(hook, "reading a stale device list"); len(w) != 2 || w[1] != nil {
			t.Fatalf("three errors in a minute: %v, want one more line", w)
		}
		clk.Advance(time.Minute)
		u.resyncOne(ctx, user)
		if w := warnings(hook, "reading a stale device list"); len(w) != 3 || w[2] != 2 {
			t.Fatalf("after a minute: %v, want a line counting 2 left out", w)
		}
	})
}

// A lease the sender cannot give back is logged, once a minute.
func TestSenderLogsDatabaseErrors(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, tdb testdb.Database) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		store := openTestDB(t, tdb)
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
		db.setFailing("ReleaseDestination")
		clk := newFakeClock()
		log, hook := logtest.NewNullLogger()
		tr := &recordingTransport{}
		sender := NewSender(db, tr, SenderOptions{ServerName: "local.test", Clock: clk, Sweep: time.Hour, Jitter: noJitter, Logger: log})
		done := make(chan struct{})
		go func() { defer close(done); sender.Run(ctx) }()
		defer func() { cancel(); <-done }()

		// deliver queues a change and waits until its worker is gone (it
		// has given back the lease, or tried to, and logged).
		deliver := func(device string, n int) {
			t.Helper()
			login(device)
			sender.Poke()
			waitUntil(t, "delivery", func() bool {
				_, d := tr.counts()
				return d == n && db.called("ReleaseDestination") >= n && sender.Busy() == 0
			})
		}
		deliver("D1", 1)
		if w := warnings(hook, "releasing a destination's lease"); len(w) != 1 {
			t.Fatalf("warnings %v, want 1", w)
		}
		deliver("D2", 2)
		if w := warnings(hook, "releasing a destination's lease"); len(w) != 1 {
			t.Fatalf("repeated error logged again: %v", w)
		}
		clk.Advance(time.Minute)
		deliver("D3", 3)
		// A worker may give the lease back more than once per delivery
		// (when woken again before it goes), so the count is at least the
		// one of the second delivery.
		if w := warnings(hook, "releasing a destination's lease"); len(w) != 2 || w[1] == nil || w[1].(int) < 1 {
			t.Fatalf("after a minute: %v, want a second line counting those left out", w)
		}
	})
}
