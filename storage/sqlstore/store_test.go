package sqlstore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

func open(t *testing.T, db testutil.Database) *sqlstore.Store {
	t.Helper()
	s, err := sqlstore.Open(context.Background(), db.URI, "x")
	if err != nil {
		t.Fatalf("open %s: %v", db.Name, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestMigrationsRunOnceAndRefuseNewerSchemas(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		if _, err := s.CreateAccount(ctx, "@a:x", "hash", nil); err != nil {
			t.Fatal(err)
		}
		s.Close()
		// Reopening keeps the data and applies nothing twice.
		s = open(t, db)
		if ok, err := s.AccountExists(ctx, "@a:x"); err != nil || !ok {
			t.Fatalf("account lost on reopen: %v %v", ok, err)
		}
		var n int
		if err := s.DB().QueryRow(`SELECT COUNT(*) FROM schema_migrations`).Scan(&n); err != nil || n != sqlstore.MigrationCount() {
			t.Fatalf("%d migrations recorded (%v), want %d", n, err, sqlstore.MigrationCount())
		}
		// A database from a newer version is refused.
		if _, err := s.DB().Exec(`INSERT INTO schema_migrations (version, name, applied_ts) VALUES (9999, 'future', 0)`); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if _, err := sqlstore.Open(ctx, db.URI, "x"); !errors.Is(err, storage.ErrTooNew) {
			t.Fatalf("newer schema: %v", err)
		}
	})
}

// Several daemons starting together on one PostgreSQL database (or one
// SQLite file) migrate it once.
func TestConcurrentOpenMigratesOnce(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for i := 0; i < 4; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, err := sqlstore.Open(context.Background(), db.URI, "x")
				if err == nil {
					s.Close()
				}
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	})
}

func TestStreamPositionsIncrease(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		var mu sync.Mutex
		var wg sync.WaitGroup
		seen := map[storage.StreamPos]bool{}
		for i := 0; i < 20; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := s.SetMembership(ctx, "!r:x", "@u"+strconv.Itoa(i)+":x", storage.MembershipJoin, 0)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				seen[res.Pos] = true
				mu.Unlock()
			}()
		}
		wg.Wait()
		cur, err := s.CurrentPos(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(seen) != 20 || cur != 20 {
			t.Fatalf("%d distinct positions, current %d", len(seen), cur)
		}
		for p := storage.StreamPos(1); p <= 20; p++ {
			if !seen[p] {
				t.Fatalf("position %d missing", p)
			}
		}
		// Setting the same membership again is no change.
		if res, err := s.SetMembership(ctx, "!r:x", "@u1:x", storage.MembershipJoin, 0); err != nil || res.Pos != 0 {
			t.Fatalf("repeat join: %d %v", res.Pos, err)
		}
	})
}

// A resync that returns what is cached is no change for clients; one that
// differs is; an answer older than the cache does not replace it.
func TestReplaceRemoteDeviceListOnlyChangesOnDifference(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		list := storage.RemoteDeviceList{UserID: "@bob:remote", StreamID: 3, Devices: []storage.RemoteDevice{{DeviceID: "D1", KeyJSON: []byte(`{"k":1}`)}}}
		for i, want := range []bool{false, false} { // first sight, then the same again
			ch, err := s.ReplaceRemoteDeviceList(ctx, list, "remote")
			pos := ch.Pos
			if err != nil || (pos > 0) != want {
				t.Fatalf("replace %d: pos %d, %v", i, pos, err)
			}
		}
		list.StreamID = 4
		list.Devices = append(list.Devices, storage.RemoteDevice{DeviceID: "D2", KeyJSON: []byte(`{"k":2}`)})
		if ch, err := s.ReplaceRemoteDeviceList(ctx, list, "remote"); err != nil || ch.Pos == 0 {
			t.Fatalf("a new device was no change: %d %v", ch.Pos, err)
		}
		old := storage.RemoteDeviceList{UserID: "@bob:remote", StreamID: 2}
		if ch, err := s.ReplaceRemoteDeviceList(ctx, old, "remote"); err != nil || ch.Pos != 0 {
			t.Fatalf("an older answer replaced the cache: %d %v", ch.Pos, err)
		}
		got, err := s.RemoteDeviceLists(ctx, []string{"@bob:remote"})
		if err != nil || len(got["@bob:remote"].Devices) != 2 || got["@bob:remote"].StreamID != 4 {
			t.Fatalf("cache %+v %v", got["@bob:remote"], err)
		}
	})
}

// Revoked tokens stop authenticating at once, though lookups are cached:
// a login that takes over a device, and a device deletion. On PostgreSQL
// a second store on the same database, which does not listen for
// revocations, must not cache at all.
func TestRevokedTokensStopAtOnce(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s, others := writerAndReaders(t, db)
		owner := func(st *sqlstore.Store, hash string) error {
			_, _, err := st.TokenOwner(ctx, hash)
			return err
		}
		if _, err := s.CreateAccount(ctx, "@a:x", "h", &storage.NewLogin{UserID: "@a:x", DeviceID: "D", TokenHash: "t1"}); err != nil {
			t.Fatal(err)
		}
		for _, st := range others {
			for i := 0; i < 2; i++ { // the second lookup is served from the cache
				if err := owner(st, "t1"); err != nil {
					t.Fatalf("t1: %v", err)
				}
			}
		}
		if _, err := s.Login(ctx, storage.NewLogin{UserID: "@a:x", DeviceID: "D", TokenHash: "t2"}); err != nil {
			t.Fatal(err)
		}
		for _, st := range others {
			if err := owner(st, "t1"); !errors.Is(err, storage.ErrNotFound) {
				t.Fatalf("t1 after the device was taken over: %v", err)
			}
			if err := owner(st, "t2"); err != nil {
				t.Fatalf("t2: %v", err)
			}
		}
		if _, _, err := s.DeleteDevices(ctx, "@a:x", []string{"D"}); err != nil {
			t.Fatal(err)
		}
		for _, st := range others {
			if err := owner(st, "t2"); !errors.Is(err, storage.ErrNotFound) {
				t.Fatalf("t2 after the device was deleted: %v", err)
			}
		}
	})
}

// Device lists read for /keys/query are cached, and every change shows at
// once: new keys, a new device, a rename, a deletion. On PostgreSQL a
// second store on the same database, which does not listen for changes,
// must not cache at all.
func TestDeviceChangesShowAtOnce(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s, readers := writerAndReaders(t, db)
		const u = "@a:x"
		if _, err := s.CreateAccount(ctx, u, "h", &storage.NewLogin{UserID: u, DeviceID: "D1", TokenHash: "t1"}); err != nil {
			t.Fatal(err)
		}
		upload := func(device, keys string) {
			t.Helper()
			if _, err := s.UploadKeys(ctx, u, device, nil, func(storage.KeyState) (storage.KeyWrite, error) {
				return storage.KeyWrite{DeviceKeys: []byte(keys)}, nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		expect := func(step string, want map[string]string) {
			t.Helper()
			for i, r := range readers {
				for range 2 { // the second read may come from the cache
					devs, err := r.DevicesWithKeys(ctx, []string{u, "@nobody:x"})
					if err != nil {
						t.Fatal(err)
					}
					got := map[string]string{}
					for _, d := range devs {
						name := ""
						if d.DisplayName != nil {
							name = *d.DisplayName
						}
						got[d.DeviceID] = string(d.KeyJSON) + "/" + name
					}
					if len(got) != len(want) {
						t.Fatalf("%s (reader %d): %v, want %v", step, i, got, want)
					}
					for id, v := range want {
						if got[id] != v {
							t.Fatalf("%s (reader %d): %v, want %v", step, i, got, want)
						}
					}
				}
			}
		}
		expect("no keys yet", map[string]string{})
		upload("D1", `{"k":1}`)
		expect("keys uploaded", map[string]string{"D1": `{"k":1}/`})
		if _, err := s.Login(ctx, storage.NewLogin{UserID: u, DeviceID: "D2", TokenHash: "t2"}); err != nil {
			t.Fatal(err)
		}
		upload("D2", `{"k":2}`)
		expect("second device", map[string]string{"D1": `{"k":1}/`, "D2": `{"k":2}/`})
		if _, err := s.SetDeviceDisplayName(ctx, u, "D1", "Phone"); err != nil {
			t.Fatal(err)
		}
		expect("renamed", map[string]string{"D1": `{"k":1}/Phone`, "D2": `{"k":2}/`})
		if _, _, err := s.DeleteDevices(ctx, u, []string{"D2"}); err != nil {
			t.Fatal(err)
		}
		expect("deleted", map[string]string{"D1": `{"k":1}/Phone`})
	})
}

// writerAndReaders opens the store that writes, with its caches on, and
// the stores whose reads must see its changes: itself, and on PostgreSQL a
// second store on the same database that does not listen for changes.
func writerAndReaders(t *testing.T, db testutil.Database) (*sqlstore.Store, []*sqlstore.Store) {
	s := open(t, db)
	readers := []*sqlstore.Store{s}
	if db.Name == "postgres" {
		// PostgreSQL's caches are on only while the store listens.
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = s.WatchStream(ctx, func([]string) {})
		}()
		t.Cleanup(func() { cancel(); <-done })
		testutil.Eventually(t, "the writer's caches are on", s.CachesOn)
		readers = append(readers, open(t, db))
	}
	return s, readers
}

// An upload may name hundreds of algorithms (SQLite bounds the terms of a
// compound SELECT at 500); its keys are stored, and found again on a
// second upload of the same names.
func TestUploadNamingManyAlgorithms(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		const u = "@a:x"
		if _, err := s.CreateAccount(ctx, u, "h", &storage.NewLogin{UserID: u, DeviceID: "D1", TokenHash: "t1"}); err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{3, 499} {
			var ids []string
			var keys []storage.Key
			for i := 0; i < n; i++ {
				alg := "alg" + strconv.Itoa(n) + "_" + strconv.Itoa(i)
				ids = append(ids, alg+":K")
				keys = append(keys, storage.Key{Algorithm: alg, KeyID: "K", JSON: []byte(`"` + alg + `"`)})
			}
			for round, want := range []int{0, n} {
				_, err := s.UploadKeys(ctx, u, "D1", ids, func(st storage.KeyState) (storage.KeyWrite, error) {
					if len(st.ExistingOneTimeKeys) != want {
						return storage.KeyWrite{}, errors.New("existing keys: " + strconv.Itoa(len(st.ExistingOneTimeKeys)) + ", want " + strconv.Itoa(want))
					}
					for _, k := range keys {
						if old, ok := st.ExistingOneTimeKeys[k.Algorithm+":K"]; ok && string(old) != string(k.JSON) {
							return storage.KeyWrite{}, errors.New("existing " + k.Algorithm + " is " + string(old))
						}
					}
					if want > 0 {
						return storage.KeyWrite{}, nil
					}
					return storage.KeyWrite{OneTimeKeys: keys}, nil
				})
				if err != nil {
					t.Fatalf("%d algorithms, upload %d: %v", n, round+1, err)
				}
			}
		}
	})
}

// Text compares as bytes on both databases: every text column of the
// schema has PostgreSQL's "C" collation (SQLite's default is bytewise), so
// that walking an index never calls strcoll and no two columns differ.
func TestTextComparesAsBytes(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		s := open(t, db)
		if s.Dialect() == "postgres" {
			rows, err := s.DB().Query(`SELECT table_name, column_name, COALESCE(collation_name, '') FROM information_schema.columns
				WHERE table_schema = current_schema() AND data_type = 'text' AND table_name <> 'schema_migrations'
				ORDER BY table_name, column_name`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			n := 0
			for rows.Next() {
				var table, column, collation string
				if err := rows.Scan(&table, &column, &collation); err != nil {
					t.Fatal(err)
				}
				if collation != "C" {
					t.Errorf("%s.%s has collation %q, want \"C\"", table, column, collation)
				}
				n++
			}
			if err := rows.Err(); err != nil || n < 20 {
				t.Fatalf("%d text columns seen (%v)", n, err)
			}
		}
		ctx := context.Background()
		for _, u := range []string{"@a:x", "@B:x", "@é:x", "@z:x"} {
			if _, err := s.CreateAccount(ctx, u, "hash", nil); err != nil {
				t.Fatal(err)
			}
		}
		rows, err := s.DB().Query(`SELECT user_id FROM accounts ORDER BY user_id`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var got []string
		for rows.Next() {
			var u string
			if err := rows.Scan(&u); err != nil {
				t.Fatal(err)
			}
			got = append(got, u)
		}
		if strings.Join(got, " ") != "@B:x @a:x @z:x @é:x" {
			t.Fatalf("user IDs in order: %v", got)
		}
	})
}
