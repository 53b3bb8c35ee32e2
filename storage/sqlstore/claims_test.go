package sqlstore_test

import (
	"context"
	"sort"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// claimAll claims the device's keys of the algorithm one at a time until
// none is left, and returns their IDs in the order they came.
func claimAll(t *testing.T, s *sqlstore.Store, userID, deviceID, alg string) []string {
	t.Helper()
	var ids []string
	for {
		got, err := s.ClaimKeys(context.Background(), []storage.ClaimRequest{{UserID: userID, DeviceID: deviceID, Algorithm: alg}})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) == 0 || got[0].Fallback {
			return ids
		}
		ids = append(ids, got[0].Key.KeyID)
	}
}

// Keys go out in the order they were uploaded, whatever their IDs: an
// earlier upload's keys before a later one's. The key IDs of each upload
// sort before the previous upload's, so that an order by key ID would fail.
func TestClaimsTakeTheOldestKeyFirst(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		const u = "@a:x"
		if _, err := s.Login(ctx, storage.NewLogin{UserID: u, DeviceID: "D1", TokenHash: "t"}); err != nil {
			t.Fatal(err)
		}
		uploads := [][]storage.Key{keysNamed("Z", 3, "alg"), keysNamed("M", 2, "alg"), keysNamed("A", 3, "alg")}
		for _, keys := range uploads {
			upload(t, s, u, "D1", keys)
		}
		got := claimAll(t, s, u, "D1", "alg")
		// Within one upload the order is not the client's to set (a JSON
		// object's members have none); between uploads it is.
		var want []string
		for i, keys := range uploads {
			var batch []string
			for _, k := range keys {
				batch = append(batch, k.KeyID)
			}
			if len(got) < len(want)+len(batch) {
				t.Fatalf("claimed %v, want the keys of %d uploads in turn", got, len(uploads))
			}
			claimed := append([]string(nil), got[len(want):len(want)+len(batch)]...)
			sort.Strings(batch)
			sort.Strings(claimed)
			if len(batch) != len(claimed) || strings.Join(batch, ",") != strings.Join(claimed, ",") {
				t.Fatalf("claims %v: keys %d-%d are %v, want upload %d's %v", got, len(want), len(want)+len(batch)-1, claimed, i, batch)
			}
			want = append(want, batch...)
		}
		if len(got) != len(want) {
			t.Fatalf("claimed %v, want %d keys", got, len(want))
		}
	})
}

// A database from before migration 5 claims oldest first after it too. On
// SQLite the migration drops the index by id, which PostgreSQL keeps for
// its locking claims.
func TestClaimsAfterMigratingToSchema5(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		old, err := sqlstore.OpenAtSchema(ctx, db.URI, 4)
		if err != nil {
			t.Fatal(err)
		}
		const u = "@a:x"
		// Written as that release did: today's Login needs today's schema.
		if _, err := old.DB().Exec(`INSERT INTO devices (user_id, device_id, created_ts, last_seen_ts) VALUES ($1, 'D1', 0, 0)`, u); err != nil {
			t.Fatal(err)
		}
		upload(t, old, u, "D1", keysNamed("Z", 2, "alg"))
		upload(t, old, u, "D1", keysNamed("A", 2, "alg"))
		old.Close()

		s := open(t, db)
		hasIndex := indexExists(t, s, "one_time_keys_claim")
		if want := s.Dialect() != "sqlite3"; hasIndex != want {
			t.Fatalf("%s: claim index present %v, want %v", db.Name, hasIndex, want)
		}
		got := claimAll(t, s, u, "D1", "alg")
		sort.Strings(got[:2])
		sort.Strings(got[2:])
		if strings.Join(got, ",") != "Z0,Z1,A0,A1" {
			t.Fatalf("claims after migrating: %v", got)
		}
		if n := counted(t, s, u, "D1"); n["alg"] != 0 {
			t.Fatalf("count %v after claiming all", n)
		}
	})
}

func indexExists(t *testing.T, s *sqlstore.Store, name string) bool {
	t.Helper()
	q := `SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = $1`
	if s.Dialect() == "postgres" {
		q = `SELECT COUNT(*) FROM pg_indexes WHERE schemaname = current_schema() AND indexname = $1`
	}
	var n int
	if err := s.DB().QueryRow(q, name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n > 0
}
