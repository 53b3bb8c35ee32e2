package clientapi_test

import (
	"crypto/ed25519"
	"crypto/rand"
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
	return d, body
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
