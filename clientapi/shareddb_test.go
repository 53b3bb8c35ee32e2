package clientapi_test

import (
	"database/sql"
	"net/http"
	"testing"
	"time"

	"github.com/keyserver/keyserver/config"
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
