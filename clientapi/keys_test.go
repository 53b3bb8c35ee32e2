package clientapi_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/internal/testvectors"
)

const (
	uploadPath = "/_matrix/client/v3/keys/upload"
	queryPath  = "/_matrix/client/v3/keys/query"
	claimPath  = "/_matrix/client/v3/keys/claim"
)

func canonicalOf(t *testing.T, v any) string { return testutil.Canonical(t, v) }

func queryKeys(t *testing.T, srv *testutil.Server, u *testutil.User, users map[string][]string) map[string]any {
	t.Helper()
	return srv.Must(t, "POST", queryPath, u.Token, map[string]any{"device_keys": users})
}

// deviceKeysOf returns device_keys[userID] of a query answer.
func deviceKeysOf(t *testing.T, resp map[string]any, userID string) map[string]any {
	t.Helper()
	dk, _ := resp["device_keys"].(map[string]any)
	m, ok := dk[userID].(map[string]any)
	if !ok {
		t.Fatalf("no device_keys for %s in %v", userID, resp)
	}
	return m
}

func claimOne(t *testing.T, srv *testutil.Server, u *testutil.User, userID, deviceID string) (string, map[string]any) {
	t.Helper()
	r := srv.Must(t, "POST", claimPath, u.Token, map[string]any{
		"one_time_keys": map[string]any{userID: map[string]string{deviceID: "signed_curve25519"}}})
	otks, _ := r["one_time_keys"].(map[string]any)
	byDevice, _ := otks[userID].(map[string]any)
	keys, _ := byDevice[deviceID].(map[string]any)
	if len(keys) > 1 {
		t.Fatalf("claim returned %d keys for one device", len(keys))
	}
	for id, k := range keys {
		return id, k.(map[string]any)
	}
	return "", nil
}

func counts(t *testing.T, resp map[string]any) float64 {
	t.Helper()
	c, ok := resp["one_time_key_counts"].(map[string]any)
	if !ok {
		t.Fatalf("no one_time_key_counts in %v", resp)
	}
	n, ok := c["signed_curve25519"].(float64)
	if !ok {
		t.Fatalf("no signed_curve25519 count in %v", resp)
	}
	return n
}

func TestKeysUploadQueryClaim(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "ALICEDEV")
		bob := srv.Register(t, "bob", "")
		srv.Must(t, "PUT", "/_matrix/client/v3/devices/ALICEDEV", alice.Token, map[string]string{"display_name": "Alice's phone"})

		// Count is reported as 0 before any key exists.
		if n := counts(t, srv.Upload(t, alice, map[string]any{})); n != 0 {
			t.Fatalf("count %v before upload", n)
		}
		dk := alice.DeviceKeys(t)
		otks := alice.OneTimeKeys(t, "A", 5)
		r := srv.Upload(t, alice, map[string]any{"device_keys": dk, "one_time_keys": otks})
		if n := counts(t, r); n != 5 {
			t.Fatalf("count %v after uploading 5", n)
		}

		// Query all devices, and the named one, as another user.
		for _, devices := range [][]string{{}, {"ALICEDEV"}} {
			q := queryKeys(t, srv, bob, map[string][]string{alice.UserID: devices})
			got := deviceKeysOf(t, q, alice.UserID)
			dev, ok := got["ALICEDEV"].(map[string]any)
			if !ok || len(got) != 1 {
				t.Fatalf("query %v: %v", devices, got)
			}
			if canonicalOf(t, dev) != canonicalOf(t, dk) {
				t.Fatalf("queried keys differ from uploaded:\n%s\n%s", canonicalOf(t, dev), canonicalOf(t, dk))
			}
			if name := dev["unsigned"].(map[string]any)["device_display_name"]; name != "Alice's phone" {
				t.Fatalf("display name %v", name)
			}
			if f, ok := q["failures"].(map[string]any); !ok || len(f) != 0 {
				t.Fatalf("failures %v", q["failures"])
			}
		}
		// Unknown device named: empty; user without keys: {}; unknown user: {}.
		q := queryKeys(t, srv, bob, map[string][]string{alice.UserID: {"NOPE"}, bob.UserID: {}, "@nobody:test.local": {}})
		for _, u := range []string{alice.UserID, bob.UserID, "@nobody:test.local"} {
			if got := deviceKeysOf(t, q, u); len(got) != 0 {
				t.Fatalf("%s: %v", u, got)
			}
		}
		// timeout is accepted.
		srv.Must(t, "POST", queryPath, bob.Token, map[string]any{"device_keys": map[string][]string{alice.UserID: {}}, "timeout": 10000})

		// Claims hand out keys oldest first, each once.
		order := []string{"A0000", "A0001", "A0002", "A0003", "A0004"}
		for i, want := range order[:2] {
			id, key := claimOne(t, srv, bob, alice.UserID, "ALICEDEV")
			if id != "signed_curve25519:"+want {
				t.Fatalf("claim %d got %q, want %s", i, id, want)
			}
			if canonicalOf(t, key) != canonicalOf(t, otks[id]) {
				t.Fatalf("claimed key %v", key)
			}
		}
		if n := counts(t, srv.Upload(t, alice, map[string]any{})); n != 3 {
			t.Fatalf("count %v after 2 claims", n)
		}
	})
}

// Uploading the keys real client libraries made, and querying and claiming
// them back unchanged.
func TestKeysRealClientVectors(t *testing.T) {
	v, err := testvectors.Load()
	if err != nil {
		t.Fatal(err)
	}
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		// The vectors' users live on 127.0.0.1:18401.
		srv := testutil.NewServer(t, db, testutil.ServerOptions{ServerName: "127.0.0.1:18401"})
		users := map[string]*testutil.User{}
		for _, c := range v.Clients {
			localpart := strings.TrimPrefix(strings.Split(c.UserID, ":")[0], "@")
			users[c.UserID] = srv.Register(t, localpart, c.DeviceID)
		}
		// The negative vectors are refused and store nothing.
		for _, n := range v.Negative {
			u := users[n.UserID]
			body := map[string]any{}
			if n.Kind == "device_keys" {
				body["device_keys"] = n.Object
			} else {
				for _, c := range v.Clients {
					if c.UserID == n.UserID {
						body["device_keys"] = c.DeviceKeys
					}
				}
				body["one_time_keys"] = map[string]any{n.KeyID: n.Object}
			}
			r := srv.Do(t, "POST", uploadPath, u.Token, body)
			if r.Status != http.StatusBadRequest || r.Errcode() != "M_INVALID_PARAM" {
				t.Fatalf("negative vector %s/%s: %d %s", n.UserID, n.Kind, r.Status, r.Raw)
			}
		}
		first := users[v.Clients[0].UserID]
		q := queryKeys(t, srv, first, map[string][]string{v.Clients[0].UserID: {}, v.Clients[2].UserID: {}})
		if len(deviceKeysOf(t, q, v.Clients[0].UserID))+len(deviceKeysOf(t, q, v.Clients[2].UserID)) != 0 {
			t.Fatalf("a rejected upload stored keys: %v", q)
		}

		for _, c := range v.Clients {
			u := users[c.UserID]
			body := map[string]any{"device_keys": c.DeviceKeys, "one_time_keys": c.OneTimeKeys}
			if len(c.FallbackKeys) > 0 {
				body["fallback_keys"] = c.FallbackKeys
			}
			if n := counts(t, srv.Upload(t, u, body)); n != 3 {
				t.Fatalf("%s: count %v", c.UserID, n)
			}
		}
		for _, c := range v.Clients {
			q := queryKeys(t, srv, first, map[string][]string{c.UserID: {}})
			got := deviceKeysOf(t, q, c.UserID)[c.DeviceID]
			if got == nil || canonicalOf(t, got) != canonicalOf(t, c.DeviceKeys) {
				t.Fatalf("%s: queried %v", c.UserID, got)
			}
			// Claim all three, then the fallback key (when there is one).
			seen := map[string]bool{}
			for i := 0; i < 3; i++ {
				id, key := claimOne(t, srv, first, c.UserID, c.DeviceID)
				want, ok := c.OneTimeKeys[id]
				if !ok || seen[id] || canonicalOf(t, key) != canonicalOf(t, want) {
					t.Fatalf("%s claim %d: %s %v", c.UserID, i, id, key)
				}
				seen[id] = true
			}
			id, key := claimOne(t, srv, first, c.UserID, c.DeviceID)
			if len(c.FallbackKeys) == 0 {
				if id != "" {
					t.Fatalf("%s: claimed %s with no keys left", c.UserID, id)
				}
				continue
			}
			if want, ok := c.FallbackKeys[id]; !ok || canonicalOf(t, key) != canonicalOf(t, want) {
				t.Fatalf("%s fallback claim: %s %v", c.UserID, id, key)
			}
		}
	})
}

func TestKeysUploadRejections(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{MaxOneTimeKeys: 10})
		alice := srv.Register(t, "alice", "ALICEDEV")
		bob := srv.Register(t, "bob", "BOBDEV")
		good := alice.DeviceKeys(t)
		srv.Upload(t, alice, map[string]any{"device_keys": good, "one_time_keys": alice.OneTimeKeys(t, "A", 2)})

		resigned := func(f func(m map[string]any)) map[string]any {
			m := map[string]any{}
			for k, v := range good {
				if k != "signatures" {
					m[k] = v
				}
			}
			f(m)
			return testutil.Sign(t, m, alice.UserID, alice.DeviceID, alice.Key)
		}
		tampered := map[string]any{}
		for k, v := range good {
			tampered[k] = v
		}
		tampered["algorithms"] = []string{"m.megolm.v1.aes-sha2"}
		// Validly signed, but with another identity key than the stored one.
		otherPub, otherPriv, _ := ed25519.GenerateKey(rand.Reader)
		changedIdentity := testutil.Sign(t, map[string]any{
			"user_id": alice.UserID, "device_id": alice.DeviceID, "algorithms": good["algorithms"],
			"keys": map[string]string{"ed25519:ALICEDEV": testutil.B64(otherPub), "curve25519:ALICEDEV": testutil.RandomKey()},
		}, alice.UserID, alice.DeviceID, otherPriv)

		unsignedOTK := map[string]any{"signed_curve25519:X1": map[string]any{"key": testutil.RandomKey()}}
		badSigOTK := map[string]any{"signed_curve25519:X1": testutil.Sign(t, map[string]any{"key": testutil.RandomKey()}, alice.UserID, alice.DeviceID, bob.Key)}
		conflicting := alice.OneTimeKeys(t, "A", 1) // A0000 exists with other content
		for k, v := range alice.OneTimeKeys(t, "N", 2) {
			conflicting[k] = v // new keys in the same request must not be stored either
		}
		twoFallbacks := map[string]any{"signed_curve25519:F1": alice.SignedKey(t, true), "signed_curve25519:F2": alice.SignedKey(t, true)}

		for _, tc := range []struct {
			name    string
			token   string
			body    any
			status  int
			errcode string
		}{
			{"not JSON", alice.Token, "{", 400, "M_NOT_JSON"},
			{"device_keys not an object", alice.Token, map[string]any{"device_keys": 5}, 400, "M_BAD_JSON"},
			{"one_time_keys not an object", alice.Token, map[string]any{"one_time_keys": []int{1}}, 400, "M_BAD_JSON"},
			{"missing field", alice.Token, map[string]any{"device_keys": resigned(func(m map[string]any) { delete(m, "algorithms") })}, 400, "M_BAD_JSON"},
			{"other user", alice.Token, map[string]any{"device_keys": resigned(func(m map[string]any) { m["user_id"] = bob.UserID })}, 400, "M_INVALID_PARAM"},
			{"other device", alice.Token, map[string]any{"device_keys": resigned(func(m map[string]any) {
				m["device_id"] = "OTHER"
				m["keys"] = map[string]string{"ed25519:OTHER": testutil.B64(alice.Key.Public().(ed25519.PublicKey))}
			})}, 400, "M_INVALID_PARAM"},
			{"someone else's keys", bob.Token, map[string]any{"device_keys": good}, 400, "M_INVALID_PARAM"},
			{"bad signature", alice.Token, map[string]any{"device_keys": tampered}, 400, "M_INVALID_PARAM"},
			{"identity key changed", alice.Token, map[string]any{"device_keys": changedIdentity}, 400, "M_INVALID_PARAM"},
			{"unsigned one-time key", alice.Token, map[string]any{"one_time_keys": unsignedOTK}, 400, "M_INVALID_PARAM"},
			{"one-time key signed by another key", alice.Token, map[string]any{"one_time_keys": badSigOTK}, 400, "M_INVALID_PARAM"},
			{"one-time key ID reused with other content", alice.Token, map[string]any{"one_time_keys": conflicting}, 400, "M_INVALID_PARAM"},
			{"bad key name", alice.Token, map[string]any{"one_time_keys": map[string]any{"nocolon": "x"}}, 400, "M_INVALID_PARAM"},
			{"two fallback keys of one algorithm", alice.Token, map[string]any{"fallback_keys": twoFallbacks}, 400, "M_INVALID_PARAM"},
			{"over the cap", alice.Token, map[string]any{"one_time_keys": alice.OneTimeKeys(t, "C", 9)}, 400, "M_INVALID_PARAM"},
			{"one-time keys before device keys", bob.Token, map[string]any{"one_time_keys": bob.OneTimeKeys(t, "B", 1)}, 400, "M_INVALID_PARAM"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				before := srv.Must(t, "GET", "/_matrix/client/v3/sync", alice.Token, nil)["next_batch"]
				r := srv.Do(t, "POST", uploadPath, tc.token, tc.body)
				if r.Status != tc.status || r.Errcode() != tc.errcode {
					t.Fatalf("got %d %s, want %d %s", r.Status, r.Raw, tc.status, tc.errcode)
				}
				if _, ok := r.Body["error"].(string); !ok {
					t.Fatalf("no error message: %s", r.Raw)
				}
				// Nothing changed: same keys, same count, no stream position.
				q := queryKeys(t, srv, bob, map[string][]string{alice.UserID: {}, bob.UserID: {}})
				if got := deviceKeysOf(t, q, alice.UserID)["ALICEDEV"]; canonicalOf(t, got) != canonicalOf(t, good) {
					t.Fatalf("alice's keys changed: %v", got)
				}
				if len(deviceKeysOf(t, q, bob.UserID)) != 0 {
					t.Fatal("bob's keys were stored")
				}
				if n := counts(t, srv.Upload(t, alice, map[string]any{})); n != 2 {
					t.Fatalf("count %v, want 2", n)
				}
				if after := srv.Must(t, "GET", "/_matrix/client/v3/sync", alice.Token, nil)["next_batch"]; after != before {
					t.Fatalf("stream moved from %v to %v", before, after)
				}
			})
		}
	})
}

func TestKeysReuploadIsNoChange(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "ALICEDEV")
		dk := alice.DeviceKeys(t)
		otks := alice.OneTimeKeys(t, "A", 3)
		srv.Upload(t, alice, map[string]any{"device_keys": dk, "one_time_keys": otks})
		since := srv.Must(t, "GET", "/_matrix/client/v3/sync", alice.Token, nil)["next_batch"].(string)

		// The same keys with other member order and whitespace, and the same
		// one-time keys again.
		var reordered strings.Builder
		keys := make([]string, 0, len(dk))
		for k := range dk {
			keys = append(keys, k)
		}
		sort.Sort(sort.Reverse(sort.StringSlice(keys)))
		reordered.WriteString("{\n")
		for i, k := range keys {
			v, _ := json.MarshalIndent(dk[k], "  ", "    ")
			fmt.Fprintf(&reordered, "  %q :  %s", k, v)
			if i < len(keys)-1 {
				reordered.WriteString(",\n")
			}
		}
		reordered.WriteString("\n}")
		otkJSON, _ := json.Marshal(otks)
		body := `{"device_keys": ` + reordered.String() + `, "one_time_keys": ` + string(otkJSON) + `}`
		r := srv.Do(t, "POST", uploadPath, alice.Token, body)
		if r.Status != 200 || counts(t, r.Body) != 3 {
			t.Fatalf("re-upload: %d %s", r.Status, r.Raw)
		}
		s := srv.Must(t, "GET", "/_matrix/client/v3/sync?since="+since, alice.Token, nil)
		if s["next_batch"] != since {
			t.Fatalf("identical re-upload moved the stream: %v -> %v", since, s["next_batch"])
		}
		ch := srv.Must(t, "GET", "/_matrix/client/v3/keys/changes?from="+since+"&to="+since, alice.Token, nil)
		if len(ch["changed"].([]any)) != 0 {
			t.Fatalf("changes %v", ch)
		}

		// A real change (an extra signature) is a change.
		dk2 := map[string]any{}
		for k, v := range dk {
			dk2[k] = v
		}
		sigs := dk["signatures"].(map[string]any)
		dk2["signatures"] = map[string]any{alice.UserID: sigs[alice.UserID], "@other:test.local": map[string]string{"ed25519:X": "c2ln"}}
		srv.Upload(t, alice, map[string]any{"device_keys": dk2})
		s = srv.Must(t, "GET", "/_matrix/client/v3/sync?since="+since, alice.Token, nil)
		if s["next_batch"] == since {
			t.Fatal("changed keys did not move the stream")
		}
		changed := s["device_lists"].(map[string]any)["changed"].([]any)
		if len(changed) != 1 || changed[0] != alice.UserID {
			t.Fatalf("own change not reported: %v", s)
		}
	})
}

func TestKeysFallback(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "ALICEDEV")
		bob := srv.Register(t, "bob", "")
		fb1 := alice.SignedKey(t, true)
		srv.Upload(t, alice, map[string]any{"device_keys": alice.DeviceKeys(t),
			"one_time_keys": alice.OneTimeKeys(t, "A", 1), "fallback_keys": map[string]any{"signed_curve25519:F1": fb1}})
		unused := func() []any {
			return srv.Must(t, "GET", "/_matrix/client/v3/sync", alice.Token, nil)["device_unused_fallback_key_types"].([]any)
		}
		if u := unused(); len(u) != 1 || u[0] != "signed_curve25519" {
			t.Fatalf("unused fallback types %v", u)
		}
		if id, _ := claimOne(t, srv, bob, alice.UserID, "ALICEDEV"); id != "signed_curve25519:A0000" {
			t.Fatalf("one-time key should come first, got %q", id)
		}
		if u := unused(); len(u) != 1 {
			t.Fatal("fallback marked used while a one-time key was left")
		}
		// Exhausted: the fallback key, again and again, now used.
		for i := 0; i < 2; i++ {
			id, key := claimOne(t, srv, bob, alice.UserID, "ALICEDEV")
			if id != "signed_curve25519:F1" || canonicalOf(t, key) != canonicalOf(t, fb1) {
				t.Fatalf("claim %d: %s %v", i, id, key)
			}
		}
		if u := unused(); len(u) != 0 {
			t.Fatalf("used fallback still reported unused: %v", u)
		}
		// Re-uploading the same fallback key keeps it used; a new one replaces it, unused.
		srv.Upload(t, alice, map[string]any{"fallback_keys": map[string]any{"signed_curve25519:F1": fb1}})
		if u := unused(); len(u) != 0 {
			t.Fatal("re-uploading the same fallback key reset its used flag")
		}
		fb2 := alice.SignedKey(t, true)
		srv.Upload(t, alice, map[string]any{"fallback_keys": map[string]any{"signed_curve25519:F2": fb2}})
		if u := unused(); len(u) != 1 {
			t.Fatal("new fallback key not unused")
		}
		if id, _ := claimOne(t, srv, bob, alice.UserID, "ALICEDEV"); id != "signed_curve25519:F2" {
			t.Fatalf("old fallback key still handed out: %s", id)
		}
	})
}

func TestKeysClaimOrderAcrossUploads(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "ALICEDEV")
		bob := srv.Register(t, "bob", "")
		srv.Upload(t, alice, map[string]any{"device_keys": alice.DeviceKeys(t)})
		// Later uploads with IDs that sort earlier must still come later.
		for _, id := range []string{"ZZZ", "MMM", "AAA"} {
			srv.Upload(t, alice, map[string]any{"one_time_keys": map[string]any{"signed_curve25519:" + id: alice.SignedKey(t, false)}})
		}
		for _, want := range []string{"ZZZ", "MMM", "AAA", ""} {
			id, _ := claimOne(t, srv, bob, alice.UserID, "ALICEDEV")
			if strings.TrimPrefix(id, "signed_curve25519:") != want {
				t.Fatalf("got %q, want %q", id, want)
			}
		}
	})
}

// Many clients claiming one device's keys at the same moment never get the
// same key; once the one-time keys run out they get the fallback key.
func TestKeysConcurrentClaimsExactlyOnce(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "ALICEDEV")
		bob := srv.Register(t, "bob", "")
		const keys, clients, perClient = 100, 24, 5
		body := map[string]any{"device_keys": alice.DeviceKeys(t), "fallback_keys": map[string]any{"signed_curve25519:FB": alice.SignedKey(t, true)}}
		otks := map[string]any{}
		for i := 0; i < keys; i++ {
			otks[fmt.Sprintf("signed_curve25519:K%03d", i)] = alice.SignedKey(t, false)
		}
		body["one_time_keys"] = otks
		srv.Upload(t, alice, body)

		var mu sync.Mutex
		handed := map[string]int{}
		fallbacks := 0
		var wg sync.WaitGroup
		errs := make(chan error, clients*perClient)
		for c := 0; c < clients; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < perClient; i++ {
					r := srv.Do(t, "POST", claimPath, bob.Token, map[string]any{
						"one_time_keys": map[string]any{alice.UserID: map[string]string{"ALICEDEV": "signed_curve25519"}}})
					if r.Status != 200 {
						errs <- fmt.Errorf("claim: %d %s", r.Status, r.Raw)
						return
					}
					dev := r.Body["one_time_keys"].(map[string]any)[alice.UserID].(map[string]any)["ALICEDEV"].(map[string]any)
					mu.Lock()
					for id := range dev {
						if id == "signed_curve25519:FB" {
							fallbacks++
						} else {
							handed[id]++
						}
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
		for id, n := range handed {
			if n > 1 {
				t.Errorf("key %s handed out %d times", id, n)
			}
		}
		if len(handed) != keys || fallbacks != clients*perClient-keys {
			t.Fatalf("%d distinct one-time keys and %d fallbacks for %d claims", len(handed), fallbacks, clients*perClient)
		}
	})
}

func TestKeysQueryAndClaimErrors(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		for _, tc := range []struct {
			name, path string
			body       any
			errcode    string
		}{
			{"query without device_keys", queryPath, map[string]any{}, "M_BAD_JSON"},
			{"query with a bad user ID", queryPath, map[string]any{"device_keys": map[string]any{"alice": []string{}}}, "M_INVALID_PARAM"},
			{"query with devices not a list", queryPath, map[string]any{"device_keys": map[string]any{alice.UserID: "x"}}, "M_BAD_JSON"},
			{"claim without one_time_keys", claimPath, map[string]any{}, "M_BAD_JSON"},
			{"claim with a bad user ID", claimPath, map[string]any{"one_time_keys": map[string]any{"@nope": map[string]string{"D": "signed_curve25519"}}}, "M_INVALID_PARAM"},
			{"claim with algorithm not a string", claimPath, map[string]any{"one_time_keys": map[string]any{alice.UserID: map[string]int{"D": 1}}}, "M_BAD_JSON"},
			{"claim with an empty algorithm", claimPath, map[string]any{"one_time_keys": map[string]any{alice.UserID: map[string]string{"D": ""}}}, "M_INVALID_PARAM"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := srv.Do(t, "POST", tc.path, alice.Token, tc.body)
				if r.Status != 400 || r.Errcode() != tc.errcode {
					t.Fatalf("got %d %s, want 400 %s", r.Status, r.Raw, tc.errcode)
				}
			})
		}
		// A device with nothing to claim is left out, not an error.
		r := srv.Must(t, "POST", claimPath, alice.Token, map[string]any{"one_time_keys": map[string]any{alice.UserID: map[string]string{"NODEVICE": "signed_curve25519"}}})
		if otk := r["one_time_keys"].(map[string]any); len(otk) != 0 {
			t.Fatalf("claim for a keyless device: %v", r)
		}
	})
}

// An upload that repeats stored keys beside new ones stores only the new
// ones, and the repeated ones do not count against the cap.
func TestKeysReuploadBesideNewKeysUpToTheCap(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{MaxOneTimeKeys: 10})
		alice := srv.Register(t, "alice", "ALICEDEV")
		old := alice.OneTimeKeys(t, "A", 4)
		srv.Upload(t, alice, map[string]any{"device_keys": alice.DeviceKeys(t), "one_time_keys": old})
		both := alice.OneTimeKeys(t, "N", 6)
		for k, v := range old {
			both[k] = v
		}
		if n := counts(t, srv.Upload(t, alice, map[string]any{"one_time_keys": both})); n != 10 {
			t.Fatalf("count %v after re-uploading 4 beside 6 new, want 10", n)
		}
		r := srv.Do(t, "POST", uploadPath, alice.Token, map[string]any{"one_time_keys": alice.OneTimeKeys(t, "X", 1)})
		if r.Status != 400 || r.Errcode() != "M_INVALID_PARAM" {
			t.Fatalf("over the cap: %d %s", r.Status, r.Raw)
		}
		if n := counts(t, srv.Upload(t, alice, map[string]any{})); n != 10 {
			t.Fatalf("count %v, want 10", n)
		}
	})
}
