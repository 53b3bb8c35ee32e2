package sqlstore_test

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// holdOwner makes owner a live holder of leases on s until the returned
// function ends it as a kill would (its session ends, nothing given
// back); that function returns once the database has let go of it.
func holdOwner(t *testing.T, s *sqlstore.Store, owner string) func() {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	lost, err := s.HoldOutboundOwner(ctx, owner)
	if err != nil {
		t.Fatal(err)
	}
	return func() {
		cancel()
		<-lost
		if s.Dialect() != "postgres" {
			return
		}
		testutil.Eventually(t, "the session of "+owner+" to end", func() bool {
			var n int
			err := s.DB().QueryRow(`SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2
				AND objid = hashtext($1)::oid AND granted`, owner).Scan(&n)
			return err == nil && n == 0
		})
	}
}

// A lease is held by one owner at a time; its owner takes it back kept
// (nobody had it meanwhile), also after pausing it, unless another took
// it meanwhile; a live owner's lease is taken by nobody before it expires.
func TestOutboundLeases(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		suffix := time.Now().Format("150405.000000")
		a, b := "a-"+suffix, "b-"+suffix
		holdOwner(t, s, a)
		holdOwner(t, s, b)
		const now, later = 1_000, 100_000
		acquire := func(owner string, wantHeld, wantKept bool) {
			t.Helper()
			held, kept, err := s.AcquireDestination(ctx, "remote.test", owner, now, later)
			if err != nil || held != wantHeld || kept != wantKept {
				t.Fatalf("%s: held %v kept %v (%v), want %v %v", owner, held, kept, err, wantHeld, wantKept)
			}
		}
		acquire(a, true, false)
		acquire(a, true, true)
		acquire(b, false, false)
		if err := s.PauseDestination(ctx, "remote.test", a); err != nil {
			t.Fatal(err)
		}
		acquire(a, true, true) // nobody took it while paused
		if err := s.PauseDestination(ctx, "remote.test", a); err != nil {
			t.Fatal(err)
		}
		acquire(b, true, false) // paused: anyone may take it
		acquire(a, false, false)
		if err := s.ReleaseDestination(ctx, "remote.test", a); err != nil { // not a's: stays
			t.Fatal(err)
		}
		acquire(a, false, false)
		if err := s.ReleaseDestination(ctx, "remote.test", b); err != nil {
			t.Fatal(err)
		}
		acquire(a, true, false) // b had it meanwhile: not kept
		// Expired, it is anyone's.
		if held, _, err := s.AcquireDestination(ctx, "remote.test", b, later+1, later+100); err != nil || !held {
			t.Fatalf("expired lease not taken: %v %v", held, err)
		}
	})
}

// A lease whose owner is gone keeps nobody out. On PostgreSQL it is void
// once the owner's session ends, and ReclaimDeadLeases finds it; on
// SQLite, which one daemon uses, the next daemon's hold drops every lease.
func TestOutboundLeaseOfAGoneOwner(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		suffix := time.Now().Format("150405.000000")
		dead, alive := "dead-"+suffix, "alive-"+suffix
		kill := holdOwner(t, s, dead)
		for _, d := range []string{"one.test", "two.test"} {
			if held, _, err := s.AcquireDestination(ctx, d, dead, 1_000, 3_600_000); err != nil || !held {
				t.Fatalf("%s: %v %v", d, held, err)
			}
		}
		if got, err := s.ReclaimDeadLeases(ctx); err != nil || len(got) != 0 {
			t.Fatalf("reclaimed %v (%v) while its owner lives", got, err)
		}
		kill()
		holdOwner(t, s, alive)
		if db.Name == "postgres" {
			got, err := s.ReclaimDeadLeases(ctx)
			slices.Sort(got)
			if err != nil || !slices.Equal(got, []string{"one.test", "two.test"}) {
				t.Fatalf("reclaimed %v (%v), want both", got, err)
			}
			if got, err := s.ReclaimDeadLeases(ctx); err != nil || len(got) != 0 {
				t.Fatalf("reclaimed %v (%v) again", got, err)
			}
			// A dead owner's lease not yet reclaimed is void as well.
			kill = holdOwner(t, s, dead+"-2")
			if held, _, err := s.AcquireDestination(ctx, "one.test", dead+"-2", 1_000, 3_600_000); err != nil || !held {
				t.Fatalf("lease: %v %v", held, err)
			}
			kill()
		}
		if held, _, err := s.AcquireDestination(ctx, "one.test", alive, 2_000, 3_600_000); err != nil || !held {
			t.Fatalf("a gone owner's lease kept a live one out: %v %v", held, err)
		}
	})
}

// The failing destinations' retry state is stored, read and forgotten;
// forgetting it and giving a lease back tell the daemons (PostgreSQL).
func TestDestinationRetryState(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		s := open(t, db)
		events := make(chan storage.OutboundEvent, 10)
		watching := make(chan struct{})
		go func() {
			defer close(watching)
			_ = s.WatchOutbound(ctx, func(ev storage.OutboundEvent) { events <- ev })
		}()
		if db.Name == "postgres" {
			// Listening: a reset is heard.
			testutil.Eventually(t, "the watch to listen", func() bool {
				_ = s.RecordDestinationFailure(ctx, storage.DestinationRetry{Destination: "probe.test", Attempts: 1})
				_, _ = s.ResetDestination(ctx, "probe.test", math.MaxInt64)
				select {
				case <-events:
					return true
				case <-time.After(100 * time.Millisecond):
					return false
				}
			})
			for len(events) > 0 {
				<-events
			}
		}
		if _, ok, err := s.DestinationRetryOf(ctx, "down.test"); err != nil || ok {
			t.Fatalf("retry state of a healthy destination: %v %v", ok, err)
		}
		r := storage.DestinationRetry{Destination: "down.test", Attempts: 3, FailingSince: 1_000, RetryAt: 31_000}
		if err := s.RecordDestinationFailure(ctx, r); err != nil {
			t.Fatal(err)
		}
		r.Attempts, r.RetryAt = 4, 61_000
		if err := s.RecordDestinationFailure(ctx, r); err != nil {
			t.Fatal(err)
		}
		if got, ok, err := s.DestinationRetryOf(ctx, "down.test"); err != nil || !ok || got != r {
			t.Fatalf("retry state %+v %v %v, want %+v", got, ok, err, r)
		}
		if all, err := s.DestinationRetries(ctx); err != nil || len(all) != 1 || all[0] != r {
			t.Fatalf("retries %+v %v", all, err)
		}
		// A sign of life from before the last failure was stored does not
		// forget it; one from after it does.
		r.RecordedAt = 50_000
		if err := s.RecordDestinationFailure(ctx, r); err != nil {
			t.Fatal(err)
		}
		if had, err := s.ResetDestination(ctx, "down.test", 49_999); err != nil || had {
			t.Fatalf("reset by an older sign of life: %v %v", had, err)
		}
		if _, ok, _ := s.DestinationRetryOf(ctx, "down.test"); !ok {
			t.Fatal("an older sign of life forgot a newer failure")
		}
		if had, err := s.ResetDestination(ctx, "down.test", 50_000); err != nil || !had {
			t.Fatalf("reset: %v %v", had, err)
		}
		if had, err := s.ResetDestination(ctx, "down.test", math.MaxInt64); err != nil || had {
			t.Fatalf("second reset: %v %v", had, err)
		}
		if all, err := s.DestinationRetries(ctx); err != nil || len(all) != 0 {
			t.Fatalf("retries after the reset %+v %v", all, err)
		}
		owner := "owner-" + time.Now().Format("150405.000000")
		holdOwner(t, s, owner)
		if held, _, err := s.AcquireDestination(ctx, "down.test", owner, 1_000, 100_000); err != nil || !held {
			t.Fatalf("lease: %v %v", held, err)
		}
		if err := s.ReleaseDestination(ctx, "down.test", owner); err != nil {
			t.Fatal(err)
		}
		if held, _, err := s.AcquireDestination(ctx, "down.test", owner, 1_000, 100_000); err != nil || !held {
			t.Fatalf("lease: %v %v", held, err)
		}
		if err := s.HandOverDestination(ctx, "down.test", owner); err != nil {
			t.Fatal(err)
		}
		if held, _, err := s.AcquireDestination(ctx, "down.test", "someone-else", 1_000, 100_000); err != nil || !held {
			t.Fatalf("handed over, the lease stayed: %v %v", held, err)
		}
		owners, err := s.OutboundOwners(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var hash int64
		if db.Name == "postgres" {
			if err := s.DB().QueryRow(`SELECT hashtext($1)::oid::bigint`, owner).Scan(&hash); err != nil {
				t.Fatal(err)
			}
		}
		if (db.Name == "postgres") != slices.Contains(owners, hash) {
			t.Fatalf("owners %v, %s's lock %d", owners, owner, hash)
		}
		if db.Name != "postgres" {
			cancel()
			<-watching
			if len(events) != 0 {
				t.Fatalf("events on SQLite: %d", len(events))
			}
			return
		}
		for _, want := range []storage.OutboundEvent{{Kind: storage.OutboundAlive, Destination: "down.test"},
			{Kind: storage.OutboundReleased, Destination: "down.test"}, {Kind: storage.OutboundHandedOver, Destination: "down.test"}} {
			select {
			case got := <-events:
				if got != want {
					t.Fatalf("event %+v, want %+v", got, want)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("no event %+v", want)
			}
		}
	})
}

// OutboundDestinations lists each destination with work or failures: its
// queues, its retry state and its lease.
func TestOutboundDestinations(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		alice := "@alice:x" // the store's server is x
		if _, err := s.CreateAccount(ctx, alice, "x", nil); err != nil {
			t.Fatal(err)
		}
		for _, u := range []string{alice, "@bob:remote.test"} {
			if _, err := s.SetMembership(ctx, "!r:x", u, storage.MembershipJoin, 0); err != nil {
				t.Fatal(err)
			}
		}
		for _, d := range []string{"D1", "D2"} {
			if _, err := s.Login(ctx, storage.NewLogin{UserID: alice, DeviceID: d, TokenHash: d}); err != nil {
				t.Fatal(err)
			}
		}
		r := storage.DestinationRetry{Destination: "remote.test", Attempts: 2, FailingSince: 1_000, RetryAt: 11_000}
		if err := s.RecordDestinationFailure(ctx, r); err != nil {
			t.Fatal(err)
		}
		gone := storage.DestinationRetry{Destination: "gone.test", Attempts: 7, FailingSince: 1_000, RetryAt: 99_000}
		if err := s.RecordDestinationFailure(ctx, gone); err != nil {
			t.Fatal(err)
		}
		owner := "owner-" + time.Now().Format("150405.000000")
		holdOwner(t, s, owner)
		if held, _, err := s.AcquireDestination(ctx, "remote.test", owner, 1_000, 100_000); err != nil || !held {
			t.Fatalf("lease: %v %v", held, err)
		}
		got, err := s.OutboundDestinations(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := []storage.OutboundDestination{
			{Destination: "gone.test", Retry: gone},
			{Destination: "remote.test", Updates: 2, Retry: r, LeaseOwner: owner, LeaseExpires: 100_000},
		}
		if !slices.Equal(got, want) {
			t.Fatalf("destinations\n%+v, want\n%+v", got, want)
		}
	})
}

// A database that ran migration 23 as released (retry state without the
// time a failure was stored) gets the column from migration 24: the
// failures stored before keep their state, and a sign of life forgets
// only those stored before it.
func TestRetryStateOfMigration23Upgraded(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		old, err := sqlstore.OpenAtSchema(ctx, db.URI, 23)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := old.DB().ExecContext(ctx, `INSERT INTO outbound_destinations
			(destination, attempts, failing_since_ts, retry_at_ts) VALUES ('old.test', 2, 1000, 5000)`); err != nil {
			t.Fatal(err)
		}
		old.Close()
		s := open(t, db)
		want := storage.DestinationRetry{Destination: "old.test", Attempts: 2, FailingSince: 1000, RetryAt: 5000}
		if got, ok, err := s.DestinationRetryOf(ctx, "old.test"); err != nil || !ok || got != want {
			t.Fatalf("retry state %+v %v %v, want %+v", got, ok, err, want)
		}
		r := storage.DestinationRetry{Destination: "new.test", Attempts: 1, FailingSince: 2000, RetryAt: 9000, RecordedAt: 2000}
		if err := s.RecordDestinationFailure(ctx, r); err != nil {
			t.Fatal(err)
		}
		if reset, err := s.ResetDestination(ctx, "new.test", 1500); err != nil || reset {
			t.Fatalf("a sign of life older than the failure reset it: %v %v", reset, err)
		}
		if reset, err := s.ResetDestination(ctx, "old.test", 1500); err != nil || !reset {
			t.Fatalf("a sign of life did not reset a failure stored before the upgrade: %v %v", reset, err)
		}
	})
}
