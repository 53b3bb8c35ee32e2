package clientapi_test

import (
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

// uiaClock is a clock the test moves.
type uiaClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *uiaClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *uiaClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// A user-interactive auth session completes only the request it was
// started for, once, before it expires.
func TestUIASessionsBoundToRequest(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		clock := &uiaClock{now: time.Now()}
		srv := testutil.NewServer(t, db, testutil.ServerOptions{Now: clock.Now})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		devPath := func(id string) string { return acctV3 + "/devices/" + url.PathEscape(id) }
		start := func(t *testing.T, method, path, token string, body any) string {
			t.Helper()
			return acctExpectChallenge(t, srv.Do(t, method, path, token, body), "m.login.password")
		}
		pw := func(session string) map[string]any { return acctPasswordAuth("alice", alice.Password, session) }
		exists := func(t *testing.T, u *testutil.User) { t.Helper(); acctWhoami(t, srv, u.Token, u.UserID, u.DeviceID) }

		t.Run("another device", func(t *testing.T) {
			a, b := srv.Login(t, alice, ""), srv.Login(t, alice, "")
			session := start(t, "DELETE", devPath(a.DeviceID), alice.Token, nil)
			acctExpectErr(t, srv.Do(t, "DELETE", devPath(b.DeviceID), alice.Token, map[string]any{"auth": pw(session)}),
				http.StatusForbidden, "M_FORBIDDEN")
			exists(t, b)
			exists(t, a)
			// The same session named on the other endpoint for the same device.
			acctExpectErr(t, srv.Do(t, "POST", acctV3+"/delete_devices", alice.Token,
				map[string]any{"devices": []string{a.DeviceID}, "auth": pw(session)}), http.StatusForbidden, "M_FORBIDDEN")
			exists(t, a)
			// Another user's token with alice's session, for the same path.
			acctExpectErr(t, srv.Do(t, "DELETE", devPath(a.DeviceID), bob.Token,
				map[string]any{"auth": acctPasswordAuth("bob", bob.Password, session)}), http.StatusForbidden, "M_FORBIDDEN")
			exists(t, a)
			// The request it was started for still completes it.
			acctExpectEmptyOK(t, srv.Do(t, "DELETE", devPath(a.DeviceID), alice.Token, map[string]any{"auth": pw(session)}))
			acctTokenDead(t, srv, a.Token)
			exists(t, b)
		})

		t.Run("delete_devices set", func(t *testing.T) {
			a, b, c := srv.Login(t, alice, ""), srv.Login(t, alice, ""), srv.Login(t, alice, "")
			path := acctV3 + "/delete_devices"
			session := start(t, "POST", path, alice.Token, map[string]any{"devices": []string{a.DeviceID, b.DeviceID}})
			acctExpectErr(t, srv.Do(t, "POST", path, alice.Token,
				map[string]any{"devices": []string{a.DeviceID, c.DeviceID}, "auth": pw(session)}), http.StatusForbidden, "M_FORBIDDEN")
			acctExpectErr(t, srv.Do(t, "POST", path, alice.Token,
				map[string]any{"devices": []string{a.DeviceID}, "auth": pw(session)}), http.StatusForbidden, "M_FORBIDDEN")
			exists(t, a)
			exists(t, c)
			// The same set in another order is the same request.
			acctExpectEmptyOK(t, srv.Do(t, "POST", path, alice.Token,
				map[string]any{"devices": []string{b.DeviceID, a.DeviceID, b.DeviceID}, "auth": pw(session)}))
			acctTokenDead(t, srv, a.Token)
			acctTokenDead(t, srv, b.Token)
			exists(t, c)
		})

		t.Run("unknown session", func(t *testing.T) {
			a := srv.Login(t, alice, "")
			r := srv.Do(t, "DELETE", devPath(a.DeviceID), alice.Token, map[string]any{"auth": pw("nosuchsession")})
			session := acctExpectChallenge(t, r, "m.login.password")
			if session == "nosuchsession" {
				t.Fatalf("the unknown session was handed back")
			}
			exists(t, a)
			// The new session is bound to the request that got it.
			acctExpectEmptyOK(t, srv.Do(t, "DELETE", devPath(a.DeviceID), alice.Token, map[string]any{"auth": pw(session)}))
			acctTokenDead(t, srv, a.Token)
		})

		t.Run("used twice", func(t *testing.T) {
			a := srv.Login(t, alice, "")
			session := start(t, "DELETE", devPath(a.DeviceID), alice.Token, nil)
			acctExpectEmptyOK(t, srv.Do(t, "DELETE", devPath(a.DeviceID), alice.Token, map[string]any{"auth": pw(session)}))
			a2 := srv.Login(t, alice, a.DeviceID) // the same device ID again
			r := srv.Do(t, "DELETE", devPath(a.DeviceID), alice.Token, map[string]any{"auth": pw(session)})
			if again := acctExpectChallenge(t, r, "m.login.password"); again == session {
				t.Errorf("a completed session was offered again")
			}
			exists(t, a2)
		})

		t.Run("expiry", func(t *testing.T) {
			a := srv.Login(t, alice, "")
			session := start(t, "DELETE", devPath(a.DeviceID), alice.Token, nil)
			clock.Advance(31 * time.Minute)
			r := srv.Do(t, "DELETE", devPath(a.DeviceID), alice.Token, map[string]any{"auth": pw(session)})
			fresh := acctExpectChallenge(t, r, "m.login.password")
			if fresh == session {
				t.Errorf("an expired session was offered again")
			}
			exists(t, a)
			// Starting a session removed the expired ones from the database.
			var n int
			if err := srv.Store.DB().QueryRow(`SELECT COUNT(*) FROM uia_sessions WHERE session_id = $1`, session).Scan(&n); err != nil || n != 0 {
				t.Errorf("expired session rows: %d (%v), want 0", n, err)
			}
			// A session within its lifetime still works.
			clock.Advance(29 * time.Minute)
			acctExpectEmptyOK(t, srv.Do(t, "DELETE", devPath(a.DeviceID), alice.Token, map[string]any{"auth": pw(fresh)}))
		})

		t.Run("wrong password keeps the session", func(t *testing.T) {
			a := srv.Login(t, alice, "")
			session := start(t, "DELETE", devPath(a.DeviceID), alice.Token, nil)
			r := srv.Do(t, "DELETE", devPath(a.DeviceID), alice.Token,
				map[string]any{"auth": acctPasswordAuth("alice", "wrong", session)})
			if again := acctExpectChallenge(t, r, "m.login.password"); again != session {
				t.Errorf("session %q after a wrong password, want %q", again, session)
			}
			acctExpectEmptyOK(t, srv.Do(t, "DELETE", devPath(a.DeviceID), alice.Token, map[string]any{"auth": pw(session)}))
		})

		t.Run("register", func(t *testing.T) {
			path := acctV3 + "/register"
			session := acctExpectChallenge(t, srv.Do(t, "POST", path, "", map[string]any{}), "m.login.dummy")
			dummy := map[string]any{"type": "m.login.dummy", "session": session}
			r := srv.Do(t, "POST", path, "", map[string]any{"username": "carol", "password": "pw-carol", "auth": dummy})
			if r.Status != http.StatusOK || r.Body["user_id"] != "@carol:"+srv.ServerName {
				t.Fatalf("register in the session: %d %s", r.Status, r.Raw)
			}
			// Completed: not a second time.
			r = srv.Do(t, "POST", path, "", map[string]any{"username": "dave", "password": "pw-dave", "auth": dummy})
			if again := acctExpectChallenge(t, r, "m.login.dummy"); again == session {
				t.Errorf("a completed registration session was offered again")
			}
			// A session of a device deletion does not register.
			a := srv.Login(t, alice, "")
			other := start(t, "DELETE", devPath(a.DeviceID), alice.Token, nil)
			acctExpectErr(t, srv.Do(t, "POST", path, "", map[string]any{"username": "erin", "password": "pw-erin",
				"auth": map[string]any{"type": "m.login.dummy", "session": other}}), http.StatusForbidden, "M_FORBIDDEN")
			// Nor does a registration session delete a device.
			reg := acctExpectChallenge(t, srv.Do(t, "POST", path, "", map[string]any{}), "m.login.dummy")
			acctExpectErr(t, srv.Do(t, "DELETE", devPath(a.DeviceID), alice.Token, map[string]any{"auth": pw(reg)}),
				http.StatusForbidden, "M_FORBIDDEN")
			exists(t, a)
		})
	})
}

// A session started on one daemon completes on another sharing its
// database.
func TestUIASessionSharedDatabase(t *testing.T) {
	db := testutil.Postgres(t)
	n1 := testutil.StartNode(t, db, nil)
	n2 := testutil.StartNode(t, db, func(c *config.Config) { c.ServerName = n1.ServerName })
	alice := n1.Register(t, "alice", "")
	a := n1.Login(t, alice, "")
	path := acctV3 + "/devices/" + a.DeviceID
	session := acctExpectChallenge(t, n1.Do(t, "DELETE", path, alice.Token, nil), "m.login.password")
	acctExpectEmptyOK(t, n2.Do(t, "DELETE", path, alice.Token,
		map[string]any{"auth": acctPasswordAuth("alice", alice.Password, session)}))
	acctTokenDead(t, n1.Server, a.Token)
}
