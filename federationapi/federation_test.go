package federationapi_test

import (
	"context"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

const devicesPath = "/_matrix/federation/v1/user/devices/"

func query(t *testing.T, n *testutil.Node, u *testutil.User, users map[string][]string, timeoutMS int) map[string]any {
	t.Helper()
	return n.Must(t, "POST", "/_matrix/client/v3/keys/query", u.Token, map[string]any{"device_keys": users, "timeout": timeoutMS})
}

func devicesOf(t *testing.T, resp map[string]any, userID string) map[string]any {
	t.Helper()
	m, _ := resp["device_keys"].(map[string]any)[userID].(map[string]any)
	return m
}

func failuresOf(resp map[string]any) map[string]any {
	f, _ := resp["failures"].(map[string]any)
	return f
}

// A user on A queries and claims the keys of a user on B, over TLS and
// X-Matrix between two real daemons; the second query is answered from A's
// cache; a stale mark forces a refetch; with B down, A answers from its
// cache and names B in failures.
func TestRemoteQueryAndClaim(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a := testutil.StartNode(t, db, nil)
		b := testutil.StartNode(t, testutil.SQLite(t), func(c *config.Config) { c.Federation.AllowDeviceNames = true })
		bob := a.Register(t, "bob", "")
		alice := b.Register(t, "alice", "ALICEDEV")
		b.Must(t, "PUT", "/_matrix/client/v3/devices/ALICEDEV", alice.Token, map[string]string{"display_name": "Alice's phone"})
		aliceKeys := alice.DeviceKeys(t)
		b.Upload(t, alice, map[string]any{"device_keys": aliceKeys, "one_time_keys": alice.OneTimeKeys(t, "A", 3)})

		// First query: fetched from B.
		r := query(t, a, bob, map[string][]string{alice.UserID: {}}, 10000)
		if f := failuresOf(r); len(f) != 0 {
			t.Fatalf("failures %v", f)
		}
		got := devicesOf(t, r, alice.UserID)["ALICEDEV"]
		if got == nil || canonical(t, got) != canonical(t, aliceKeys) {
			t.Fatalf("remote keys %v", r)
		}
		if name := got.(map[string]any)["unsigned"].(map[string]any)["device_display_name"]; name != "Alice's phone" {
			t.Fatalf("display name %v", name)
		}
		if n := b.Requests.Count("GET", devicesPath); n != 1 {
			t.Fatalf("%d /user/devices requests, want 1", n)
		}
		// Second query: from the cache, no request.
		r = query(t, a, bob, map[string][]string{alice.UserID: {"ALICEDEV"}}, 10000)
		if devicesOf(t, r, alice.UserID)["ALICEDEV"] == nil {
			t.Fatalf("cached query %v", r)
		}
		if n := b.Requests.Count("GET", devicesPath); n != 1 {
			t.Fatalf("%d /user/devices requests after a cached query, want 1", n)
		}

		// A claim goes to B, and the key is the oldest one.
		c := a.Must(t, "POST", "/_matrix/client/v3/keys/claim", bob.Token, map[string]any{
			"one_time_keys": map[string]any{alice.UserID: map[string]string{"ALICEDEV": "signed_curve25519"}}})
		keys, _ := c["one_time_keys"].(map[string]any)[alice.UserID].(map[string]any)["ALICEDEV"].(map[string]any)
		if keys["signed_curve25519:A0000"] == nil || len(failuresOf(c)) != 0 {
			t.Fatalf("remote claim %v", c)
		}
		if n := counts(t, b, alice); n != 2 {
			t.Fatalf("B holds %v keys after the claim, want 2", n)
		}

		// A new device on B, invisible until the cached list is marked stale.
		alice2 := b.Login(t, alice, "SECONDDEV")
		b.Upload(t, alice2, map[string]any{"device_keys": alice2.DeviceKeys(t)})
		if len(devicesOf(t, query(t, a, bob, map[string][]string{alice.UserID: {}}, 10000), alice.UserID)) != 1 {
			t.Fatal("the cache was not used")
		}
		if err := a.Store.MarkRemoteStale(context.Background(), alice.UserID, b.ServerName, 0); err != nil {
			t.Fatal(err)
		}
		r = query(t, a, bob, map[string][]string{alice.UserID: {}}, 10000)
		if len(devicesOf(t, r, alice.UserID)) != 2 || b.Requests.Count("GET", devicesPath) != 2 {
			t.Fatalf("stale list not fetched again: %v, %d requests", r, b.Requests.Count("GET", devicesPath))
		}

		// B down: A answers from its cache and reports the failure.
		b.Stop()
		if err := a.Store.MarkRemoteStale(context.Background(), alice.UserID, b.ServerName, 0); err != nil {
			t.Fatal(err)
		}
		r = query(t, a, bob, map[string][]string{alice.UserID: {}}, 3000)
		if f := failuresOf(r); f[b.ServerName] == nil {
			t.Fatalf("no failure for %s: %v", b.ServerName, r)
		}
		if len(devicesOf(t, r, alice.UserID)) != 2 {
			t.Fatalf("cached copy not returned with the failure: %v", r)
		}
		c = a.Must(t, "POST", "/_matrix/client/v3/keys/claim", bob.Token, map[string]any{
			"one_time_keys": map[string]any{alice.UserID: map[string]string{"ALICEDEV": "signed_curve25519"}}, "timeout": 3000})
		if failuresOf(c)[b.ServerName] == nil {
			t.Fatalf("claim with B down: %v", c)
		}
	})
}

func canonical(t *testing.T, v any) string {
	t.Helper()
	return testutil.Canonical(t, v)
}

func counts(t *testing.T, n *testutil.Node, u *testutil.User) float64 {
	t.Helper()
	r := n.Upload(t, u, map[string]any{})
	return r["one_time_key_counts"].(map[string]any)["signed_curve25519"].(float64)
}

// A server that accepts connections and never answers is given up on
// within the client's timeout, and named in failures.
func TestRemoteTimeout(t *testing.T) {
	db := testutil.SQLite(t)
	a := testutil.StartNode(t, db, nil)
	bob := a.Register(t, "bob", "")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, silent, until the test ends
		}
	}()
	silent := ln.Addr().String()
	start := time.Now()
	r := query(t, a, bob, map[string][]string{"@carol:" + silent: {}, bob.UserID: {}}, 1000)
	if failuresOf(r)[silent] == nil {
		t.Fatalf("no failure for the silent server: %v", r)
	}
	if devicesOf(t, r, bob.UserID) == nil {
		t.Fatalf("local part of the answer missing: %v", r)
	}
	// The bound is generous: this checks that the request ends, not how fast.
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Fatalf("query took %v with a 1 s timeout", elapsed)
	}
}

// Every device in a key query carries an "unsigned" object, an empty one
// when there is no display name to show (a remote user's devices with
// allow_device_names off): a missing member is re-encoded as null by some
// servers, and clients then drop the device. It holds for local and remote
// users on /keys/query, for /user/keys/query and for /user/devices.
func TestUnsignedAlwaysPresent(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a := testutil.StartNode(t, db, nil)
		b := testutil.StartNode(t, testutil.SQLite(t), nil) // device names not shown over federation
		origin := testutil.NewOrigin(t)
		bob := a.Register(t, "bob", "BOBDEV")
		a.Upload(t, bob, map[string]any{"device_keys": bob.DeviceKeys(t)})
		alice := b.Register(t, "alice", "ALICEDEV")
		b.Must(t, "PUT", "/_matrix/client/v3/devices/ALICEDEV", alice.Token, map[string]string{"display_name": "Alice's phone"})
		b.Upload(t, alice, map[string]any{"device_keys": alice.DeviceKeys(t)})

		emptyUnsigned := func(where string, dev any) {
			t.Helper()
			u, ok := dev.(map[string]any)["unsigned"].(map[string]any)
			if !ok || len(u) != 0 {
				t.Fatalf("%s: unsigned is %#v, want {}", where, dev.(map[string]any)["unsigned"])
			}
		}
		// A local device without a display name.
		r := query(t, a, bob, map[string][]string{bob.UserID: {}}, 10000)
		emptyUnsigned("local /keys/query", devicesOf(t, r, bob.UserID)["BOBDEV"])
		// A remote device whose name its server keeps to itself.
		r = query(t, a, bob, map[string][]string{alice.UserID: {}}, 10000)
		emptyUnsigned("remote /keys/query", devicesOf(t, r, alice.UserID)["ALICEDEV"])
		// What B tells other servers.
		fr := testutil.SendTo(t, b, origin.SignedRequest(t, "POST", b.ServerName, "/_matrix/federation/v1/user/keys/query",
			map[string]any{"device_keys": map[string][]string{alice.UserID: {}}}, "", nil))
		emptyUnsigned("/user/keys/query", devicesOf(t, fr.Body, alice.UserID)["ALICEDEV"])
		fr = testutil.SendTo(t, b, origin.SignedRequest(t, "GET", b.ServerName, devicesPath+url.PathEscape(alice.UserID), nil, "", nil))
		devices, _ := fr.Body["devices"].([]any)
		if fr.Status != 200 || len(devices) != 1 {
			t.Fatalf("/user/devices: %d %s", fr.Status, fr.Raw)
		}
		emptyUnsigned("/user/devices", devices[0].(map[string]any)["keys"])
	})
}
