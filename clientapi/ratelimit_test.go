package clientapi_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/testutil"
)

// acctExpectLimited checks a 429 M_LIMIT_EXCEEDED with a positive
// retry_after_ms.
func acctExpectLimited(t *testing.T, r testutil.Response) {
	t.Helper()
	acctExpectErr(t, r, http.StatusTooManyRequests, "M_LIMIT_EXCEEDED")
	if ms, _ := r.Body["retry_after_ms"].(float64); ms <= 0 {
		t.Errorf("retry_after_ms %v, want a positive number (body %s)", r.Body["retry_after_ms"], r.Raw)
	}
}

func TestLoginAndRegistrationLimitsPerAddress(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		clock := &uiaClock{now: time.Now()}
		srv := testutil.NewServer(t, db, testutil.ServerOptions{Now: clock.Now,
			Login: testutil.RateLimit{PerSecond: 0.1, Burst: 3}, Register: testutil.RateLimit{PerSecond: 0.1, Burst: 4}})
		// Two requests each, the flows and then the registration: only the
		// registrations count, so the burst makes four accounts.
		for _, name := range []string{"alice", "bob", "dave", "erin"} {
			acctExpectChallenge(t, srv.Do(t, "POST", acctV3+"/register", "", map[string]any{}), "m.login.dummy")
			srv.Register(t, name, "")
		}
		// Once it is spent, the challenge is refused too.
		acctExpectLimited(t, srv.Do(t, "POST", acctV3+"/register", "", map[string]any{}))
		acctExpectLimited(t, srv.Do(t, "POST", acctV3+"/register", "", map[string]any{"username": "carol", "password": "pw",
			"auth": map[string]any{"type": "m.login.dummy"}}))
		if r := srv.Do(t, "GET", acctV3+"/register/available?username=carol", "", nil); r.Status != http.StatusOK {
			t.Errorf("carol was registered while limited: %d %s", r.Status, r.Raw)
		}

		login := func(user, password string) testutil.Response {
			return srv.Do(t, "POST", acctV3+"/login", "", map[string]any{"type": "m.login.password",
				"identifier": map[string]any{"type": "m.id.user", "user": user}, "password": password})
		}
		for i := 0; i < 3; i++ {
			if r := login("alice", "pw-alice"); r.Status != http.StatusOK {
				t.Fatalf("login %d within the burst: %d %s", i, r.Status, r.Raw)
			}
		}
		r := login("bob", "pw-bob") // another account, the same address
		acctExpectLimited(t, r)
		// The wait is in the header too.
		req, _ := http.NewRequest("POST", srv.URL+acctV3+"/login", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
			t.Errorf("status %d, Retry-After %q; want 429 with the header", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		// Tokens come back at the rate.
		clock.Advance(10 * time.Second)
		if r := login("bob", "pw-bob"); r.Status != http.StatusOK {
			t.Errorf("login after the wait: %d %s", r.Status, r.Raw)
		}
	})
}

// Wrong passwords are limited per account: once over, even the right
// password is refused until the wait is over, as Synapse does, so that
// guessing on gains nothing. Other accounts are not affected.
func TestFailedLoginLimitPerAccount(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		clock := &uiaClock{now: time.Now()}
		srv := testutil.NewServer(t, db, testutil.ServerOptions{Now: clock.Now,
			FailedLogins: testutil.RateLimit{PerSecond: 0.1, Burst: 3}})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		login := func(user, password string) testutil.Response {
			return srv.Do(t, "POST", acctV3+"/login", "", map[string]any{"type": "m.login.password",
				"identifier": map[string]any{"type": "m.id.user", "user": user}, "password": password})
		}
		// Right passwords do not count.
		for i := 0; i < 5; i++ {
			if r := login("alice", alice.Password); r.Status != http.StatusOK {
				t.Fatalf("login %d: %d %s", i, r.Status, r.Raw)
			}
		}
		for i := 0; i < 3; i++ {
			acctExpectErr(t, login("alice", "guess"), http.StatusForbidden, "M_FORBIDDEN")
		}
		acctExpectLimited(t, login("alice", "guess"))
		acctExpectLimited(t, login("@ALICE:"+srv.ServerName, alice.Password)) // the account, however named
		// The password stage of user-interactive auth is the same guess.
		r := srv.Do(t, "DELETE", acctV3+"/devices/"+alice.DeviceID, alice.Token,
			map[string]any{"auth": acctPasswordAuth("alice", alice.Password, "")})
		acctExpectLimited(t, r)
		acctWhoami(t, srv, alice.Token, alice.UserID, alice.DeviceID)
		if r := login("bob", bob.Password); r.Status != http.StatusOK {
			t.Errorf("another account: %d %s", r.Status, r.Raw)
		}
		// Unknown users are limited the same way.
		for i := 0; i < 3; i++ {
			acctExpectErr(t, login("nobody", "guess"), http.StatusForbidden, "M_FORBIDDEN")
		}
		acctExpectLimited(t, login("nobody", "guess"))
		clock.Advance(10 * time.Second)
		if r := login("alice", alice.Password); r.Status != http.StatusOK {
			t.Errorf("login after the wait: %d %s", r.Status, r.Raw)
		}
	})
}
