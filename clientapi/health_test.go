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
