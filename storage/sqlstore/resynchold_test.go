package sqlstore_test

import (
	"context"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
)

// A stale user's resync is held by one daemon at a time until its hold
// ends or is given up; the updater does not take a held user, and waits
// for the end of the hold; an update that leaves a user stale holds the
// user for its receiver.
func TestResyncHolds(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		hold := func(now, until int64) (bool, bool) {
			t.Helper()
			held, stale, err := s.HoldResync(ctx, "@u:r", now, until)
			if err != nil {
				t.Fatal(err)
			}
			return held, stale
		}
		if held, stale := hold(100, 200); held || stale {
			t.Fatalf("a user not marked: held %v, stale %v", held, stale)
		}
		if err := s.MarkRemoteStale(ctx, "@u:r", "r", 50); err != nil {
			t.Fatal(err)
		}
		if held, stale := hold(100, 200); !held || !stale {
			t.Fatalf("first hold: held %v, stale %v", held, stale)
		}
		if held, stale := hold(150, 250); held || !stale {
			t.Fatalf("a second hold while the first lasts: held %v, stale %v", held, stale)
		}
		if due, err := s.DueStaleUsers(ctx, 150, 10); err != nil || len(due) != 0 {
			t.Fatalf("due while held: %v %v", due, err)
		}
		if at, ok, err := s.NextStaleRetry(ctx); err != nil || !ok || at != 200 {
			t.Fatalf("next retry %d %v %v, want the end of the hold, 200", at, ok, err)
		}
		if e, ok, err := s.StaleEntry(ctx, "@u:r"); err != nil || !ok || e.ResyncUntil != 200 {
			t.Fatalf("entry %+v %v %v", e, ok, err)
		}
		if held, _ := hold(200, 300); !held {
			t.Fatal("a hold that ended was not taken again")
		}
		if err := s.ReleaseResync(ctx, "@u:r"); err != nil {
			t.Fatal(err)
		}
		if due, err := s.DueStaleUsers(ctx, 150, 10); err != nil || len(due) != 1 {
			t.Fatalf("due once released: %v %v", due, err)
		}
		if held, _ := hold(150, 400); !held {
			t.Fatal("a released hold was not taken again")
		}
		if _, err := s.ReplaceRemoteDeviceList(ctx, storage.RemoteDeviceList{UserID: "@u:r", StreamID: 1}, "r"); err != nil {
			t.Fatal(err)
		}
		if held, stale := hold(160, 500); held || stale {
			t.Fatalf("after the resync: held %v, stale %v", held, stale)
		}

		// An update about a user whose list is not cached marks nothing:
		// the list is fetched when a client needs it. It is a change.
		res, err := s.ApplyRemoteDeviceUpdate(ctx, storage.RemoteDeviceUpdate{UserID: "@v:r", DeviceID: "D", StreamID: 5,
			PrevIDs: []int64{4}, ResyncHoldUntil: 900})
		if err != nil || res.Outcome != storage.NotCached || res.Pos == 0 {
			t.Fatalf("update of an uncached list: %+v %v", res, err)
		}
		if _, ok, err := s.StaleEntry(ctx, "@v:r"); err != nil || ok {
			t.Fatalf("an uncached list marked stale: %v %v", ok, err)
		}

		// An update that does not follow the cache marks the user stale
		// and holds it for its receiver.
		if _, err := s.ReplaceRemoteDeviceList(ctx, storage.RemoteDeviceList{UserID: "@v:r", StreamID: 1}, "r"); err != nil {
			t.Fatal(err)
		}
		res, err = s.ApplyRemoteDeviceUpdate(ctx, storage.RemoteDeviceUpdate{UserID: "@v:r", DeviceID: "D", StreamID: 5,
			PrevIDs: []int64{4}, ResyncHoldUntil: 900})
		if err != nil || res.Outcome != storage.NeedResync {
			t.Fatalf("update: %+v %v", res, err)
		}
		if e, ok, err := s.StaleEntry(ctx, "@v:r"); err != nil || !ok || e.ResyncUntil != 900 {
			t.Fatalf("entry after the update %+v %v %v", e, ok, err)
		}
		if held, stale, err := s.HoldResync(ctx, "@v:r", 800, 1000); err != nil || held || !stale {
			t.Fatalf("a hold taken from the receiver: %v %v %v", held, stale, err)
		}
	})
}
