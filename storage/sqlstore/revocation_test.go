package sqlstore_test

import (
	"context"
	"database/sql"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// watch runs s.WatchStream until the test ends and waits for its caches.
func watch(t *testing.T, s *sqlstore.Store) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.WatchStream(ctx, func([]string) {})
	}()
	t.Cleanup(func() { cancel(); <-done })
	testutil.Eventually(t, "the store listens", s.CachesOn)
}

// fakeListener is a connection that shows in pg_stat_activity as the
// listener of a daemon of the store's server, and never confirms.
func fakeListener(t *testing.T, db testutil.Database, s *sqlstore.Store, id string) *sql.Conn {
	u, err := url.Parse(db.URI)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", s.ListenerName(id))
	u.RawQuery = q.Encode()
	pool, err := sql.Open("postgres", u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pool.Close() })
	c, err := pool.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.PingContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	return c
}

// A daemon whose listener does not confirm a revocation in time has its
// listener connection ended (its caches restart empty); the revocation
// waits for it no longer than the timeout. A revoking store that does not
// listen itself, and so cannot hear confirmations, ends the others'
// listeners at once.
func TestRevocationUnconfirmedEndsTheListener(t *testing.T) {
	db := testutil.Postgres(t)
	ctx := context.Background()
	defer sqlstore.SetRevocationConfirmTimeout(sqlstore.SetRevocationConfirmTimeout(300 * time.Millisecond))
	// A server name of its own: the listeners this test ends are only
	// its own.
	name := "revocation-" + strconv.FormatInt(time.Now().UnixNano(), 36) + ".test"
	openNamed := func() *sqlstore.Store {
		st, err := sqlstore.Open(ctx, db.URI, name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	s := openNamed()
	watch(t, s)
	if _, err := s.CreateAccount(ctx, "@a:x", "h", &storage.NewLogin{UserID: "@a:x", DeviceID: "D", TokenHash: "t1"}); err != nil {
		t.Fatal(err)
	}
	silent := fakeListener(t, db, s, "silent")
	start := time.Now()
	if _, _, err := s.DeleteDevices(ctx, "@a:x", []string{"D"}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("the revocation returned after %v without the silent listener's confirmation", d)
	}
	if err := silent.PingContext(ctx); err == nil {
		t.Fatal("the listener that did not confirm is still connected")
	}

	// A store that does not listen ends the listener of the others.
	deaf := openNamed()
	other := fakeListener(t, db, s, "other")
	if _, err := deaf.CreateAccount(ctx, "@b:x", "h", &storage.NewLogin{UserID: "@b:x", DeviceID: "D", TokenHash: "t2"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := deaf.DeleteDevices(ctx, "@b:x", []string{"D"}); err != nil {
		t.Fatal(err)
	}
	if err := other.PingContext(ctx); err == nil {
		t.Fatal("a listener is still connected after a revocation by a store that could not hear its confirmation")
	}
	// s's listener was ended too, and comes back.
	testutil.Eventually(t, "the store listens again", s.CachesOn)
}
