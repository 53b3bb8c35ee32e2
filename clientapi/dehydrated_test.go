package clientapi_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/url"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

const dehydratedPath = "/_matrix/client/unstable/org.matrix.msc3814.v1/dehydrated_device"

func dehydratedEventsPath(deviceID string) string {
	return dehydratedPath + "/" + url.PathEscape(deviceID) + "/events"
}

// newDehydrated makes the keys of a dehydrated device of u: its ID is its
// curve25519 key, as clients make it.
func newDehydrated(t *testing.T, u *testutil.User) (*testutil.User, map[string]any) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	d := &testutil.User{UserID: u.UserID, Key: priv}
	d.DeviceID = testutil.RandomKeyFor(priv)
	return d, dehydratedBody(t, u, d)
}

// dehydratedBody is the PUT body that makes d (its ID and key) u's
// dehydrated device.
func dehydratedBody(t *testing.T, u, d *testutil.User) map[string]any {
	priv := d.Key
	keys := testutil.Sign(t, map[string]any{
		"user_id": u.UserID, "device_id": d.DeviceID, "dehydrated": true,
		"algorithms": []string{"m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"},
		"keys": map[string]string{
			"curve25519:" + d.DeviceID: d.DeviceID,
			"ed25519:" + d.DeviceID:    testutil.B64(priv.Public().(ed25519.PublicKey)),
		},
	}, u.UserID, d.DeviceID, priv)
	body := map[string]any{
		"device_id":                   d.DeviceID,
		"device_data":                 map[string]any{"algorithm": "org.matrix.msc3814.v2", "device_pickle": "x", "nonce": "y"},
		"initial_device_display_name": "Dehydrated device",
		"device_keys":                 keys,
		"one_time_keys":               d.OneTimeKeys(t, "D", 3),
		"fallback_keys":               map[string]any{"signed_curve25519:F0": d.SignedKey(t, true)},
	}
	return body
}

func dehydratedQuery(t *testing.T, srv *testutil.Server, u *testutil.User, userID string) map[string]any {
	t.Helper()
	r := srv.Must(t, "POST", "/_matrix/client/v3/keys/query", u.Token, map[string]any{"device_keys": map[string]any{userID: []string{}}})
	devs, _ := r["device_keys"].(map[string]any)[userID].(map[string]any)
	return devs
}

func TestDehydratedDevice(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "ALICE1")
		bob := srv.Register(t, "bob", "BOB1")
		fails := func(method, path string, body any, status int, errcode string) {
			t.Helper()
			r := srv.Do(t, method, path, alice.Token, body)
			if r.Status != status || r.Errcode() != errcode {
				t.Fatalf("%s %s: %d %s, want %d %s", method, path, r.Status, r.Raw, status, errcode)
			}
		}
		fails("GET", dehydratedPath, nil, 404, "M_NOT_FOUND")
		fails("DELETE", dehydratedPath, nil, 404, "M_NOT_FOUND")

		d1, body := newDehydrated(t, alice)
		if r := srv.Must(t, "PUT", dehydratedPath, alice.Token, body); r["device_id"] != d1.DeviceID {
			t.Fatalf("PUT answered %v", r)
		}
		got := srv.Must(t, "GET", dehydratedPath, alice.Token, nil)
		if got["device_id"] != d1.DeviceID || testutil.Canonical(t, got["device_data"]) != testutil.Canonical(t, body["device_data"]) {
			t.Fatalf("GET answered %v", got)
		}

		// Its keys are any device's: queried (dehydrated: true unchanged)
		// and claimed.
		dev, ok := dehydratedQuery(t, srv, bob, alice.UserID)[d1.DeviceID].(map[string]any)
		if !ok || dev["dehydrated"] != true {
			t.Fatalf("/keys/query shows %v", dev)
		}
		claim := srv.Must(t, "POST", "/_matrix/client/v3/keys/claim", bob.Token, map[string]any{
			"one_time_keys": map[string]any{alice.UserID: map[string]any{d1.DeviceID: "signed_curve25519"}}})
		if keys, _ := claim["one_time_keys"].(map[string]any)[alice.UserID].(map[string]any)[d1.DeviceID].(map[string]any); len(keys) != 1 {
			t.Fatalf("claim answered %v", claim)
		}

		// Its to-device messages, paged with next_batch; a batch token
		// deletes the messages before it.
		for i := 0; i < 150; i++ {
			srv.Must(t, "PUT", sendToDevicePath("m.room.encrypted", "d"+string(rune('A'+i/26))+string(rune('a'+i%26))), bob.Token,
				map[string]any{"messages": map[string]any{alice.UserID: map[string]any{d1.DeviceID: map[string]any{"n": i}}}})
		}
		page := func(next any) ([]map[string]any, string) {
			t.Helper()
			body := map[string]any{}
			if next != nil {
				body["next_batch"] = next
			}
			r := srv.Must(t, "POST", dehydratedEventsPath(d1.DeviceID), alice.Token, body)
			ev, _ := toDeviceEvents(t, map[string]any{"to_device": map[string]any{"events": r["events"]}, "next_batch": ""})
			nb, _ := r["next_batch"].(string)
			return ev, nb
		}
		ev1, nb1 := page(nil)
		ev1again, _ := page(nil)
		if len(ev1) != 100 || nb1 == "" || len(ev1again) != 100 {
			t.Fatalf("first page: %d messages, next_batch %q, again %d", len(ev1), nb1, len(ev1again))
		}
		ev2, nb2 := page(nb1)
		if len(ev2) != 50 || nb2 == "" || contents(ev2)[0] != bob.UserID+"/m.room.encrypted/100" {
			t.Fatalf("second page: %v, next_batch %q", contents(ev2)[:1], nb2)
		}
		if ev, nb := page(nb2); len(ev) != 0 || nb != "" {
			t.Fatalf("last page: %d messages, next_batch %q", len(ev), nb)
		}
		if ev, _ := page(nil); len(ev) != 0 {
			t.Fatalf("paged messages came back: %d", len(ev))
		}
		// GET with ?from= serves the same.
		srv.Must(t, "PUT", sendToDevicePath("m.room.encrypted", "last"), bob.Token,
			map[string]any{"messages": map[string]any{alice.UserID: map[string]any{"*": map[string]any{"n": "last"}}}})
		r := srv.Must(t, "GET", dehydratedEventsPath(d1.DeviceID)+"?from="+nb2, alice.Token, nil)
		if evs, _ := r["events"].([]any); len(evs) != 1 {
			t.Fatalf("GET events: %v", r)
		}

		// Bad input changes nothing: the device stays.
		badKeys := func(f func(b map[string]any)) map[string]any {
			_, b := newDehydrated(t, alice)
			f(b)
			return b
		}
		for _, tc := range []struct {
			name    string
			body    any
			status  int
			errcode string
		}{
			{"no device_id", badKeys(func(b map[string]any) { delete(b, "device_id") }), 400, "M_MISSING_PARAM"},
			{"no device_data", badKeys(func(b map[string]any) { delete(b, "device_data") }), 400, "M_MISSING_PARAM"},
			{"device_data not an object", badKeys(func(b map[string]any) { b["device_data"] = "x" }), 400, "M_BAD_JSON"},
			{"no algorithm", badKeys(func(b map[string]any) { b["device_data"] = map[string]any{"x": 1} }), 400, "M_BAD_JSON"},
			{"no device_keys", badKeys(func(b map[string]any) { delete(b, "device_keys") }), 400, "M_MISSING_PARAM"},
			{"keys of another device", badKeys(func(b map[string]any) { b["device_id"] = "OTHER" }), 400, "M_INVALID_PARAM"},
			{"device ID taken", badKeys(func(b map[string]any) { b["device_id"] = "ALICE1" }), 400, "M_INVALID_PARAM"},
			{"bad one-time key", badKeys(func(b map[string]any) { b["one_time_keys"] = map[string]any{"signed_curve25519:X": "nope"} }), 400, "M_BAD_JSON"},
			{"not JSON", "{", 400, "M_NOT_JSON"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if r := srv.Do(t, "PUT", dehydratedPath, alice.Token, tc.body); r.Status != tc.status || r.Errcode() != tc.errcode {
					t.Fatalf("%d %s, want %d %s", r.Status, r.Raw, tc.status, tc.errcode)
				}
				if got := srv.Must(t, "GET", dehydratedPath, alice.Token, nil); got["device_id"] != d1.DeviceID {
					t.Fatalf("the dehydrated device is now %v", got["device_id"])
				}
				// ALICE1 has no keys: the dehydrated device alone is shown.
				devs := dehydratedQuery(t, srv, bob, alice.UserID)
				if len(devs) != 1 || devs[d1.DeviceID] == nil {
					t.Fatalf("devices after a refused PUT: %v", devs)
				}
				if list := srv.Must(t, "GET", "/_matrix/client/v3/devices", alice.Token, nil)["devices"].([]any); len(list) != 2 {
					t.Fatalf("alice has %d devices after a refused PUT", len(list))
				}
			})
		}
		fails("POST", dehydratedEventsPath("ALICE1"), map[string]any{}, 403, "M_FORBIDDEN")
		fails("POST", dehydratedEventsPath(d1.DeviceID), map[string]any{"next_batch": "x"}, 400, "M_INVALID_PARAM")

		// A new dehydrated device replaces the old one and its messages.
		d2, body2 := newDehydrated(t, alice)
		srv.Must(t, "PUT", dehydratedPath, alice.Token, body2)
		devs := dehydratedQuery(t, srv, bob, alice.UserID)
		if len(devs) != 1 || devs[d2.DeviceID] == nil {
			t.Fatalf("devices after the replacement: %v", devs)
		}
		var left int
		if err := srv.Store.DB().QueryRow(`SELECT COUNT(*) FROM to_device_inbox WHERE device_id = $1`, d1.DeviceID).Scan(&left); err != nil || left != 0 {
			t.Fatalf("%d messages of the old device left (%v)", left, err)
		}
		fails("POST", dehydratedEventsPath(d1.DeviceID), map[string]any{}, 403, "M_FORBIDDEN")

		// DELETE removes it.
		if r := srv.Must(t, "DELETE", dehydratedPath, alice.Token, nil); r["device_id"] != d2.DeviceID {
			t.Fatalf("DELETE answered %v", r)
		}
		fails("GET", dehydratedPath, nil, 404, "M_NOT_FOUND")
		if devs := dehydratedQuery(t, srv, bob, alice.UserID); len(devs) != 0 {
			t.Fatalf("devices after DELETE: %v", devs)
		}

		// Deleting the device through /devices removes it as dehydrated.
		d3, body3 := newDehydrated(t, alice)
		srv.Must(t, "PUT", dehydratedPath, alice.Token, body3)
		srv.Must(t, "DELETE", "/_matrix/client/v3/devices/"+url.PathEscape(d3.DeviceID), alice.Token, map[string]any{"auth": map[string]any{
			"type": "m.login.password", "identifier": map[string]any{"type": "m.id.user", "user": alice.UserID}, "password": alice.Password}})
		fails("GET", dehydratedPath, nil, http.StatusNotFound, "M_NOT_FOUND")
	})
}

// TestDehydratedRefusedKeys: a PUT whose keys /keys/upload would refuse for
// a new device is refused before anything is written. The previous
// dehydrated device stays with its messages (also when the new device
// would have its ID), no device is made, and a room-mate sees no
// device-list change.
func TestDehydratedRefusedKeys(t *testing.T) {
	const maxOTKs = 5
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{MaxOneTimeKeys: maxOTKs})
		alice := srv.Register(t, "alice", "ALICE1")
		bob := srv.Register(t, "bob", "BOB1")
		srv.Join(t, "!r:test.local", alice.UserID)
		srv.Join(t, "!r:test.local", bob.UserID)

		d1, body := newDehydrated(t, alice)
		srv.Must(t, "PUT", dehydratedPath, alice.Token, body)
		srv.Must(t, "PUT", sendToDevicePath("m.room.encrypted", "t1"), bob.Token,
			map[string]any{"messages": map[string]any{alice.UserID: map[string]any{d1.DeviceID: map[string]any{"n": 1}}}})
		since := srv.Must(t, "GET", "/_matrix/client/v3/sync", bob.Token, nil)["next_batch"].(string)
		bobSeesChange := func() bool {
			t.Helper()
			r := srv.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0&since="+url.QueryEscape(since), bob.Token, nil)
			lists, _ := r["device_lists"].(map[string]any)
			for _, u := range strs(t, lists["changed"]) {
				if u == alice.UserID {
					return true
				}
			}
			return false
		}

		// Each fault is tried on a new device and on a device with the ID
		// of the current dehydrated device.
		faults := []struct {
			name    string
			spoil   func(t *testing.T, d *testutil.User, b map[string]any)
			errcode string
		}{
			{"bad self-signature", func(t *testing.T, d *testutil.User, b map[string]any) {
				_, other, _ := ed25519.GenerateKey(rand.Reader)
				b["device_keys"] = dehydratedBody(t, alice, &testutil.User{UserID: d.UserID, DeviceID: d.DeviceID, Key: other})["device_keys"]
				// The identity keys stay d's: only the signature is wrong.
				b["device_keys"].(map[string]any)["keys"] = dehydratedBody(t, alice, d)["device_keys"].(map[string]any)["keys"]
			}, "M_INVALID_PARAM"},
			{"device_keys of another device", func(t *testing.T, d *testutil.User, b map[string]any) {
				_, other := newDehydrated(t, alice)
				b["device_keys"] = other["device_keys"]
			}, "M_INVALID_PARAM"},
			{"one-time key signed by another key", func(t *testing.T, d *testutil.User, b map[string]any) {
				_, other, _ := ed25519.GenerateKey(rand.Reader)
				forger := &testutil.User{UserID: d.UserID, DeviceID: d.DeviceID, Key: other}
				b["one_time_keys"] = forger.OneTimeKeys(t, "X", 1)
			}, "M_INVALID_PARAM"},
			{"fallback key signed by another key", func(t *testing.T, d *testutil.User, b map[string]any) {
				_, other, _ := ed25519.GenerateKey(rand.Reader)
				forger := &testutil.User{UserID: d.UserID, DeviceID: d.DeviceID, Key: other}
				b["fallback_keys"] = map[string]any{"signed_curve25519:FX": forger.SignedKey(t, true)}
			}, "M_INVALID_PARAM"},
			{"two fallback keys of one algorithm", func(t *testing.T, d *testutil.User, b map[string]any) {
				b["fallback_keys"] = map[string]any{"signed_curve25519:F1": d.SignedKey(t, true), "signed_curve25519:F2": d.SignedKey(t, true)}
			}, "M_INVALID_PARAM"},
			{"over the one-time key cap", func(t *testing.T, d *testutil.User, b map[string]any) {
				b["one_time_keys"] = d.OneTimeKeys(t, "C", maxOTKs+1)
			}, "M_INVALID_PARAM"},
			{"one-time key twice with other content", func(t *testing.T, d *testutil.User, b map[string]any) {
				b["one_time_keys"] = json.RawMessage(`{"signed_curve25519:A":` + testutil.Canonical(t, d.SignedKey(t, false)) +
					`,"signed_curve25519:A":` + testutil.Canonical(t, d.SignedKey(t, false)) + `}`)
			}, "M_INVALID_PARAM"},
		}
		for _, sameID := range []bool{false, true} {
			for _, f := range faults {
				name := f.name + "/new ID"
				if sameID {
					name = f.name + "/current ID"
				}
				t.Run(name, func(t *testing.T) {
					d := d1
					if !sameID {
						d, _ = newDehydrated(t, alice)
					}
					b := dehydratedBody(t, alice, d)
					f.spoil(t, d, b)
					if r := srv.Do(t, "PUT", dehydratedPath, alice.Token, b); r.Status != 400 || r.Errcode() != f.errcode {
						t.Fatalf("%d %s, want 400 %s", r.Status, r.Raw, f.errcode)
					}
					if got := srv.Must(t, "GET", dehydratedPath, alice.Token, nil); got["device_id"] != d1.DeviceID ||
						testutil.Canonical(t, got["device_data"]) != testutil.Canonical(t, body["device_data"]) {
						t.Fatalf("the dehydrated device is now %v", got)
					}
					if r := srv.Must(t, "POST", dehydratedEventsPath(d1.DeviceID), alice.Token, map[string]any{}); len(r["events"].([]any)) != 1 {
						t.Fatalf("the dehydrated device's messages are now %v", r["events"])
					}
					devs := dehydratedQuery(t, srv, bob, alice.UserID)
					if len(devs) != 1 || testutil.Canonical(t, devs[d1.DeviceID]) != testutil.Canonical(t, body["device_keys"]) {
						t.Fatalf("/keys/query after a refused PUT: %v", devs)
					}
					var ids []string
					for _, dev := range srv.Must(t, "GET", "/_matrix/client/v3/devices", alice.Token, nil)["devices"].([]any) {
						ids = append(ids, dev.(map[string]any)["device_id"].(string))
					}
					expectUsers(t, "alice's devices", ids, []string{"ALICE1", d1.DeviceID})
					if bobSeesChange() {
						t.Fatal("a room-mate's /sync shows a device-list change of alice")
					}
				})
			}
		}

		// The check can see a change: a PUT that is accepted shows.
		srv.Must(t, "PUT", dehydratedPath, alice.Token, dehydratedBody(t, alice, d1))
		if !bobSeesChange() {
			t.Fatal("an accepted PUT is not seen by a room-mate")
		}
	})
}

// TestDehydratedLaxKeys: with lax key validation the PUT accepts what
// /keys/upload accepts (signatures unchecked) and still refuses, changing
// nothing, what it refuses.
func TestDehydratedLaxKeys(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{LaxKeyValidation: true})
		alice := srv.Register(t, "alice", "ALICE1")
		d1, body := newDehydrated(t, alice)
		_, other, _ := ed25519.GenerateKey(rand.Reader)
		forger := &testutil.User{UserID: d1.UserID, DeviceID: d1.DeviceID, Key: other}
		body["one_time_keys"] = forger.OneTimeKeys(t, "X", 2)
		srv.Must(t, "PUT", dehydratedPath, alice.Token, body)

		d2, bad := newDehydrated(t, alice)
		bad["fallback_keys"] = map[string]any{"signed_curve25519:F1": d2.SignedKey(t, true), "signed_curve25519:F2": d2.SignedKey(t, true)}
		if r := srv.Do(t, "PUT", dehydratedPath, alice.Token, bad); r.Status != 400 || r.Errcode() != "M_INVALID_PARAM" {
			t.Fatalf("%d %s, want 400 M_INVALID_PARAM", r.Status, r.Raw)
		}
		if got := srv.Must(t, "GET", dehydratedPath, alice.Token, nil); got["device_id"] != d1.DeviceID {
			t.Fatalf("the dehydrated device is now %v", got["device_id"])
		}
		if list := srv.Must(t, "GET", "/_matrix/client/v3/devices", alice.Token, nil)["devices"].([]any); len(list) != 2 {
			t.Fatalf("alice has %d devices after a refused PUT", len(list))
		}
	})
}
