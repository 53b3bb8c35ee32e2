package federationapi_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

// remoteUser is a user on an Origin with a device and its identity key.
type remoteUser struct {
	*testutil.User
}

func newRemoteUser(t *testing.T, o *testutil.Origin, localpart, deviceID string) remoteUser {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	return remoteUser{&testutil.User{UserID: "@" + localpart + ":" + o.Name, DeviceID: deviceID, Key: priv}}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// What a remote server answers is checked before it is stored or passed
// on, for what protects this server: devices of other users, keys of
// another device than the one listed, and oversized lists are refused.
// Keys are otherwise kept as sent, signed or not (clients check them),
// with a missing user_id or device_id filled in. Claimed keys of a device
// whose keys are known must be signed by it.
func TestRemoteAnswersAreChecked(t *testing.T) {
	n := testutil.StartNode(t, testutil.SQLite(t), nil)
	bob := n.Register(t, "bob", "")
	o := testutil.NewOrigin(t)
	carol := newRemoteUser(t, o, "carol", "CAROLDEV")
	mallory := newRemoteUser(t, o, "mallory", "MALDEV")
	carolKeys := carol.DeviceKeys(t)
	forged := carol.DeviceKeys(t)
	forged["device_id"] = "FORGED" // signature no longer covers it: for clients to see
	placeholder := map[string]any{"keys": map[string]any{"ed25519:test": "ed_key"}, "unsigned": map[string]any{"x": 1}}

	o.Mux.HandleFunc("GET /_matrix/federation/v1/user/devices/{user}", func(w http.ResponseWriter, r *http.Request) {
		switch r.PathValue("user") {
		case carol.UserID:
			writeJSON(w, map[string]any{"user_id": carol.UserID, "stream_id": 7, "devices": []any{
				map[string]any{"device_id": "CAROLDEV", "keys": carolKeys},
				map[string]any{"device_id": "FORGED", "keys": forged},
				map[string]any{"device_id": "OTHERDEV", "keys": carol.DeviceKeys(t)}, // CAROLDEV's keys
				map[string]any{"device_id": "TOOL", "keys": placeholder},
				map[string]any{"device_id": "BIG", "keys": map[string]any{"keys": map[string]any{"pad": strings.Repeat("x", 20000)}}},
			}})
		case "@mixed:" + o.Name: // holds another user's device
			writeJSON(w, map[string]any{"user_id": "@mixed:" + o.Name, "stream_id": 7, "devices": []any{
				map[string]any{"device_id": "MALDEV", "keys": mallory.DeviceKeys(t)},
			}})
		case "@many:" + o.Name:
			devices := make([]any, 1001)
			for i := range devices {
				devices[i] = map[string]any{"device_id": fmt.Sprintf("D%d", i), "keys": map[string]any{}}
			}
			writeJSON(w, map[string]any{"user_id": "@many:" + o.Name, "stream_id": 1, "devices": devices})
		default: // answers for someone else
			writeJSON(w, map[string]any{"user_id": mallory.UserID, "stream_id": 1, "devices": []any{}})
		}
	})
	o.Mux.HandleFunc("POST /_matrix/federation/v1/user/keys/claim", func(w http.ResponseWriter, r *http.Request) {
		bad := carol.SignedKey(t, false)
		bad["key"] = testutil.RandomKey()
		writeJSON(w, map[string]any{"one_time_keys": map[string]any{carol.UserID: map[string]any{
			"CAROLDEV": map[string]any{"signed_curve25519:BAD": bad},
		}}})
	})

	r := query(t, n, bob, map[string][]string{carol.UserID: {}}, 5000)
	got := devicesOf(t, r, carol.UserID)
	wantTool := map[string]any{"user_id": carol.UserID, "device_id": "TOOL", "keys": placeholder["keys"]}
	if len(got) != 3 || testutil.Canonical(t, got["CAROLDEV"]) != testutil.Canonical(t, carolKeys) ||
		testutil.Canonical(t, got["FORGED"]) != testutil.Canonical(t, forged) ||
		testutil.Canonical(t, got["TOOL"]) != testutil.Canonical(t, wantTool) {
		t.Fatalf("expected carol's devices CAROLDEV, FORGED and TOOL as sent: %v", r)
	}
	for _, user := range []string{"@many:" + o.Name, "@someone:" + o.Name, "@mixed:" + o.Name} {
		r := query(t, n, bob, map[string][]string{user: {}}, 5000)
		if failuresOf(r)[o.Name] == nil || devicesOf(t, r, user) != nil {
			t.Fatalf("%s: bad answer accepted: %v", user, r)
		}
	}
	c := n.Must(t, "POST", "/_matrix/client/v3/keys/claim", bob.Token, map[string]any{
		"one_time_keys": map[string]any{carol.UserID: map[string]string{"CAROLDEV": "signed_curve25519"}}})
	if otk := c["one_time_keys"].(map[string]any); len(otk) != 0 {
		t.Fatalf("a key with a bad signature was passed on: %v", c)
	}
}

// A server that fails is left alone for a while (queries naming it fail at
// once), until it shows it is up by sending us a signed request.
func TestFailingServerBacksOff(t *testing.T) {
	n := testutil.StartNode(t, testutil.SQLite(t), nil)
	bob := n.Register(t, "bob", "")
	o := testutil.NewOrigin(t)
	var calls atomic.Int32
	var healthy atomic.Bool
	carol := newRemoteUser(t, o, "carol", "CAROLDEV")
	o.Mux.HandleFunc("GET /_matrix/federation/v1/user/devices/{user}", func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if !healthy.Load() {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		writeJSON(w, map[string]any{"user_id": carol.UserID, "stream_id": 1, "devices": []any{
			map[string]any{"device_id": "CAROLDEV", "keys": carol.DeviceKeys(t)}}})
	})
	for i := 0; i < 3; i++ {
		r := query(t, n, bob, map[string][]string{carol.UserID: {}}, 5000)
		f, _ := failuresOf(r)[o.Name].(map[string]any)
		if f == nil {
			t.Fatalf("query %d: no failure: %v", i, r)
		}
		if i > 0 && fmt.Sprint(f["message"]) != "Not ready for retry" {
			t.Fatalf("query %d did not report the backoff: %v", i, f)
		}
	}
	if c := calls.Load(); c != 1 {
		t.Fatalf("%d requests to a failing server, want 1", c)
	}
	// The server comes back and says so by making a signed request.
	healthy.Store(true)
	testutil.SendTo(t, n, o.SignedRequest(t, "POST", n.ServerName, "/_matrix/federation/v1/user/keys/query",
		map[string]any{"device_keys": map[string][]string{}}, "", nil))
	r := query(t, n, bob, map[string][]string{carol.UserID: {}}, 5000)
	if len(failuresOf(r)) != 0 || devicesOf(t, r, carol.UserID)["CAROLDEV"] == nil {
		t.Fatalf("after recovery: %v", r)
	}
}

// Claimed keys the other server has handed over are spent there: a key
// this server cannot check (a plain curve25519 key, an algorithm it does
// not know, a device whose keys it does not have or whose ed25519 key is a
// test tool's placeholder) is passed on unchanged;
// only a signed_curve25519 key that fails the check against its device's
// key is dropped, as are keys that were not asked for.
func TestRemoteClaimsPassOnUncheckableKeys(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, nil)
		bob := n.Register(t, "bob", "")
		o := testutil.NewOrigin(t)
		dev := map[string]remoteUser{}
		for _, id := range []string{"PLAIN", "NEWALG", "SIGNED", "BADSIG", "UNLISTED", "WRONGALG"} {
			dev[id] = newRemoteUser(t, o, "carol", id)
		}
		dave := newRemoteUser(t, o, "dave", "DAVEDEV")
		carolID := dev["PLAIN"].UserID

		o.Mux.HandleFunc("GET /_matrix/federation/v1/user/devices/{user}", func(w http.ResponseWriter, r *http.Request) {
			if r.PathValue("user") != carolID { // dave's list cannot be had
				w.WriteHeader(http.StatusNotFound)
				writeJSON(w, map[string]string{"errcode": "M_NOT_FOUND", "error": "no such user"})
				return
			}
			devices := []any{map[string]any{"device_id": "PLACEHOLDER", "keys": map[string]any{
				"keys": map[string]any{"ed25519:PLACEHOLDER": "ed_key", "curve25519:PLACEHOLDER": "curve_key"}}}}
			for _, id := range []string{"PLAIN", "NEWALG", "SIGNED", "BADSIG", "WRONGALG"} {
				devices = append(devices, map[string]any{"device_id": id, "keys": dev[id].DeviceKeys(t)})
			}
			writeJSON(w, map[string]any{"user_id": carolID, "stream_id": 3, "devices": devices})
		})
		bad := dev["BADSIG"].SignedKey(t, false)
		bad["key"] = testutil.RandomKey() // no longer what was signed
		sent := map[string]any{
			carolID: map[string]any{
				"PLAIN":    map[string]any{"curve25519:P1": testutil.RandomKey()},
				"NEWALG":   map[string]any{"org.example.new:K1": map[string]any{"key": "not base64!", "extra": []any{1, "two"}}},
				"SIGNED":   map[string]any{"signed_curve25519:S1": dev["SIGNED"].SignedKey(t, false)},
				"BADSIG":   map[string]any{"signed_curve25519:B1": bad},
				"UNLISTED": map[string]any{"signed_curve25519:U1": dev["UNLISTED"].SignedKey(t, false)},
				"WRONGALG": map[string]any{"curve25519:W1": testutil.RandomKey()},
				"NOTASKED": map[string]any{"signed_curve25519:N1": dev["SIGNED"].SignedKey(t, false)},
				"PLACEHOLDER": map[string]any{"signed_curve25519:X1": map[string]any{"key": "otk",
					"signatures": map[string]any{carolID: map[string]any{"ed25519:PLACEHOLDER": "sig"}}}},
			},
			dave.UserID: map[string]any{"DAVEDEV": map[string]any{"signed_curve25519:D1": dave.SignedKey(t, true)}},
		}
		o.Mux.HandleFunc("POST /_matrix/federation/v1/user/keys/claim", func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, map[string]any{"one_time_keys": sent})
		})

		c := n.Must(t, "POST", "/_matrix/client/v3/keys/claim", bob.Token, map[string]any{"one_time_keys": map[string]any{
			carolID: map[string]string{"PLAIN": "curve25519", "NEWALG": "org.example.new", "SIGNED": "signed_curve25519",
				"BADSIG": "signed_curve25519", "UNLISTED": "signed_curve25519", "WRONGALG": "signed_curve25519",
				"PLACEHOLDER": "signed_curve25519"},
			dave.UserID: map[string]string{"DAVEDEV": "signed_curve25519"},
		}})
		if f := failuresOf(c); len(f) != 0 {
			t.Fatalf("failures %v", f)
		}
		got := c["one_time_keys"].(map[string]any)
		want := map[string][]string{
			carolID:     {"PLAIN", "NEWALG", "SIGNED", "UNLISTED", "PLACEHOLDER"},
			dave.UserID: {"DAVEDEV"},
		}
		for userID, devices := range want {
			byDevice, _ := got[userID].(map[string]any)
			if len(byDevice) != len(devices) {
				t.Fatalf("%s: got devices %v, want %v", userID, byDevice, devices)
			}
			for _, id := range devices {
				wantKeys := sent[userID].(map[string]any)[id]
				if testutil.Canonical(t, byDevice[id]) != testutil.Canonical(t, wantKeys) {
					t.Fatalf("%s %s: passed on %v, the server sent %v", userID, id, byDevice[id], wantKeys)
				}
			}
		}
	})
}
