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

// A device change wakes the waiting /sync requests of the users it
// concerns (the user and those sharing a room with them) and no others.
func TestChangeWakesOnlyConcernedSyncs(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, tdb testdb.Database) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ts := newTestServer(t, openTestDB(t, tdb), false)
		s, users := ts.sync, ts.users
		user := func(localpart string) string {
			id, err := users.CreateUser(ctx, localpart, "pw")
			if err != nil {
				t.Fatal(err)
			}
			return id
		}
		alice, bob, carol := user("alice"), user("bob"), user("carol")
		for _, m := range [][2]string{{"!shared:local.test", alice}, {"!shared:local.test", bob}, {"!elsewhere:local.test", carol}} {
			if err := ts.keys.SetMembership(ctx, m[0], m[1], storage.MembershipJoin); err != nil {
				t.Fatal(err)
			}
		}
		pw := "pw"
		dev := "PHONE"
		login, err := users.Login(ctx, userapi.LoginRequest{Type: "m.login.password", User: alice, Password: &pw, DeviceID: &dev})
		if err != nil {
			t.Fatal(err)
		}
		since, err := ts.store.CurrentPos(ctx)
		if err != nil {
			t.Fatal(err)
		}

		// bob's and carol's /sync wait for news after since.
		type answer struct {
			res SyncResponse
			err error
		}
		waitCtx, stopWaiting := context.WithCancel(ctx)
		defer stopWaiting()
		wait := func(user string) <-chan answer {
			ch := make(chan answer, 1)
			go func() {
				res, err := s.Sync(waitCtx, matrixid.Caller{UserID: user, DeviceID: "X"}, streamtoken.Format(since), time.Minute, SyncOptions{})
				ch <- answer{res, err}
			}()
			return ch
		}
		bobSync, carolSync := wait(bob), wait(carol)
		waitFor(t, "both to wait", func() bool { return s.WaitingSyncs() == 2 })
		// What the change signals, seen by subscriptions of the test's own.
		spies := map[string]<-chan struct{}{}
		for _, u := range []string{alice, bob, carol} {
			sub := s.notifier.Subscribe(u)
			defer sub.Close()
			spies[u] = sub.Stream()
		}

		name := "new name"
		if err := users.RenameDevice(ctx, matrixid.Caller{UserID: alice, DeviceID: login.DeviceID}, login.DeviceID, &name); err != nil {
			t.Fatal(err)
		}
		// The wake-ups are signalled before the write returns.
		for u, concerned := range map[string]bool{alice: true, bob: true, carol: false} {
			select {
			case <-spies[u]:
				if !concerned {
					t.Errorf("%s was woken by a change that does not concern them", u)
				}
			default:
				if concerned {
					t.Errorf("%s was not woken", u)
				}
			}
		}
		select {
		case a := <-bobSync:
			if a.err != nil || a.res.DeviceLists == nil || len(a.res.DeviceLists.Changed) != 1 || a.res.DeviceLists.Changed[0] != alice {
				t.Fatalf("bob's sync: %+v %v", a.res, a.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("bob's sync did not return")
		}
		select {
		case a := <-carolSync:
			t.Fatalf("carol's sync returned: %+v %v", a.res, a.err)
		default:
		}
		stopWaiting()
		if a := <-carolSync; a.err == nil {
			t.Fatalf("carol's sync answered %+v", a.res)
		}
	})
}

// With two daemons on one PostgreSQL database, a change made through one
// wakes, in the other, only the waiting requests of the users it concerns.
func TestChangeWakesOnlyConcernedSyncsOnOtherDaemon(t *testing.T) {
	tdb := testdb.Postgres(t)
	ctx, cancel := context.WithCancel(context.Background())
	a := newTestServer(t, openTestDB(t, tdb), false)
	b := newTestServer(t, openTestDB(t, tdb), false)
	aUsers := a.users
	done := make(chan struct{})
	// b hears of changes made through a as the server does: its notifier
	// watches the database.
	go func() { defer close(done); b.sync.notifier.Watch(ctx, b.store, b.log) }()
	defer func() { cancel(); <-done }()

	user := func(localpart string) string {
		id, err := aUsers.CreateUser(ctx, localpart, "pw")
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	// Names of their own, though the notifications of other tests (other
	// schemas of the database) are not heard here.
	alice, bob, carol := user("wake.alice"), user("wake.bob"), user("wake.carol")
	for _, m := range [][2]string{{"!shared:local.test", alice}, {"!shared:local.test", bob}, {"!elsewhere:local.test", carol}} {
		if err := a.keys.SetMembership(ctx, m[0], m[1], storage.MembershipJoin); err != nil {
			t.Fatal(err)
		}
	}
	// Until b listens, a's changes go unheard there: probe with changes
	// concerning users of their own until one is heard.
	for i := 0; ; i++ {
		probe := "@wake.probe" + strconv.Itoa(i) + ":local.test"
		sub := b.sync.notifier.Subscribe(probe)
		if err := a.keys.SetMembership(ctx, "!probe:local.test", probe, storage.MembershipJoin); err != nil {
			t.Fatal(err)
		}
		select {
		case <-sub.Stream():
		case <-time.After(100 * time.Millisecond):
			if i == 100 {
				t.Fatal("b never heard a's changes")
			}
			sub.Close()
			continue
		}
		sub.Close()
		break
	}
	bobSub, carolSub := b.sync.notifier.Subscribe(bob), b.sync.notifier.Subscribe(carol)
	defer bobSub.Close()
	defer carolSub.Close()
	pw, dev := "pw", "PHONE"
	if _, err := aUsers.Login(ctx, userapi.LoginRequest{Type: "m.login.password", User: alice, Password: &pw, DeviceID: &dev}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-bobSub.Stream():
	case <-time.After(10 * time.Second):
		t.Fatal("bob's requests on b were not woken")
	}
	// Woken by the same notification, carol would be signalled already.
	select {
	case <-carolSub.Stream():
		t.Fatal("carol's requests on b were woken by a change that does not concern her")
	default:
	}
}
