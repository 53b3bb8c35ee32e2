package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// admin destinations lists the failing destinations with their attempts
// and next try; admin retry forgets a destination's failures, once, and
// refuses what is not another server's name.
func TestAdminDestinationsAndRetry(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		common := []string{"--data-dir", t.TempDir(), "--server-name", "example.test", "--database", db.URI}
		admin := func(args ...string) (string, error) {
			var out, errs bytes.Buffer
			a := append([]string{"admin", args[0]}, common...)
			err := run(ctx, append(a, args[1:]...), strings.NewReader(""), &out, &errs)
			return out.String(), err
		}
		store, err := sqlstore.Open(ctx, db.URI, "example.test")
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		now := time.Now()
		if err := store.RecordDestinationFailure(ctx, storage.DestinationRetry{Destination: "down.test", Attempts: 4,
			FailingSince: now.Add(-time.Minute).UnixMilli(), RetryAt: now.Add(25 * time.Second).UnixMilli()}); err != nil {
			t.Fatal(err)
		}
		out, err := admin("destinations")
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "DESTINATION") {
			t.Fatalf("destinations:\n%s", out)
		}
		if f := strings.Fields(lines[1]); len(f) != 8 || f[0] != "down.test" || f[4] != "4" || !strings.HasSuffix(f[6], "s") {
			t.Fatalf("destinations row %q", lines[1])
		}
		if out, err := admin("retry", "down.test"); err != nil || !strings.Contains(out, "forgot") {
			t.Fatalf("retry: %q %v", out, err)
		}
		if r, err := store.DestinationRetries(ctx); err != nil || len(r) != 0 {
			t.Fatalf("after the retry: %+v %v", r, err)
		}
		if out, err := admin("retry", "down.test"); err != nil || !strings.Contains(out, "nothing to retry") {
			t.Fatalf("second retry: %q %v", out, err)
		}
		if out, err := admin("destinations"); err != nil || strings.Contains(out, "down.test") {
			t.Fatalf("destinations after the retry: %q %v", out, err)
		}
		for _, bad := range [][]string{{"retry"}, {"retry", "example.test"}, {"retry", "@bob:down.test"}, {"retry", "a b"}, {"destinations", "x"}} {
			if _, err := admin(bad...); err == nil {
				t.Errorf("admin %v accepted", bad)
			}
		}
	})
}
