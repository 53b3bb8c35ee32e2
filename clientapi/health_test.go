package clientapi_test

import (
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

func TestHealth(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		for _, path := range []string{"/health", "/health/ready"} {
			if r := srv.Do(t, "GET", path, "", nil); r.Status != 200 {
				t.Fatalf("%s: %d %s", path, r.Status, r.Raw)
			}
		}
		srv.Store.Close() // the database goes away
		if r := srv.Do(t, "GET", "/health/ready", "", nil); r.Status != 503 {
			t.Fatalf("ready without a database: %d %s", r.Status, r.Raw)
		}
		if r := srv.Do(t, "GET", "/health", "", nil); r.Status != 200 {
			t.Fatalf("live without a database: %d %s", r.Status, r.Raw)
		}
	})
}

// Each access token has its own token bucket; over it, 429 with the wait.
func TestRateLimitPerToken(t *testing.T) {
	srv := testutil.NewServer(t, testutil.SQLite(t), testutil.ServerOptions{RateLimitPerSecond: 1, RateLimitBurst: 3})
	alice := srv.Register(t, "alice", "")
	bob := srv.Register(t, "bob", "")
	for i := 0; i < 3; i++ {
		srv.Must(t, "GET", "/_matrix/client/v3/account/whoami", alice.Token, nil)
	}
	r := srv.Do(t, "GET", "/_matrix/client/v3/account/whoami", alice.Token, nil)
	if r.Status != 429 || r.Errcode() != "M_LIMIT_EXCEEDED" {
		t.Fatalf("over the limit: %d %s", r.Status, r.Raw)
	}
	if ms, _ := r.Body["retry_after_ms"].(float64); ms <= 0 || ms > 1000 {
		t.Fatalf("retry_after_ms %v", r.Body["retry_after_ms"])
	}
	srv.Must(t, "GET", "/_matrix/client/v3/account/whoami", bob.Token, nil)
}
