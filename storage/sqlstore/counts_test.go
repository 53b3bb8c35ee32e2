package sqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// counted compares a device's kept counts with a count of its stored keys.
func counted(t *testing.T, s *sqlstore.Store, userID, deviceID string) map[string]int {
	t.Helper()
	kept, _, err := s.KeyCounts(context.Background(), userID, deviceID)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := s.DB().Query(`SELECT algorithm, COUNT(*) FROM one_time_keys WHERE user_id = $1 AND device_id = $2 GROUP BY algorithm`, userID, deviceID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	real := map[string]int{}
	for rows.Next() {
		var alg string
		var n int
		if err := rows.Scan(&alg, &n); err != nil {
			t.Fatal(err)
		}
		real[alg] = n
	}
	if fmt.Sprint(kept) != fmt.Sprint(real) {
		t.Fatalf("%s %s: kept counts %v, stored keys %v", userID, deviceID, kept, real)
	}
	return kept
}

func upload(t testing.TB, s *sqlstore.Store, userID, deviceID string, keys []storage.Key) {
	t.Helper()
	ids := make([]string, len(keys))
	for i, k := range keys {
		ids[i] = k.FullID()
	}
	if _, err := s.UploadKeys(context.Background(), userID, deviceID, ids, func(storage.KeyState) (storage.KeyWrite, error) {
		return storage.KeyWrite{OneTimeKeys: keys}, nil
	}); err != nil {
		t.Fatal(err)
	}
}

func keysNamed(prefix string, n int, algs ...string) []storage.Key {
	var keys []storage.Key
	for i := 0; i < n; i++ {
		alg := algs[i%len(algs)]
		keys = append(keys, storage.Key{Algorithm: alg, KeyID: fmt.Sprintf("%s%d", prefix, i), JSON: []byte(`"k"`)})
	}
	return keys
}

// The counts an upload and /sync read are kept, not counted; every way keys
// are stored or removed keeps them equal to the keys stored.
func TestOneTimeKeyCountsFollowTheKeys(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		const u = "@a:x"
		for _, d := range []string{"D1", "D2"} {
			if _, err := s.Login(ctx, storage.NewLogin{UserID: u, DeviceID: d, TokenHash: "t" + d}); err != nil {
				t.Fatal(err)
			}
		}
		// More keys than one INSERT statement holds, of two algorithms.
		upload(t, s, u, "D1", keysNamed("a", 450, "signed_curve25519", "other"))
		upload(t, s, u, "D2", keysNamed("b", 3, "signed_curve25519"))
		if got := counted(t, s, u, "D1"); got["signed_curve25519"] != 225 || got["other"] != 225 {
			t.Fatalf("after upload: %v", got)
		}
		// One claim alone, then several in one request.
		if _, err := s.ClaimKeys(ctx, []storage.ClaimRequest{{UserID: u, DeviceID: "D1", Algorithm: "other"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ClaimKeys(ctx, []storage.ClaimRequest{{UserID: u, DeviceID: "D1", Algorithm: "signed_curve25519"}, {UserID: u, DeviceID: "D2", Algorithm: "signed_curve25519"}}); err != nil {
			t.Fatal(err)
		}
		if got := counted(t, s, u, "D1"); got["signed_curve25519"] != 224 || got["other"] != 224 {
			t.Fatalf("after claims: %v", got)
		}
		// Claiming a device dry leaves no count behind, and claiming past it
		// takes nothing off.
		for i := 0; i < 4; i++ {
			if _, err := s.ClaimKeys(ctx, []storage.ClaimRequest{{UserID: u, DeviceID: "D2", Algorithm: "signed_curve25519"}}); err != nil {
				t.Fatal(err)
			}
		}
		if got := counted(t, s, u, "D2"); len(got) != 0 {
			t.Fatalf("dry device: %v", got)
		}
		upload(t, s, u, "D2", keysNamed("c", 2, "signed_curve25519"))
		if got := counted(t, s, u, "D2"); got["signed_curve25519"] != 2 {
			t.Fatalf("after upload to a dry device: %v", got)
		}
		// A deleted device takes its counts with it, and a device of the
		// same ID starts from none.
		if _, _, err := s.DeleteDevices(ctx, u, []string{"D1"}); err != nil {
			t.Fatal(err)
		}
		var left int
		if err := s.DB().QueryRow(`SELECT COUNT(*) FROM one_time_key_counts WHERE device_id = 'D1'`).Scan(&left); err != nil || left != 0 {
			t.Fatalf("%d count rows left for a deleted device (%v)", left, err)
		}
		if _, err := s.Login(ctx, storage.NewLogin{UserID: u, DeviceID: "D1", TokenHash: "t3"}); err != nil {
			t.Fatal(err)
		}
		upload(t, s, u, "D1", keysNamed("d", 1, "signed_curve25519"))
		if got := counted(t, s, u, "D1"); got["signed_curve25519"] != 1 || len(got) != 1 {
			t.Fatalf("new device of a deleted one's ID: %v", got)
		}
	})
}

// Uploads and claims of one device racing each other leave the count
// equal to the keys, and no key is handed out twice.
func TestOneTimeKeyCountsUnderConcurrency(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		const u, d = "@a:x", "D1"
		if _, err := s.Login(ctx, storage.NewLogin{UserID: u, DeviceID: d, TokenHash: "t"}); err != nil {
			t.Fatal(err)
		}
		upload(t, s, u, d, keysNamed("seed", 20, "signed_curve25519"))
		var wg sync.WaitGroup
		var mu sync.Mutex
		seen := map[string]bool{}
		errs := make(chan error, 8)
		for w := 0; w < 4; w++ {
			wg.Add(2)
			go func() {
				defer wg.Done()
				for i := 0; i < 10; i++ {
					keys := keysNamed(fmt.Sprintf("w%d_%d_", w, i), 3, "signed_curve25519")
					if _, err := s.UploadKeys(ctx, u, d, nil, func(storage.KeyState) (storage.KeyWrite, error) {
						return storage.KeyWrite{OneTimeKeys: keys}, nil
					}); err != nil {
						errs <- err
						return
					}
				}
			}()
			go func() {
				defer wg.Done()
				for i := 0; i < 25; i++ {
					got, err := s.ClaimKeys(ctx, []storage.ClaimRequest{{UserID: u, DeviceID: d, Algorithm: "signed_curve25519"}})
					if err != nil {
						errs <- err
						return
					}
					mu.Lock()
					for _, k := range got {
						if seen[k.Key.KeyID] {
							errs <- fmt.Errorf("%s handed out twice", k.Key.KeyID)
						}
						seen[k.Key.KeyID] = true
					}
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		got := counted(t, s, u, d)
		if want := 20 + 4*10*3 - len(seen); got["signed_curve25519"] != want {
			t.Fatalf("count %d after %d claimed, want %d", got["signed_curve25519"], len(seen), want)
		}
	})
}

// A database from before counts were kept gets them from its keys.
func TestOneTimeKeyCountsMigrateFromStoredKeys(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		old, err := sqlstore.OpenAtSchema(ctx, db.URI, 3)
		if err != nil {
			t.Fatal(err)
		}
		const u = "@a:x"
		// Written as that release did: today's Login needs today's schema.
		if _, err := old.DB().Exec(`INSERT INTO devices (user_id, device_id, created_ts, last_seen_ts) VALUES ($1, 'D1', 0, 0)`, u); err != nil {
			t.Fatal(err)
		}
		for i, alg := range []string{"signed_curve25519", "signed_curve25519", "other"} {
			if _, err := old.DB().Exec(`INSERT INTO one_time_keys (user_id, device_id, algorithm, key_id, key_json) VALUES ($1, 'D1', $2, $3, '"k"')`,
				u, alg, fmt.Sprint("K", i)); err != nil {
				t.Fatal(err)
			}
		}
		var counts sql.NullInt64
		if err := old.DB().QueryRow(`SELECT COUNT(*) FROM schema_migrations WHERE version = 4`).Scan(&counts); err != nil || counts.Int64 != 0 {
			t.Fatalf("the old schema has migration 4 (%v)", err)
		}
		old.Close()
		s := open(t, db)
		if got := counted(t, s, u, "D1"); got["signed_curve25519"] != 2 || got["other"] != 1 {
			t.Fatalf("migrated counts: %v", got)
		}
	})
}

// Uploads to one device through two stores on one database (two daemons)
// queue behind each other: each sees the count the one before it left, so
// a cap decided from the counts holds and no upload's keys are lost.
func TestUploadsFromTwoStoresKeepTheCap(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		stores := []*sqlstore.Store{open(t, db), open(t, db)}
		const u, limit, perUpload = "@a:x", 30, 4
		errOverCap := errors.New("over the cap")
		// Each round a fresh device, whose last uploads below the cap race.
		for round := 0; round < 10; round++ {
			d := fmt.Sprint("D", round)
			if _, err := stores[0].Login(ctx, storage.NewLogin{UserID: u, DeviceID: d, TokenHash: "t" + d}); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var mu sync.Mutex
			accepted := 0
			errs := make(chan error, 8)
			for w := 0; w < 8; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s := stores[w%2]
					for i := 0; i < 2; i++ {
						keys := keysNamed(fmt.Sprintf("w%d_%d_", w, i), perUpload, "signed_curve25519")
						_, err := s.UploadKeys(ctx, u, d, nil, func(st storage.KeyState) (storage.KeyWrite, error) {
							if st.Counts["signed_curve25519"]+perUpload > limit {
								return storage.KeyWrite{}, errOverCap
							}
							return storage.KeyWrite{OneTimeKeys: keys}, nil
						})
						switch {
						case err == nil:
							mu.Lock()
							accepted++
							mu.Unlock()
						case !errors.Is(err, errOverCap):
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			got := counted(t, stores[0], u, d)["signed_curve25519"]
			if got > limit || got != accepted*perUpload || got <= limit-perUpload {
				t.Fatalf("round %d: %d keys stored by %d accepted uploads of %d, cap %d", round, got, accepted, perUpload, limit)
			}
		}
	})
}

// A device deleted while uploads to it run leaves no keys or counts
// behind: an upload either commits before the deletion, which deletes its
// keys, or finds the device gone. Uploads that change the device's keys
// (which lock its row as the deletion does) race them too.
func TestUploadRacingDeviceDeletionLeavesNothing(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		stores := []*sqlstore.Store{open(t, db), open(t, db)}
		const u = "@a:x"
		for round := 0; round < 20; round++ {
			d := fmt.Sprint("D", round)
			if _, err := stores[0].Login(ctx, storage.NewLogin{UserID: u, DeviceID: d, TokenHash: "t" + d}); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for w := 0; w < 3; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						keys := keysNamed(fmt.Sprintf("w%d_%d_", w, i), 3, "signed_curve25519")
						_, err := stores[w%2].UploadKeys(ctx, u, d, nil, func(storage.KeyState) (storage.KeyWrite, error) {
							write := storage.KeyWrite{OneTimeKeys: keys, FallbackKeys: keys[:1]}
							if w == 0 {
								write.DeviceKeys = []byte(fmt.Sprintf(`{"device_id":%q,"n":%d}`, d, i))
							}
							return write, nil
						})
						if errors.Is(err, storage.ErrNotFound) {
							return
						}
						if err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			if _, _, err := stores[1].DeleteDevices(ctx, u, []string{d}); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			for _, table := range []string{"one_time_keys", "one_time_key_counts", "fallback_keys"} {
				var left int
				if err := stores[0].DB().QueryRow(`SELECT COUNT(*) FROM `+table+` WHERE user_id = $1 AND device_id = $2`, u, d).Scan(&left); err != nil {
					t.Fatal(err)
				}
				if left != 0 {
					t.Fatalf("round %d: %d rows left in %s for the deleted device", round, left, table)
				}
			}
		}
	})
}
