package clientapi_test

import (
	"net/http"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

type endpoint struct{ method, path string }

// unstableEndpoints are the endpoints clients first called under
// /_matrix/client/unstable, which older clients and test tools still do.
var unstableEndpoints = []endpoint{
	{"POST", "/keys/upload"}, {"POST", "/keys/upload/SOMEDEV"}, {"POST", "/keys/query"},
	{"POST", "/keys/claim"}, {"GET", "/keys/changes"},
	{"POST", "/keys/device_signing/upload"}, {"POST", "/keys/signatures/upload"},
	{"POST", "/room_keys/version"}, {"GET", "/room_keys/version"},
	{"GET", "/room_keys/version/1"}, {"PUT", "/room_keys/version/1"}, {"DELETE", "/room_keys/version/1"},
	{"PUT", "/room_keys/keys"}, {"GET", "/room_keys/keys"}, {"DELETE", "/room_keys/keys"},
	{"PUT", "/room_keys/keys/!r:x"}, {"GET", "/room_keys/keys/!r:x"}, {"DELETE", "/room_keys/keys/!r:x"},
	{"PUT", "/room_keys/keys/!r:x/S"}, {"GET", "/room_keys/keys/!r:x/S"}, {"DELETE", "/room_keys/keys/!r:x/S"},
	{"PUT", "/sendToDevice/m.test/txn1"},
	{"GET", "/devices"}, {"GET", "/devices/SOMEDEV"}, {"PUT", "/devices/SOMEDEV"}, {"DELETE", "/devices/SOMEDEV"},
	{"POST", "/delete_devices"},
}

// stableOnlyEndpoints are a sample of the others, served under r0 and v3.
var stableOnlyEndpoints = []endpoint{
	{"POST", "/logout"}, {"GET", "/account/whoami"}, {"GET", "/capabilities"}, {"GET", "/sync"},
	{"POST", "/createRoom"}, {"GET", "/joined_rooms"}, {"PUT", "/rooms/!r:x/send/m.room.message/t1"},
	{"GET", "/user/@a:x/account_data/m.test"}, {"PUT", "/profile/@a:x/displayname"},
}

// Every endpoint is served under r0 and v3, and those first shipped under
// unstable under unstable too: without a token each answers 401
// M_MISSING_TOKEN, where a path that is not served answers 404.
func TestEndpointsUnderEachVersion(t *testing.T) {
	srv := testutil.NewServer(t, testutil.SQLite(t), testutil.ServerOptions{})
	check := func(version string, e endpoint, want int) {
		t.Helper()
		path := "/_matrix/client/" + version + e.path
		r := srv.Do(t, e.method, path, "", nil)
		if r.Status != want {
			t.Errorf("%s %s: %d %s, want %d", e.method, path, r.Status, r.Raw, want)
		}
	}
	for _, e := range unstableEndpoints {
		for _, v := range []string{"r0", "v3", "unstable"} {
			check(v, e, http.StatusUnauthorized)
		}
	}
	for _, e := range stableOnlyEndpoints {
		for _, v := range []string{"r0", "v3"} {
			check(v, e, http.StatusUnauthorized)
		}
	}
	// Not every version is served: an unknown one, or unstable for an
	// endpoint that never was there, is 404.
	check("v4", endpoint{"POST", "/keys/upload"}, http.StatusNotFound)
	check("unstable", endpoint{"POST", "/createRoom"}, http.StatusNotFound)
	// A known path with the wrong method is 405 under every version.
	check("unstable", endpoint{"GET", "/keys/device_signing/upload"}, http.StatusMethodNotAllowed)
}

// Cross-signing and key backup work end to end under unstable, as the
// cross-signing and backup tests of the ecosystem's tools call them.
func TestUnstableCrossSigningAndBackup(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		const unstable = "/_matrix/client/unstable"
		xs := testutil.NewCrossSigning(alice.UserID)
		srv.Must(t, "POST", unstable+"/keys/device_signing/upload", alice.Token, xs.Upload(t))
		master, _, _ := crossKeys(t, srv, alice, alice.UserID)
		if canonicalOf(t, master[alice.UserID]) != canonicalOf(t, xs.MasterKey()) {
			t.Fatalf("master key after an upload under unstable: %v", master)
		}
		v := srv.Must(t, "POST", unstable+"/room_keys/version", alice.Token,
			map[string]any{"algorithm": "m.megolm_backup.v1.curve25519-aes-sha2", "auth_data": map[string]any{"public_key": "abc"}})
		got := srv.Must(t, "GET", unstable+"/room_keys/version/"+v["version"].(string), alice.Token, nil)
		if got["version"] != v["version"] {
			t.Fatalf("backup version under unstable: %v", got)
		}
	})
}

// /versions names the features served that clients look for, and no
// others.
func TestVersionsUnstableFeatures(t *testing.T) {
	srv := testutil.NewServer(t, testutil.SQLite(t), testutil.ServerOptions{})
	body := srv.Must(t, "GET", "/_matrix/client/versions", "", nil)
	features, _ := body["unstable_features"].(map[string]any)
	want := map[string]any{"org.matrix.e2e_cross_signing": true, "org.matrix.msc3814": true, "org.matrix.msc3916.stable": true}
	if len(features) != len(want) {
		t.Fatalf("unstable_features %v, want %v", features, want)
	}
	for k, v := range want {
		if features[k] != v {
			t.Fatalf("unstable_features %v, want %v", features, want)
		}
	}
}
