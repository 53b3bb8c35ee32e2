package keyserver_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/internal/testvectors"
	"github.com/keyserver/keyserver/keyserver"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// CheckNewDeviceUpload gives the verdict UploadKeys gives for a new device
// (one with no keys), with the same error, in strict and lax mode, and
// needs no device to give it: it reads and writes nothing.
func TestCheckNewDeviceUploadMatchesUploadKeys(t *testing.T) {
	const maxOTKs = 5
	vectors, err := testvectors.Load()
	if err != nil {
		t.Fatal(err)
	}
	type upload struct {
		userID, deviceID string
		body             map[string]any
	}
	type tc struct {
		name            string
		make            func(t *testing.T) upload
		strictOK, laxOK bool
	}
	generated := func(spoil func(t *testing.T, d *testutil.User, b map[string]any)) func(t *testing.T) upload {
		return func(t *testing.T) upload {
			_, key, _ := ed25519.GenerateKey(rand.Reader)
			d := &testutil.User{UserID: "@gen:127.0.0.1:18401", DeviceID: "GENDEV", Key: key}
			b := map[string]any{"device_keys": d.DeviceKeys(t), "one_time_keys": d.OneTimeKeys(t, "A", 3),
				"fallback_keys": map[string]any{"signed_curve25519:F": d.SignedKey(t, true)}}
			spoil(t, d, b)
			return upload{d.UserID, d.DeviceID, b}
		}
	}
	forger := func(d *testutil.User) *testutil.User {
		_, key, _ := ed25519.GenerateKey(rand.Reader)
		return &testutil.User{UserID: d.UserID, DeviceID: d.DeviceID, Key: key}
	}
	cases := []tc{
		{"generated", generated(func(*testing.T, *testutil.User, map[string]any) {}), true, true},
		{"bad self-signature", generated(func(t *testing.T, d *testutil.User, b map[string]any) {
			dk := forger(d).DeviceKeys(t)
			dk["keys"] = d.DeviceKeys(t)["keys"]
			b["device_keys"] = dk
		}), false, true},
		{"device_keys of another device", generated(func(t *testing.T, d *testutil.User, b map[string]any) {
			other := forger(d)
			other.DeviceID = "OTHER"
			b["device_keys"] = other.DeviceKeys(t)
		}), false, false},
		{"device_keys of another user", generated(func(t *testing.T, d *testutil.User, b map[string]any) {
			other := forger(d)
			other.UserID = "@other:127.0.0.1:18401"
			b["device_keys"] = other.DeviceKeys(t)
		}), false, false},
		{"one-time key signed by another key", generated(func(t *testing.T, d *testutil.User, b map[string]any) {
			b["one_time_keys"] = forger(d).OneTimeKeys(t, "X", 1)
		}), false, true},
		{"fallback key signed by another key", generated(func(t *testing.T, d *testutil.User, b map[string]any) {
			b["fallback_keys"] = map[string]any{"signed_curve25519:FX": forger(d).SignedKey(t, true)}
		}), false, true},
		{"two fallback keys of one algorithm", generated(func(t *testing.T, d *testutil.User, b map[string]any) {
			b["fallback_keys"] = map[string]any{"signed_curve25519:F1": d.SignedKey(t, true), "signed_curve25519:F2": d.SignedKey(t, true)}
		}), false, false},
		{"one-time keys up to the cap", generated(func(t *testing.T, d *testutil.User, b map[string]any) {
			b["one_time_keys"] = d.OneTimeKeys(t, "C", maxOTKs)
		}), true, true},
		{"one-time keys over the cap", generated(func(t *testing.T, d *testutil.User, b map[string]any) {
			b["one_time_keys"] = d.OneTimeKeys(t, "C", maxOTKs+1)
		}), false, false},
		{"one-time key not a key", generated(func(t *testing.T, d *testutil.User, b map[string]any) {
			b["one_time_keys"] = map[string]any{"signed_curve25519:X": "nope"}
		}), false, false},
	}
	raw := func(v any) map[string]any {
		js, _ := json.Marshal(v)
		var m map[string]any
		_ = json.Unmarshal(js, &m)
		return m
	}
	for _, c := range vectors.Clients {
		c := c
		body := map[string]any{"device_keys": c.DeviceKeys, "one_time_keys": c.OneTimeKeys}
		if len(c.FallbackKeys) > 0 {
			body["fallback_keys"] = c.FallbackKeys
		}
		cases = append(cases, tc{"real " + c.UserID, func(*testing.T) upload { return upload{c.UserID, c.DeviceID, raw(body)} }, true, true})
	}
	for _, n := range vectors.Negative {
		n := n
		var client testvectors.Client
		for _, c := range vectors.Clients {
			if c.UserID == n.UserID {
				client = c
			}
		}
		body := map[string]any{"device_keys": client.DeviceKeys, "one_time_keys": client.OneTimeKeys}
		switch n.Kind {
		case "device_keys":
			body["device_keys"] = n.Object
		case "one_time_key":
			body["one_time_keys"] = map[string]any{n.KeyID: n.Object}
		}
		cases = append(cases, tc{"negative " + n.Name, func(*testing.T) upload { return upload{n.UserID, n.DeviceID, raw(body)} }, false, n.Kind == "device_keys"})
	}

	testutil.ForEachDatabase(t, func(t *testing.T, tdb testutil.Database) {
		ctx := context.Background()
		store, err := sqlstore.Open(ctx, tdb.URI, "127.0.0.1:18401")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		accounts := map[string]bool{}
		for _, lax := range []bool{false, true} {
			log := logrus.New()
			log.SetOutput(io.Discard)
			svc := keyserver.New(store, keyserver.Options{ServerName: "127.0.0.1:18401", Logger: log,
				MaxOneTimeKeys: maxOTKs, LaxKeyValidation: lax})
			for i, c := range cases {
				t.Run(fmt.Sprintf("lax=%v/%s", lax, c.name), func(t *testing.T) {
					u := c.make(t)
					js, _ := json.Marshal(u.body)
					var r keyserver.UploadRequest
					if err := json.Unmarshal(js, &r); err != nil {
						t.Fatal(err)
					}
					caller := matrixid.Caller{UserID: u.userID, DeviceID: u.deviceID}
					// The device does not exist yet: the check reads none.
					checked := svc.CheckNewDeviceUpload(ctx, caller, r)
					if want := c.strictOK || lax && c.laxOK; (checked == nil) != want {
						t.Fatalf("CheckNewDeviceUpload: %v, want accepted %v", checked, want)
					}

					login := storage.NewLogin{UserID: u.userID, DeviceID: u.deviceID, TokenHash: fmt.Sprintf("%v-%d", lax, i)}
					if !accounts[u.userID] {
						_, err = store.CreateAccount(ctx, u.userID, "x", &login)
						accounts[u.userID] = true
					} else {
						_, err = store.Login(ctx, login)
					}
					if err != nil {
						t.Fatal(err)
					}
					defer func() {
						if _, _, err := store.DeleteDevices(ctx, u.userID, []string{u.deviceID}); err != nil {
							t.Fatal(err)
						}
					}()
					if dev, err := store.Device(ctx, u.userID, u.deviceID); err != nil || dev.KeyJSON != nil {
						t.Fatalf("the new device has keys %s (%v)", dev.KeyJSON, err)
					}
					_, uploaded := svc.UploadKeys(ctx, caller, r)
					if matrixError(checked) != matrixError(uploaded) {
						t.Fatalf("CheckNewDeviceUpload: %v; UploadKeys: %v", checked, uploaded)
					}
				})
			}
		}
	})
}

// matrixError is what a client is told of err: "" for nil, the Matrix
// error it carries, or that it carries none.
func matrixError(err error) string {
	var mx *mxerr.Error
	switch {
	case err == nil:
		return ""
	case errors.As(err, &mx):
		return mx.Error()
	default:
		return "not a Matrix error: " + err.Error()
	}
}
