package clientapi_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/internal/testvectors"
)

// vectorServer starts a server for the real client vectors (whose users
// live on 127.0.0.1:18401) and registers their users.
func vectorServer(t *testing.T, db testutil.Database, v testvectors.RealClientKeys, lax bool) (*testutil.Server, map[string]*testutil.User) {
	t.Helper()
	srv := testutil.NewServer(t, db, testutil.ServerOptions{ServerName: "127.0.0.1:18401", LaxKeyValidation: lax})
	users := map[string]*testutil.User{}
	for _, c := range v.Clients {
		localpart := strings.TrimPrefix(strings.Split(c.UserID, ":")[0], "@")
		users[c.UserID] = srv.Register(t, localpart, c.DeviceID)
	}
	return srv, users
}

// negativeBody is the upload of a negative vector: device keys alone, or a
// one-time key with its device's real keys.
func negativeBody(v testvectors.RealClientKeys, n testvectors.Negative) map[string]any {
	body := map[string]any{}
	if n.Kind == "device_keys" {
		body["device_keys"] = n.Object
		return body
	}
	for _, c := range v.Clients {
		if c.UserID == n.UserID {
			body["device_keys"] = c.DeviceKeys
		}
	}
	body["one_time_keys"] = map[string]any{n.KeyID: n.Object}
	return body
}

// emptyDatabaseLike returns another empty database of db's kind.
func emptyDatabaseLike(t *testing.T, db testutil.Database) testutil.Database {
	if db.Name == "postgres" {
		return testutil.Postgres(t)
	}
	return testutil.SQLite(t)
}

// The real clients' keys are accepted whatever keys.strict_validation
// says, and come back unchanged from queries and claims.
func TestKeysRealClientVectorsBothModes(t *testing.T) {
	v, err := testvectors.Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []struct {
		name string
		lax  bool
	}{{"strict", false}, {"lax", true}} {
		t.Run(mode.name, func(t *testing.T) {
			testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
				srv, users := vectorServer(t, db, v, mode.lax)
				first := users[v.Clients[0].UserID]
				for _, c := range v.Clients {
					body := map[string]any{"device_keys": c.DeviceKeys, "one_time_keys": c.OneTimeKeys}
					if len(c.FallbackKeys) > 0 {
						body["fallback_keys"] = c.FallbackKeys
					}
					if n := counts(t, srv.Upload(t, users[c.UserID], body)); n != 3 {
						t.Fatalf("%s: count %v", c.UserID, n)
					}
				}
				for _, c := range v.Clients {
					q := queryKeys(t, srv, first, map[string][]string{c.UserID: {}})
					if got := deviceKeysOf(t, q, c.UserID)[c.DeviceID]; got == nil || canonicalOf(t, got) != canonicalOf(t, c.DeviceKeys) {
						t.Fatalf("%s: queried %v", c.UserID, got)
					}
					id, key := claimOne(t, srv, first, c.UserID, c.DeviceID)
					if want, ok := c.OneTimeKeys[id]; !ok || canonicalOf(t, key) != canonicalOf(t, want) {
						t.Fatalf("%s: claimed %s %v", c.UserID, id, key)
					}
				}
			})
		})
	}
}

// With keys.strict_validation: false, device keys whose signature does not
// verify are taken as they are, but a signed one-time key still needs the
// shape of one, "signatures" included: of the negative vectors, lax mode
// accepts the altered device keys and rejects the one-time keys stripped
// of their signatures. (Strict mode rejects all four: see
// TestKeysRealClientVectors.)
func TestKeysLaxNegativeVectors(t *testing.T) {
	v, err := testvectors.Load()
	if err != nil {
		t.Fatal(err)
	}
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		strict, strictUsers := vectorServer(t, db, v, false)
		lax, laxUsers := vectorServer(t, emptyDatabaseLike(t, db), v, true)
		sawDeviceKeys, sawOneTimeKey := false, false
		// One-time keys first: their uploads carry the device's real keys,
		// which the altered ones, once stored, would conflict with.
		negatives := append([]testvectors.Negative{}, v.Negative...)
		sort.SliceStable(negatives, func(i, j int) bool {
			return negatives[i].Kind == "one_time_key" && negatives[j].Kind != "one_time_key"
		})
		for _, n := range negatives {
			body := negativeBody(v, n)
			// Strict: refused.
			if r := strict.Do(t, "POST", uploadPath, strictUsers[n.UserID].Token, body); r.Status != http.StatusBadRequest || r.Errcode() != "M_INVALID_PARAM" {
				t.Fatalf("strict, %s: %d %s", n.Name, r.Status, r.Raw)
			}
			u := laxUsers[n.UserID]
			r := lax.Do(t, "POST", uploadPath, u.Token, body)
			q := queryKeys(t, lax, u, map[string][]string{n.UserID: {}})
			switch n.Kind {
			case "device_keys":
				sawDeviceKeys = true
				if r.Status != http.StatusOK {
					t.Fatalf("lax, %s: %d %s", n.Name, r.Status, r.Raw)
				}
				if got := deviceKeysOf(t, q, n.UserID)[n.DeviceID]; got == nil || canonicalOf(t, got) != canonicalOf(t, n.Object) {
					t.Fatalf("lax, %s: stored %v", n.Name, got)
				}
			case "one_time_key":
				sawOneTimeKey = true
				if r.Status != http.StatusBadRequest || r.Errcode() != "M_BAD_JSON" {
					t.Fatalf("lax, %s: %d %s", n.Name, r.Status, r.Raw)
				}
				if got := deviceKeysOf(t, q, n.UserID); len(got) != 0 {
					t.Fatalf("lax, %s: a rejected upload stored device keys: %v", n.Name, got)
				}
			}
		}
		if !sawDeviceKeys || !sawOneTimeKey {
			t.Fatal("the vectors lack a kind of negative")
		}
	})
}

// placeholderKeys are device keys as test tools write them: every field
// present, nothing a real key or signature.
func placeholderKeys(u *testutil.User) map[string]any {
	return map[string]any{
		"user_id":    u.UserID,
		"device_id":  u.DeviceID,
		"algorithms": []string{"m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"},
		"keys": map[string]string{
			"ed25519:" + u.DeviceID:    "ed25519_key",
			"curve25519:" + u.DeviceID: "curve25519_key",
		},
		"signatures": map[string]any{u.UserID: map[string]string{"ed25519:" + u.DeviceID: "self_signature"}},
	}
}

func placeholderOTK(u *testutil.User, key string) map[string]any {
	return map[string]any{"key": key, "signatures": map[string]any{u.UserID: map[string]string{"ed25519:" + u.DeviceID: "sig"}}}
}

// With keys.strict_validation: false placeholder keys are taken, and only
// the shape is checked: what lax mode still rejects is a matter of shape
// (fields, types, names, the uploader's own user and device), and it
// changes nothing. The same placeholders are refused in strict mode.
func TestKeysLaxValidation(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		lax := testutil.NewServer(t, db, testutil.ServerOptions{LaxKeyValidation: true})
		strict := testutil.NewServer(t, emptyDatabaseLike(t, db), testutil.ServerOptions{})
		alice := lax.Register(t, "alice", "ALICEDEV")
		bob := lax.Register(t, "bob", "BOBDEV")
		upload := map[string]any{
			"device_keys":   placeholderKeys(alice),
			"one_time_keys": map[string]any{"signed_curve25519:AAAA": placeholderOTK(alice, "otk"), "curve25519:BBBB": "plain"},
			"fallback_keys": map[string]any{"signed_curve25519:FFFF": placeholderOTK(alice, "fallback")},
		}
		if n := counts(t, lax.Upload(t, alice, upload)); n != 1 {
			t.Fatalf("signed_curve25519 count %v, want 1", n)
		}
		if got := deviceKeysOf(t, queryKeys(t, lax, bob, map[string][]string{alice.UserID: {}}), alice.UserID)["ALICEDEV"]; canonicalOf(t, got) != canonicalOf(t, upload["device_keys"]) {
			t.Fatalf("queried %v", got)
		}
		if id, key := claimOne(t, lax, bob, alice.UserID, "ALICEDEV"); id != "signed_curve25519:AAAA" || key["key"] != "otk" {
			t.Fatalf("claimed %s %v", id, key)
		}

		// Strict mode refuses every part of it.
		sAlice := strict.Register(t, "alice", "ALICEDEV")
		for name, body := range map[string]map[string]any{
			"device keys":   {"device_keys": placeholderKeys(sAlice)},
			"one-time keys": {"device_keys": sAlice.DeviceKeys(t), "one_time_keys": map[string]any{"signed_curve25519:AAAA": placeholderOTK(sAlice, "otk")}},
			"plain key":     {"device_keys": sAlice.DeviceKeys(t), "one_time_keys": map[string]any{"curve25519:BBBB": "plain"}},
		} {
			if r := strict.Do(t, "POST", uploadPath, sAlice.Token, body); r.Status != http.StatusBadRequest || r.Errcode() != "M_INVALID_PARAM" {
				t.Fatalf("strict, placeholder %s: %d %s", name, r.Status, r.Raw)
			}
		}

		// What lax mode still rejects, on bob's device (which has no keys
		// yet) so that every device-key check is reached.
		withKeys := func(f func(m map[string]any)) map[string]any {
			m := placeholderKeys(bob)
			f(m)
			return map[string]any{"device_keys": m}
		}
		withOTK := func(name string, v any) map[string]any {
			return map[string]any{"device_keys": placeholderKeys(bob), "one_time_keys": map[string]any{name: v}}
		}
		for _, tc := range []struct {
			name    string
			body    map[string]any
			errcode string
		}{
			{"no user_id", withKeys(func(m map[string]any) { delete(m, "user_id") }), "M_BAD_JSON"},
			{"another user", withKeys(func(m map[string]any) { m["user_id"] = alice.UserID }), "M_INVALID_PARAM"},
			{"another device", withKeys(func(m map[string]any) {
				m["device_id"] = "OTHER"
				m["keys"] = map[string]string{"ed25519:OTHER": "k"}
			}), "M_INVALID_PARAM"},
			{"no device_id", withKeys(func(m map[string]any) { delete(m, "device_id") }), "M_BAD_JSON"},
			{"user_id not a string", withKeys(func(m map[string]any) { m["user_id"] = 5 }), "M_BAD_JSON"},
			{"keys not an object", withKeys(func(m map[string]any) { m["keys"] = []string{"k"} }), "M_BAD_JSON"},
			{"key name without a key ID", withKeys(func(m map[string]any) { m["keys"] = map[string]string{"ed25519:": "k"} }), "M_INVALID_PARAM"},
			{"key name without an algorithm", withKeys(func(m map[string]any) { m["keys"] = map[string]string{"test": "k"} }), "M_INVALID_PARAM"},
			{"algorithms not a list", withKeys(func(m map[string]any) { m["algorithms"] = "m.megolm.v1.aes-sha2" }), "M_BAD_JSON"},
			{"empty algorithm", withKeys(func(m map[string]any) { m["algorithms"] = []string{""} }), "M_INVALID_PARAM"},
			{"key value not a string", withKeys(func(m map[string]any) {
				m["keys"] = map[string]any{"ed25519:BOBDEV": 5}
			}), "M_BAD_JSON"},
			{"signatures of the wrong type", withKeys(func(m map[string]any) { m["signatures"] = map[string]any{bob.UserID: "sig"} }), "M_BAD_JSON"},
			{"signed key without signatures", withOTK("signed_curve25519:X", map[string]any{"key": "k"}), "M_BAD_JSON"},
			{"signed key as a string", withOTK("signed_curve25519:X", "k"), "M_BAD_JSON"},
			{"signed key's key not a string", withOTK("signed_curve25519:X", map[string]any{"key": 5, "signatures": map[string]any{}}), "M_BAD_JSON"},
			{"curve25519 key as an object", withOTK("curve25519:X", map[string]any{"key": "k"}), "M_BAD_JSON"},
			{"other algorithm as a number", withOTK("org.example:X", 5), "M_BAD_JSON"},
			{"key name without an ID", withOTK("signed_curve25519", placeholderOTK(bob, "k")), "M_INVALID_PARAM"},
			{"two fallback keys of one algorithm", map[string]any{"device_keys": placeholderKeys(bob), "fallback_keys": map[string]any{
				"signed_curve25519:F1": placeholderOTK(bob, "a"), "signed_curve25519:F2": placeholderOTK(bob, "b")}}, "M_INVALID_PARAM"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				before := lax.Must(t, "GET", "/_matrix/client/v3/sync", bob.Token, nil)["next_batch"]
				r := lax.Do(t, "POST", uploadPath, bob.Token, tc.body)
				if r.Status != http.StatusBadRequest || r.Errcode() != tc.errcode {
					t.Fatalf("got %d %s, want 400 %s", r.Status, r.Raw, tc.errcode)
				}
				if got := deviceKeysOf(t, queryKeys(t, lax, alice, map[string][]string{bob.UserID: {}}), bob.UserID); len(got) != 0 {
					t.Fatalf("bob's keys were stored: %v", got)
				}
				if after := lax.Must(t, "GET", "/_matrix/client/v3/sync", bob.Token, nil)["next_batch"]; after != before {
					t.Fatalf("stream moved from %v to %v", before, after)
				}
			})
		}

	})
}

// With keys.strict_validation: false, device keys are taken as test tools
// upload them: without algorithms, keys or signatures, with key IDs that
// are not the device ID, and with identity keys that replace the
// device's earlier ones; each new version is a device-list change for the
// users sharing a room, and is what queries return. Strict mode refuses
// the key IDs, the missing signatures and the replaced identity keys.
func TestKeysLaxTestToolShapes(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		lax := testutil.NewServer(t, db, testutil.ServerOptions{LaxKeyValidation: true})
		strict := testutil.NewServer(t, emptyDatabaseLike(t, db), testutil.ServerOptions{})
		for _, srv := range []*testutil.Server{lax, strict} {
			alice := srv.Register(t, "alice", "ALICEDEV")
			bob := srv.Register(t, "bob", "BOBDEV")
			srv.Join(t, "!room:x", alice.UserID)
			srv.Join(t, "!room:x", bob.UserID)
			isLax := srv == lax
			first := alice.DeviceKeys(t)
			// Well formed and signed by the device, with a key ID that is
			// not the device ID besides its own keys.
			oddID := alice.DeviceKeys(t)
			delete(oddID, "signatures")
			oddID["keys"].(map[string]any)["ed25519:test"] = testutil.RandomKey()
			oddID = testutil.Sign(t, oddID, alice.UserID, alice.DeviceID, alice.Key)
			_, alice.Key, _ = ed25519.GenerateKey(rand.Reader)
			second := alice.DeviceKeys(t) // new identity keys for the same device
			steps := []struct {
				name string
				keys map[string]any
				// strictErr is strict mode's answer; "" when it accepts.
				strictErr string
			}{
				// sytest's matrix_put_e2e_keys, before any keys are given.
				{"ids alone", map[string]any{"user_id": alice.UserID, "device_id": "ALICEDEV"}, "M_BAD_JSON"},
				// Key IDs that are not the device ID, no algorithms, no signatures.
				{"ed25519:test", map[string]any{"user_id": alice.UserID, "device_id": "ALICEDEV",
					"keys": map[string]string{"ed25519:test": "cmltKURmLTRV86hBT_jh8AFH9RAdz0yAZOfvlBUQqP8"}}, "M_BAD_JSON"},
				{"ed25519:test replaced", map[string]any{"user_id": alice.UserID, "device_id": "ALICEDEV",
					"keys": map[string]string{"ed25519:test": "aI2BUUeIQ0Y8T7Tv7jJh2ADagpoWdtHf4XipFPvjXI8"}}, "M_BAD_JSON"},
				// Complement's keys: real values, no signatures.
				{"no signatures", map[string]any{"user_id": alice.UserID, "device_id": "ALICEDEV",
					"algorithms": []string{"m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"},
					"keys":       map[string]string{"ed25519:ALICEDEV": testutil.RandomKey(), "curve25519:ALICEDEV": testutil.RandomKey()}}, "M_BAD_JSON"},
				// sytest's "updated": "keys", a field clients do not know.
				{"other fields", map[string]any{"user_id": alice.UserID, "device_id": "ALICEDEV", "updated": "keys"}, "M_BAD_JSON"},
				{"ed25519:test beside the device's keys", oddID, "M_INVALID_PARAM"},
				// Well-formed and signed, but not the device's first keys.
				{"identity keys replaced", first, ""},
				{"identity keys replaced again", second, "M_INVALID_PARAM"},
			}
			for i, step := range steps {
				since := srv.Must(t, "GET", "/_matrix/client/v3/sync", bob.Token, nil)["next_batch"].(string)
				r := srv.Do(t, "POST", uploadPath, alice.Token, map[string]any{"device_keys": step.keys})
				switch {
				case isLax && r.Status != http.StatusOK:
					t.Fatalf("lax, %s: %d %s", step.name, r.Status, r.Raw)
				case !isLax && step.strictErr == "" && r.Status != http.StatusOK:
					t.Fatalf("strict, %s: %d %s", step.name, r.Status, r.Raw)
				case !isLax && step.strictErr != "" && (r.Status != http.StatusBadRequest || r.Errcode() != step.strictErr):
					t.Fatalf("strict, %s: %d %s, want 400 %s", step.name, r.Status, r.Raw, step.strictErr)
				}
				accepted := r.Status == http.StatusOK
				got := deviceKeysOf(t, queryKeys(t, srv, bob, map[string][]string{alice.UserID: {}}), alice.UserID)["ALICEDEV"]
				if accepted && canonicalOf(t, got) != canonicalOf(t, step.keys) {
					t.Fatalf("%v, %s: queried %v, want %v", isLax, step.name, got, step.keys)
				}
				to := srv.Must(t, "GET", "/_matrix/client/v3/sync", bob.Token, nil)["next_batch"].(string)
				ch := srv.Must(t, "GET", "/_matrix/client/v3/keys/changes?from="+since+"&to="+to, bob.Token, nil)
				changed := asStrings(ch["changed"])
				if accepted != (len(changed) == 1 && changed[0] == alice.UserID) {
					t.Fatalf("%v, step %d %s: accepted %v, bob's changes %v", isLax, i, step.name, accepted, changed)
				}
			}
		}
	})
}

func asStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// keys.strict_validation reaches the daemon: a whole daemon with it off
// takes placeholder keys, one with the default refuses them.
func TestKeysStrictValidationConfig(t *testing.T) {
	for _, strict := range []bool{true, false} {
		n := testutil.StartNode(t, testutil.SQLite(t), func(c *config.Config) { c.Keys.StrictValidation = strict })
		u := n.Register(t, "alice", "ALICEDEV")
		r := n.Do(t, "POST", uploadPath, u.Token, map[string]any{"device_keys": placeholderKeys(u)})
		if accepted := r.Status == http.StatusOK; accepted == strict {
			raw, _ := json.Marshal(r.Body)
			t.Fatalf("strict_validation %v: %d %s", strict, r.Status, raw)
		}
	}
}
