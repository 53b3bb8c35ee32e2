package clientapi_test

import (
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

// queriedDevices returns the device IDs /keys/query shows u for userID.
func queriedDevices(t *testing.T, srv *testutil.Server, u *testutil.User, userID string) []string {
	t.Helper()
	r := srv.Must(t, "POST", acctV3+"/keys/query", u.Token, map[string]any{"device_keys": map[string]any{userID: []string{}}})
	devs, _ := r["device_keys"].(map[string]any)[userID].(map[string]any)
	out := []string{}
	for id := range devs {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

func TestChangePassword(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		srv.Join(t, "!room:x", alice.UserID)
		srv.Join(t, "!room:x", bob.UserID)
		phone := srv.Login(t, alice, "PHONE")
		srv.Upload(t, phone, map[string]any{"device_keys": phone.DeviceKeys(t), "one_time_keys": phone.OneTimeKeys(t, "a", 3)})
		srv.Upload(t, alice, map[string]any{"device_keys": alice.DeviceKeys(t)})
		path := acctV3 + "/account/password"
		login := func(password string) testutil.Response {
			return srv.Do(t, "POST", acctV3+"/login", "", map[string]any{"type": "m.login.password",
				"identifier": map[string]any{"type": "m.id.user", "user": "alice"}, "password": password})
		}

		// Too long, as for /register.
		acctExpectErr(t, srv.Do(t, "POST", path, alice.Token, map[string]any{"new_password": strings.Repeat("x", 513),
			"auth": acctPasswordAuth("alice", alice.Password, "")}), http.StatusBadRequest, "M_INVALID_PARAM")
		// Missing.
		acctExpectErr(t, srv.Do(t, "POST", path, alice.Token, map[string]any{"auth": acctPasswordAuth("alice", alice.Password, "")}),
			http.StatusBadRequest, "M_MISSING_PARAM")

		body := map[string]any{"new_password": "new secret"}
		session := acctExpectChallenge(t, srv.Do(t, "POST", path, alice.Token, body), "m.login.password")
		// The session is bound to the new password, which is not stored.
		rows, err := srv.Store.DB().Query(`SELECT session_id, user_id, request_hash FROM uia_sessions`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var a, b, c string
			if err := rows.Scan(&a, &b, &c); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(a+b+c, "new secret") {
				t.Errorf("the new password is stored in a session")
			}
		}
		rows.Close()
		acctExpectErr(t, srv.Do(t, "POST", path, alice.Token, map[string]any{"new_password": "another",
			"auth": acctPasswordAuth("alice", alice.Password, session)}), http.StatusForbidden, "M_FORBIDDEN")
		// The old password is checked.
		r := srv.Do(t, "POST", path, alice.Token, map[string]any{"new_password": "new secret",
			"auth": acctPasswordAuth("alice", "wrong", session)})
		acctExpectErr(t, r, http.StatusUnauthorized, "M_FORBIDDEN")
		acctExpectChallenge(t, r, "m.login.password")
		acctExpectErr(t, login("new secret"), http.StatusForbidden, "M_FORBIDDEN")

		since := syncToken(t, srv, bob)
		acctExpectEmptyOK(t, srv.Do(t, "POST", path, alice.Token, map[string]any{"new_password": "new secret",
			"auth": acctPasswordAuth("alice", alice.Password, session)}))
		acctExpectErr(t, login(alice.Password), http.StatusForbidden, "M_FORBIDDEN")
		if r := login("new secret"); r.Status != http.StatusOK {
			t.Fatalf("login with the new password: %d %s", r.Status, r.Raw)
		}
		// logout_devices defaults to true: the phone is gone with its keys,
		// the caller's device stays, and bob hears of the change.
		acctTokenDead(t, srv, phone.Token)
		acctWhoami(t, srv, alice.Token, alice.UserID, alice.DeviceID)
		if got := queriedDevices(t, srv, bob, alice.UserID); !slices.Equal(got, []string{alice.DeviceID}) {
			t.Errorf("bob sees alice's devices %v, want only %s", got, alice.DeviceID)
		}
		var keys int
		if err := srv.Store.DB().QueryRow(`SELECT COUNT(*) FROM one_time_keys WHERE device_id = 'PHONE'`).Scan(&keys); err != nil || keys != 0 {
			t.Errorf("%d one-time keys of the logged-out device left (%v)", keys, err)
		}
		if changed, _ := changesSince(t, srv, bob, since); !slices.Contains(changed, alice.UserID) {
			t.Errorf("bob's /keys/changes %v lacks alice", changed)
		}

		// logout_devices false keeps the other devices.
		laptop := srv.Login(t, &testutil.User{UserID: alice.UserID, Password: "new secret"}, "LAPTOP")
		acctExpectEmptyOK(t, srv.Do(t, "POST", path, alice.Token, map[string]any{"new_password": "third", "logout_devices": false,
			"auth": acctPasswordAuth("alice", "new secret", "")}))
		acctWhoami(t, srv, laptop.Token, alice.UserID, "LAPTOP")
		if r := login("third"); r.Status != http.StatusOK {
			t.Fatalf("login with the third password: %d %s", r.Status, r.Raw)
		}
	})
}

func TestDeactivate(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		for _, room := range []string{"!one:x", "!two:x"} {
			srv.Join(t, room, alice.UserID)
			srv.Join(t, room, bob.UserID)
		}
		phone := srv.Login(t, alice, "PHONE")
		srv.Upload(t, phone, map[string]any{"device_keys": phone.DeviceKeys(t), "one_time_keys": phone.OneTimeKeys(t, "a", 3),
			"fallback_keys": map[string]any{"signed_curve25519:f": phone.SignedKey(t, true)}})
		path := acctV3 + "/account/deactivate"

		// A /sync of bob waiting for news wakes up.
		since := syncToken(t, srv, bob)
		var wg sync.WaitGroup
		var waited testutil.Response
		wg.Add(1)
		go func() {
			defer wg.Done()
			waited = srv.Do(t, "GET", acctV3+"/sync?timeout=20000&since="+since, bob.Token, nil)
		}()
		testutil.Eventually(t, "bob's /sync to wait", func() bool { return srv.Parts.Sync.WaitingSyncs() == 1 })

		session := acctExpectChallenge(t, srv.Do(t, "POST", path, alice.Token, map[string]any{}), "m.login.password")
		r := srv.Do(t, "POST", path, alice.Token, map[string]any{"auth": acctPasswordAuth("alice", "wrong", session)})
		acctExpectErr(t, r, http.StatusUnauthorized, "M_FORBIDDEN")
		acctWhoami(t, srv, alice.Token, alice.UserID, alice.DeviceID)
		// Bound to the body's erase.
		acctExpectErr(t, srv.Do(t, "POST", path, alice.Token, map[string]any{"erase": true,
			"auth": acctPasswordAuth("alice", alice.Password, session)}), http.StatusForbidden, "M_FORBIDDEN")
		r = srv.Do(t, "POST", path, alice.Token, map[string]any{"auth": acctPasswordAuth("alice", alice.Password, session)})
		if r.Status != http.StatusOK || r.Body["id_server_unbind_result"] != "no-support" {
			t.Fatalf("deactivate: %d %s", r.Status, r.Raw)
		}
		wg.Wait()
		if waited.Status != http.StatusOK {
			t.Fatalf("bob's waiting /sync: %d %s", waited.Status, waited.Raw)
		}
		// Alice's devices went (changed), then she left the rooms (left):
		// the wait ends at the first, and either is news of alice.
		lists, _ := waited.Body["device_lists"].(map[string]any)
		if !slices.Contains(lists["changed"].([]any), any(alice.UserID)) && !slices.Contains(lists["left"].([]any), any(alice.UserID)) {
			t.Errorf("bob's /sync device_lists %v lacks alice", lists)
		}
		if _, left := changesSince(t, srv, bob, since); !slices.Contains(left, alice.UserID) {
			t.Errorf("bob's /keys/changes left %v lacks alice, who left every room", left)
		}

		acctTokenDead(t, srv, alice.Token)
		acctTokenDead(t, srv, phone.Token)
		for _, password := range []string{alice.Password, "anything"} {
			acctExpectErr(t, srv.Do(t, "POST", acctV3+"/login", "", map[string]any{"type": "m.login.password",
				"identifier": map[string]any{"type": "m.id.user", "user": alice.UserID}, "password": password}),
				http.StatusForbidden, "M_USER_DEACTIVATED")
		}
		acctExpectErr(t, srv.Do(t, "POST", acctV3+"/register", "", map[string]any{"username": "alice", "password": "pw",
			"auth": map[string]any{"type": "m.login.dummy"}}), http.StatusBadRequest, "M_USER_IN_USE")
		acctExpectErr(t, srv.Do(t, "GET", acctV3+"/register/available?username=ALICE", "", nil), http.StatusBadRequest, "M_USER_IN_USE")
		if got := queriedDevices(t, srv, bob, alice.UserID); len(got) != 0 {
			t.Errorf("bob still sees alice's devices %v", got)
		}
		for _, table := range []string{"devices", "access_tokens", "one_time_keys", "one_time_key_counts", "fallback_keys", "uia_sessions"} {
			var n int
			if err := srv.Store.DB().QueryRow(`SELECT COUNT(*) FROM `+table+` WHERE user_id = $1`, alice.UserID).Scan(&n); err != nil || n != 0 {
				t.Errorf("%s: %d rows of alice left (%v)", table, n, err)
			}
		}
		var joined int
		if err := srv.Store.DB().QueryRow(`SELECT COUNT(*) FROM memberships WHERE user_id = $1 AND membership = 'join'`,
			alice.UserID).Scan(&joined); err != nil || joined != 0 {
			t.Errorf("alice is still joined to %d rooms (%v)", joined, err)
		}
		// bob is untouched.
		acctWhoami(t, srv, bob.Token, bob.UserID, bob.DeviceID)
	})
}

func TestThreePIDsAndCapabilities(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		for _, prefix := range []string{"/_matrix/client/v3", "/_matrix/client/r0"} {
			r := srv.Must(t, "GET", prefix+"/account/3pid", alice.Token, nil)
			if list, ok := r["threepids"].([]any); !ok || len(list) != 0 {
				t.Errorf("%s/account/3pid: %v, want an empty threepids list", prefix, r)
			}
			r = srv.Must(t, "GET", prefix+"/capabilities", alice.Token, nil)
			caps, _ := r["capabilities"].(map[string]any)
			if cp, _ := caps["m.change_password"].(map[string]any); cp["enabled"] != true {
				t.Errorf("%s/capabilities: %v, want m.change_password enabled", prefix, r)
			}
		}
		acctExpectErr(t, srv.Do(t, "GET", acctV3+"/capabilities", "", nil), http.StatusUnauthorized, "M_MISSING_TOKEN")
	})
}
