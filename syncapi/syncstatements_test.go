package syncapi

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/streamtoken"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/userapi"
)

// A waiting /sync costs one statement to start waiting and one when a
// change wakes it, whatever parts the answer has (device lists, key
// counts, account data, to-device messages): every statement the store
// sends is counted, the change's own subtracted.
func TestWokenSyncIsOneStatement(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, tdb testdb.Database) {
		ctx := context.Background()
		store := openTestDB(t, tdb)
		ts := newTestServer(t, store, true)
		s, users := ts.sync, ts.users
		alice, err := users.CreateUser(ctx, "alice", "pw")
		if err != nil {
			t.Fatal(err)
		}
		if err := ts.keys.SetMembership(ctx, "!shared:local.test", alice, storage.MembershipJoin); err != nil {
			t.Fatal(err)
		}
		const waiters = 5
		var mates []string
		for i := 0; i < waiters; i++ {
			u, err := users.CreateUser(ctx, "mate"+strconv.Itoa(i), "pw")
			if err != nil {
				t.Fatal(err)
			}
			if err := ts.keys.SetMembership(ctx, "!shared:local.test", u, storage.MembershipJoin); err != nil {
				t.Fatal(err)
			}
			mates = append(mates, u)
		}
		pw, dev := "pw", "PHONE"
		login, err := users.Login(ctx, userapi.LoginRequest{Type: "m.login.password", User: alice, Password: &pw, DeviceID: &dev})
		if err != nil {
			t.Fatal(err)
		}
		rename := func(name string) int64 {
			before := store.StatementsSent()
			if err := users.RenameDevice(ctx, matrixid.Caller{UserID: alice, DeviceID: login.DeviceID}, login.DeviceID, &name); err != nil {
				t.Fatal(err)
			}
			return store.StatementsSent() - before
		}
		rename("warm")
		change := rename("measured") // what the change itself sends

		since, err := store.CurrentPos(ctx)
		if err != nil {
			t.Fatal(err)
		}
		type answer struct {
			res SyncResponse
			err error
		}
		before := store.StatementsSent()
		answers := make(chan answer, waiters)
		for _, u := range mates {
			go func() {
				res, err := s.Sync(ctx, matrixid.Caller{UserID: u, DeviceID: "X"}, streamtoken.Format(since), time.Minute, SyncOptions{})
				answers <- answer{res, err}
			}()
		}
		waitFor(t, "all to wait", func() bool { return s.WaitingSyncs() == waiters })
		rename("woken")
		for range mates {
			select {
			case a := <-answers:
				if a.err != nil || len(a.res.DeviceLists.Changed) != 1 || a.res.DeviceLists.Changed[0] != alice ||
					a.res.AccountData == nil || a.res.ToDevice == nil || a.res.DeviceOneTimeKeysCount == nil {
					t.Fatalf("woken sync: %+v %v", a.res, a.err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("a waiting sync did not answer")
			}
		}
		sent := store.StatementsSent() - before - change
		// One to start waiting and one once woken; a request that started
		// after the change answers from its first read.
		if sent > 2*waiters {
			t.Fatalf("%d waiting syncs sent %d statements beyond the change's %d, want at most %d", waiters, sent, change, 2*waiters)
		}
	})
}
