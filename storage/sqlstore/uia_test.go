package sqlstore_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
)

// Of several requests completing one session at once, exactly one does.
func TestUIASessionConsumedOnce(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		sess := storage.UIASession{ID: "s1", UserID: "@a:x", RequestHash: "h", ExpiresTS: 2000}
		if err := s.CreateUIASession(ctx, sess, 1000); err != nil {
			t.Fatal(err)
		}
		if got, err := s.UIASession(ctx, "s1", 1999); err != nil || got != sess {
			t.Fatalf("UIASession = %+v, %v; want %+v", got, err, sess)
		}
		if _, err := s.UIASession(ctx, "s1", 2000); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("expired session: %v, want ErrNotFound", err)
		}
		var done atomic.Int32
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ok, err := s.ConsumeUIASession(ctx, "s1")
				if err != nil {
					t.Error(err)
				}
				if ok {
					done.Add(1)
				}
			}()
		}
		wg.Wait()
		if n := done.Load(); n != 1 {
			t.Fatalf("%d requests completed the session, want 1", n)
		}
		// A new session sweeps out the expired ones.
		if err := s.CreateUIASession(ctx, storage.UIASession{ID: "old", ExpiresTS: 1500}, 1000); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateUIASession(ctx, storage.UIASession{ID: "new", ExpiresTS: 5000}, 1500); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := s.DB().QueryRow(`SELECT COUNT(*) FROM uia_sessions`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("%d sessions kept (%v), want only the new one", n, err)
		}
	})
}
