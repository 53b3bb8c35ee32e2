package clientapi_test

import (
	"database/sql"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/faultproxy"
	"github.com/keyserver/keyserver/internal/testutil"
)

// Daemons sharing a PostgreSQL database cache token lookups; a token
// revoked through one daemon stops working on the other as soon as the
// revocation's notification arrives: after a logout, and after a login
// that takes over the device.
func TestSharedDatabaseRevokesTokens(t *testing.T) {
	db := testutil.Postgres(t)
	a1 := testutil.StartNode(t, db, nil)
	a2 := testutil.StartNode(t, db, func(c *config.Config) { c.ServerName = a1.ServerName })
	whoami := func(n *testutil.Node, token string) testutil.Response {
		return n.Do(t, "GET", "/_matrix/client/v3/account/whoami", token, nil)
	}
	// The wait is far shorter than the cache's expiry, so only the
	// notification can end it.
	waitRevoked := func(what string, n *testutil.Node, token string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			r := whoami(n, token)
			if r.Status == http.StatusUnauthorized && r.Errcode() == "M_UNKNOWN_TOKEN" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the other daemon still answers %d %s", what, r.Status, r.Raw)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	// First, proof that a2 answers from its cache (which it turns on once
	// it listens): a token it has looked up still works there after its
	// row is deleted behind the daemons' backs, with no notification.
	// Without that proof the revocations below could pass uncached.
	sqlDB, err := sql.Open("postgres", db.URI)
	if err != nil {
		t.Fatal(err)
	}
	defer sqlDB.Close()
	bob := a1.Register(t, "bob", "")
	testutil.Eventually(t, "a2 answers from its token cache", func() bool {
		b := a1.Login(t, bob, "")
		if r := whoami(a2, b.Token); r.Status != http.StatusOK {
			t.Fatalf("whoami on the other daemon: %d %s", r.Status, r.Raw)
		}
		if _, err := sqlDB.Exec(`DELETE FROM access_tokens WHERE device_id = $1`, b.DeviceID); err != nil {
			t.Fatal(err)
		}
		return whoami(a2, b.Token).Status == http.StatusOK
	})

	alice := a1.Register(t, "alice", "")
	for i := 0; i < 2; i++ { // the second answer comes from a2's cache
		if r := whoami(a2, alice.Token); r.Status != http.StatusOK {
			t.Fatalf("whoami on the other daemon: %d %s", r.Status, r.Raw)
		}
	}
	a1.Must(t, "POST", "/_matrix/client/v3/logout", alice.Token, map[string]any{})
	waitRevoked("after the logout", a2, alice.Token)

	phone := a1.Login(t, alice, "PHONE")
	if r := whoami(a2, phone.Token); r.Status != http.StatusOK {
		t.Fatalf("whoami with the new token: %d %s", r.Status, r.Raw)
	}
	again := a1.Login(t, alice, "PHONE") // takes the device over: phone.Token is revoked
	waitRevoked("after the takeover", a2, phone.Token)
	if r := whoami(a2, again.Token); r.Status != http.StatusOK {
		t.Fatalf("whoami with the token that took over: %d %s", r.Status, r.Raw)
	}
}

// A revocation made through one daemon is in force on every daemon
// sharing the database once the revoking call returns, whatever the path:
// logout, logout/all, deleting a device, delete_devices, a password
// change, a deactivation, a login that takes a device over. The other
// daemon reaches the database through a link that delays its answers (and
// so the revocation's notification) by far more than a request to it
// takes, as a daemon on another host would: only a revocation confirmed
// before the call returns passes.
func TestSharedDatabaseRevocationIsImmediate(t *testing.T) {
	db := testutil.Postgres(t)
	u, err := url.Parse(db.URI)
	if err != nil {
		t.Fatal(err)
	}
	// The database is reached over TCP, or on a Unix socket in the
	// directory named by the host parameter.
	network, target := "tcp", u.Host
	q := u.Query()
	if dir := q.Get("host"); strings.HasPrefix(dir, "/") {
		port := q.Get("port")
		if port == "" {
			port = "5432"
		}
		network, target = "unix", filepath.Join(dir, ".s.PGSQL."+port)
		q.Del("host")
		q.Del("port")
		u.RawQuery = q.Encode()
	}
	slow, err := faultproxy.NewLatency(network, target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(slow.Close) // after the daemons stop
	u.Host = slow.Addr()
	a1 := testutil.StartNode(t, db, nil)
	a2 := testutil.StartNode(t, testutil.Database{Name: db.Name, URI: u.String()}, func(c *config.Config) { c.ServerName = a1.ServerName })
	testutil.Eventually(t, "a2 listens for revocations", func() bool {
		return a2.Store.Listening()
	})
	slow.SetDelay(100 * time.Millisecond)
	defer slow.SetDelay(0)

	whoami := func(n *testutil.Node, token string) testutil.Response {
		return n.Do(t, "GET", "/_matrix/client/v3/account/whoami", token, nil)
	}
	// cached has a2 look the token up, which puts it in a2's cache.
	cached := func(token string) {
		t.Helper()
		for range 2 {
			if r := whoami(a2, token); r.Status != http.StatusOK {
				t.Fatalf("whoami on the other daemon: %d %s", r.Status, r.Raw)
			}
		}
	}
	refused := func(what, token string) {
		t.Helper()
		if r := whoami(a2, token); r.Status != http.StatusUnauthorized || r.Errcode() != "M_UNKNOWN_TOKEN" {
			t.Errorf("%s: the other daemon still accepts the token: %d %s", what, r.Status, r.Raw)
		}
	}
	// withAuth makes a request that needs user-interactive auth by
	// password, answering the challenge's session.
	withAuth := func(user *testutil.User, method, path string, body map[string]any) {
		t.Helper()
		auth := map[string]any{"type": "m.login.password", "identifier": map[string]any{"type": "m.id.user", "user": user.UserID},
			"password": user.Password}
		body["auth"] = auth
		r := a1.Do(t, method, path, user.Token, body)
		if r.Status == http.StatusUnauthorized {
			if s, _ := r.Body["session"].(string); s != "" {
				auth["session"] = s
				r = a1.Do(t, method, path, user.Token, body)
			}
		}
		if r.Status != http.StatusOK {
			t.Fatalf("%s %s: %d %s", method, path, r.Status, r.Raw)
		}
	}

	for round := 0; round < 2; round++ {
		name := "u" + strconv.Itoa(round)
		alice := a1.Register(t, name, "")
		phone, laptop, tablet := a1.Login(t, alice, ""), a1.Login(t, alice, ""), a1.Login(t, alice, "")

		cached(alice.Token)
		a1.Must(t, "POST", "/_matrix/client/v3/logout", alice.Token, map[string]any{})
		refused("logout", alice.Token)

		cached(phone.Token)
		withAuth(laptop, "DELETE", "/_matrix/client/v3/devices/"+phone.DeviceID, map[string]any{})
		refused("deleting a device", phone.Token)

		cached(tablet.Token)
		withAuth(laptop, "POST", "/_matrix/client/v3/delete_devices", map[string]any{"devices": []string{tablet.DeviceID}})
		refused("delete_devices", tablet.Token)

		cached(laptop.Token)
		again := a1.Login(t, alice, laptop.DeviceID) // takes laptop over
		refused("a login taking the device over", laptop.Token)
		cached(again.Token)
		other := a1.Login(t, alice, "")
		cached(other.Token)
		withAuth(again, "POST", "/_matrix/client/v3/account/password", map[string]any{"new_password": "new-" + name})
		refused("a password change", other.Token)
		again.Password = "new-" + name

		third := a1.Login(t, again, "")
		cached(third.Token)
		a1.Must(t, "POST", "/_matrix/client/v3/logout/all", third.Token, map[string]any{})
		refused("logout/all", third.Token)
		refused("logout/all (the other device)", again.Token)

		last := a1.Login(t, again, "")
		cached(last.Token)
		withAuth(last, "POST", "/_matrix/client/v3/account/deactivate", map[string]any{})
		refused("a deactivation", last.Token)
	}
}
