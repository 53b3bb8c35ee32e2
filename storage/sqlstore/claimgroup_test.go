package sqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

type claimResult struct {
	keys []storage.ClaimedKey
	err  error
}

// heldClaims starts a ClaimKeys call per element of calls while the
// store's claim groups are held, waits until all of them are queued, lets
// them run, and returns their answers in the order of calls.
func heldClaims(t *testing.T, s *sqlstore.Store, calls [][]storage.ClaimRequest) []claimResult {
	t.Helper()
	waiting, release := s.HoldClaims()
	defer release()
	results := make([]chan claimResult, len(calls))
	for i, reqs := range calls {
		results[i] = make(chan claimResult, 1)
		go func() {
			keys, err := s.ClaimKeys(context.Background(), reqs)
			results[i] <- claimResult{keys, err}
		}()
	}
	testutil.Eventually(t, "every claim queued", func() bool { return waiting() == len(calls) })
	release()
	out := make([]claimResult, len(calls))
	for i := range calls {
		out[i] = <-results[i]
	}
	return out
}

// devicesWithKeys logs in userID's devices and gives each n one-time keys
// of alg, named after the device.
func devicesWithKeys(t *testing.T, s *sqlstore.Store, userID, alg string, n int, devices ...string) {
	t.Helper()
	for _, d := range devices {
		if _, err := s.Login(context.Background(), storage.NewLogin{UserID: userID, DeviceID: d, TokenHash: userID + d}); err != nil {
			t.Fatal(err)
		}
		upload(t, s, userID, d, keysNamed(d+"-", n, alg))
	}
}

// answered describes a call's keys: "device=key" in their order.
func answered(keys []storage.ClaimedKey) string {
	var parts []string
	for _, k := range keys {
		parts = append(parts, k.DeviceID+"="+k.Key.KeyID)
	}
	return strings.Join(parts, " ")
}

// Claims that arrive while one is being written share one transaction,
// and each call still gets the keys of its own requests, in their order,
// no key going to two of them.
func TestConcurrentClaimsShareOneTransaction(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		s := open(t, db)
		const u, alg = "@a:x", "alg"
		devicesWithKeys(t, s, u, alg, 5, "D1", "D2")
		one := func(d string) storage.ClaimRequest {
			return storage.ClaimRequest{UserID: u, DeviceID: d, Algorithm: alg}
		}
		calls := [][]storage.ClaimRequest{
			{one("D1")},
			{one("D1"), one("D2")},
			{one("D2")},
			{one("D1")},
			{{UserID: u, DeviceID: "D3", Algorithm: alg}}, // no such device: no key
		}
		got := heldClaims(t, s, calls)
		if n := s.ClaimGroups(); n != 1 {
			t.Fatalf("%d groups of claims ran, want the %d calls in one", n, len(calls))
		}
		seen := map[string]bool{}
		for i, r := range got {
			if r.err != nil {
				t.Fatalf("call %d: %v", i, r.err)
			}
			want := len(calls[i])
			if i == 4 {
				want = 0
			}
			if len(r.keys) != want {
				t.Fatalf("call %d (%v) got %q, want %d keys", i, calls[i], answered(r.keys), want)
			}
			for j, k := range r.keys {
				if k.UserID != u || k.DeviceID != calls[i][j].DeviceID || k.Key.Algorithm != alg || k.Fallback {
					t.Fatalf("call %d's key %d is %+v, want a one-time key of its request %v", i, j, k, calls[i][j])
				}
				if !strings.HasPrefix(k.Key.KeyID, k.DeviceID+"-") {
					t.Fatalf("call %d: key %s of device %s is another device's", i, k.Key.KeyID, k.DeviceID)
				}
				if seen[k.Key.KeyID] {
					t.Fatalf("key %s handed out twice (call %d)", k.Key.KeyID, i)
				}
				seen[k.Key.KeyID] = true
			}
		}
		// The oldest keys went, and the counts follow.
		if left := counted(t, s, u, "D1"); left[alg] != 2 {
			t.Fatalf("D1 has %v left, want 2", left)
		}
		if left := counted(t, s, u, "D2"); left[alg] != 3 {
			t.Fatalf("D2 has %v left, want 3", left)
		}
		rest := append(claimAll(t, s, u, "D1", alg), claimAll(t, s, u, "D2", alg)...)
		for _, id := range rest {
			if seen[id] {
				t.Fatalf("key %s claimed by the group is still there", id)
			}
		}
		var all []string
		for id := range seen {
			all = append(all, id)
		}
		all = append(all, rest...)
		sort.Strings(all)
		if fmt.Sprint(all) != "[D1-0 D1-1 D1-2 D1-3 D1-4 D2-0 D2-1 D2-2 D2-3 D2-4]" {
			t.Fatalf("keys handed out: %v", all)
		}
	})
}

// refuseClaims makes the database fail every claim of device's keys.
func refuseClaims(t *testing.T, s *sqlstore.Store, device string) {
	t.Helper()
	ddl := []string{`CREATE TRIGGER refuse_claims BEFORE DELETE ON one_time_keys WHEN old.device_id = '` + device + `'
		BEGIN SELECT RAISE(ABORT, 'claims refused'); END`}
	if s.Dialect() == "postgres" {
		ddl = []string{`CREATE FUNCTION refuse_claims() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN IF old.device_id = '` + device + `' THEN RAISE EXCEPTION 'claims refused'; END IF; RETURN old; END $$`,
			`CREATE TRIGGER refuse_claims BEFORE DELETE ON one_time_keys FOR EACH ROW EXECUTE FUNCTION refuse_claims()`}
	}
	for _, q := range ddl {
		if _, err := s.DB().Exec(q); err != nil {
			t.Fatal(err)
		}
	}
}

// A call whose claim fails fails alone: the other calls of its group get
// their keys, and the failed one claimed nothing.
func TestAFailingClaimFailsOnlyItsCall(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		s := open(t, db)
		const u, alg = "@a:x", "alg"
		devicesWithKeys(t, s, u, alg, 3, "D1", "BAD")
		refuseClaims(t, s, "BAD")
		one := func(d string) []storage.ClaimRequest {
			return []storage.ClaimRequest{{UserID: u, DeviceID: d, Algorithm: alg}}
		}
		got := heldClaims(t, s, [][]storage.ClaimRequest{one("D1"), one("BAD"), one("D1")})
		if s.ClaimGroups() != 1 {
			t.Fatal("the claims did not run as one group")
		}
		if got[1].err == nil || !strings.Contains(got[1].err.Error(), "claims refused") {
			t.Fatalf("the refused claim answered %q, %v", answered(got[1].keys), got[1].err)
		}
		for _, i := range []int{0, 2} {
			if got[i].err != nil || len(got[i].keys) != 1 {
				t.Fatalf("call %d: %q, %v; want one key of D1", i, answered(got[i].keys), got[i].err)
			}
		}
		if got[0].keys[0].Key.KeyID == got[2].keys[0].Key.KeyID {
			t.Fatalf("both calls got %s", got[0].keys[0].Key.KeyID)
		}
		if left := counted(t, s, u, "D1"); left[alg] != 1 {
			t.Fatalf("D1 has %v left, want 1", left)
		}
		if left := counted(t, s, u, "BAD"); left[alg] != 3 {
			t.Fatalf("the refused device has %v left, want its 3 keys", left)
		}
	})
}

// A call that ends while it waits for its group leaves the queue with its
// context's error and claims nothing.
func TestAClaimCancelledInTheQueueClaimsNothing(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		s := open(t, db)
		const u, alg = "@a:x", "alg"
		devicesWithKeys(t, s, u, alg, 2, "D1")
		waiting, release := s.HoldClaims()
		defer release()
		req := []storage.ClaimRequest{{UserID: u, DeviceID: "D1", Algorithm: alg}}
		first := make(chan claimResult, 1)
		go func() {
			keys, err := s.ClaimKeys(context.Background(), req)
			first <- claimResult{keys, err}
		}()
		testutil.Eventually(t, "the first claim leading", func() bool { return waiting() == 1 })
		ctx, cancel := context.WithCancel(context.Background())
		second := make(chan claimResult, 1)
		go func() {
			keys, err := s.ClaimKeys(ctx, req)
			second <- claimResult{keys, err}
		}()
		testutil.Eventually(t, "the second claim queued", func() bool { return waiting() == 2 })
		cancel()
		if r := <-second; !errors.Is(r.err, context.Canceled) || len(r.keys) != 0 {
			t.Fatalf("the cancelled claim answered %q, %v", answered(r.keys), r.err)
		}
		release()
		if r := <-first; r.err != nil || len(r.keys) != 1 {
			t.Fatalf("the first claim answered %q, %v", answered(r.keys), r.err)
		}
		if left := counted(t, s, u, "D1"); left[alg] != 1 {
			t.Fatalf("D1 has %v left, want 1", left)
		}
	})
}
