package devicelist

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/internal/clock"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/internal/workertest"
	"github.com/keyserver/keyserver/storage"
)

// Users of one server are resynced one at a time; servers in different
// shards go in parallel.
func TestUpdaterShardsByServer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db := workertest.OpenStore(t, "local.test")
	u := New(db, nil, Options{Shards: 4, Clock: clock.NewFake(), Jitter: workertest.NoJitter, Logger: workertest.Quiet()})
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
	workertest.WaitUntil(t, "both servers to be worked on", func() bool { mu.Lock(); defer mu.Unlock(); return total == 2 })
	close(release)
	workertest.WaitUntil(t, "all resyncs", func() bool { mu.Lock(); defer mu.Unlock(); return done == 8 })
	for _, srv := range servers {
		if peak[srv] != 1 {
			t.Errorf("%s had %d resyncs in flight at once", srv, peak[srv])
		}
	}
	if peakTotal != 2 {
		t.Errorf("servers in different shards were not worked on together (peak %d)", peakTotal)
	}
	workertest.WaitUntil(t, "the queue to empty", func() bool {
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
	db := workertest.OpenStore(t, "local.test")
	clk := clock.NewFake()
	o := Options{Clock: clk, Jitter: workertest.NoJitter, TimeoutBase: time.Minute, TimeoutMax: 8 * time.Minute,
		ErrorBase: 5 * time.Minute, ErrorMax: time.Hour, Logger: workertest.Quiet()}
	var failWith error
	calls := 0
	u := New(db, func(ctx context.Context, server, userID string) error { calls++; return failWith }, o)
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
		restarted := New(db, u.resync, o)
		restarted.resyncOne(ctx, entry("@a:down.test"))
		if calls != before+1 {
			t.Fatalf("%s: retried before its time", tc.name)
		}
		clk.Advance(tc.wait)
	}

	// The server shows it is up: everything of it is due at once.
	failWith = nil
	u.ServerAlive("down.test")
	u.retryAlive(ctx)
	if due, _ := db.DueStaleUsers(ctx, now(), 10); len(due) != 2 {
		t.Fatalf("after ServerAlive %d users due, want 2", len(due))
	}
}

// failingDB is a database whose chosen methods fail, as they would while
// the database server is unreachable; the others work.
type failingDB struct {
	storage.Database
	workertest.Faults
}

func newFailingDB(db storage.Database) *failingDB { return &failingDB{Database: db} }

func (f *failingDB) StaleEntry(ctx context.Context, userID string) (storage.StaleUser, bool, error) {
	if err := f.Fail("StaleEntry"); err != nil {
		return storage.StaleUser{}, false, err
	}
	return f.Database.StaleEntry(ctx, userID)
}

func (f *failingDB) RescheduleStale(ctx context.Context, userID string, attempts int, retryAt int64) error {
	if err := f.Fail("RescheduleStale"); err != nil {
		return err
	}
	return f.Database.RescheduleStale(ctx, userID, attempts, retryAt)
}

func (f *failingDB) DeferServer(ctx context.Context, serverName string, until int64) error {
	if err := f.Fail("DeferServer"); err != nil {
		return err
	}
	return f.Database.DeferServer(ctx, serverName, until)
}

func (f *failingDB) RetryServerNow(ctx context.Context, serverName string) error {
	if err := f.Fail("RetryServerNow"); err != nil {
		return err
	}
	return f.Database.RetryServerNow(ctx, serverName)
}

// The updater's database errors are logged, once a minute per kind with
// a count of those left out, instead of being dropped.
func TestUpdaterLogsDatabaseErrors(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, tdb testdb.Database) {
		ctx := context.Background()
		store := workertest.Open(t, tdb)
		db := newFailingDB(store)
		clk := clock.NewFake()
		log, hook := logtest.NewNullLogger()
		resyncs := 0
		u := New(db, func(ctx context.Context, server, userID string) error {
			resyncs++
			return errors.New("i/o timeout")
		}, Options{Clock: clk, Jitter: workertest.NoJitter, Logger: log})
		user := storage.StaleUser{UserID: "@a:down.test", ServerName: "down.test"}
		if err := store.MarkRemoteStale(ctx, user.UserID, user.ServerName, 0); err != nil {
			t.Fatal(err)
		}

		db.SetFailing("StaleEntry")
		u.resyncOne(ctx, user)
		if w := workertest.Warnings(hook, "reading a stale device list"); len(w) != 1 || resyncs != 0 {
			t.Fatalf("StaleEntry failing: warnings %v, %d resyncs", w, resyncs)
		}

		db.SetFailing("RescheduleStale")
		u.resyncOne(ctx, user)
		if w := workertest.Warnings(hook, "rescheduling a stale device list"); len(w) != 1 || resyncs != 1 {
			t.Fatalf("RescheduleStale failing: warnings %v, %d resyncs", w, resyncs)
		}

		db.SetFailing("DeferServer")
		u.resyncOne(ctx, user)
		if w := workertest.Warnings(hook, "holding back a failing server's stale device lists"); len(w) != 1 {
			t.Fatalf("DeferServer failing: warnings %v", w)
		}

		// A failure that holds the server back, then it shows it is up
		// while the database fails.
		db.SetFailing()
		clk.Advance(24 * time.Hour)
		u.resyncOne(ctx, user)
		db.SetFailing("RetryServerNow")
		u.ServerAlive(user.ServerName)
		u.retryAlive(ctx)
		if db.Called("RetryServerNow") != 1 {
			t.Fatal("the server was not held back")
		}
		if w := workertest.Warnings(hook, "making a server's stale users due"); len(w) != 1 {
			t.Fatalf("RetryServerNow failing: warnings %v", w)
		}

		// A day later the error is logged again; repeated within the
		// minute it is counted, not logged.
		db.SetFailing("StaleEntry")
		for i := 0; i < 3; i++ {
			u.resyncOne(ctx, user)
		}
		if w := workertest.Warnings(hook, "reading a stale device list"); len(w) != 2 || w[1] != nil {
			t.Fatalf("three errors in a minute: %v, want one more line", w)
		}
		clk.Advance(time.Minute)
		u.resyncOne(ctx, user)
		if w := workertest.Warnings(hook, "reading a stale device list"); len(w) != 3 || w[2] != 2 {
			t.Fatalf("after a minute: %v, want a line counting 2 left out", w)
		}
	})
}
