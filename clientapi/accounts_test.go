package clientapi_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

// The helpers of this file carry the prefix "acct" so that they do not
// clash with helpers of other test files of the package.

const acctV3 = "/_matrix/client/v3"

// acctExpectErr checks an error answer: its status, its errcode, and that
// the body carries both errcode and error as strings (spec §1.2).
func acctExpectErr(t *testing.T, r testutil.Response, status int, errcode string) {
	t.Helper()
	if r.Status != status {
		t.Errorf("status %d, want %d (body %s)", r.Status, status, r.Raw)
	}
	ec, ok := r.Body["errcode"].(string)
	if !ok || ec != errcode {
		t.Errorf("errcode %v, want %q (body %s)", r.Body["errcode"], errcode, r.Raw)
	}
	if _, ok := r.Body["error"].(string); !ok {
		t.Errorf("error message missing or not a string (body %s)", r.Raw)
	}
}

// acctExpectEmptyOK checks a 200 {} answer.
func acctExpectEmptyOK(t *testing.T, r testutil.Response) {
	t.Helper()
	if r.Status != http.StatusOK {
		t.Errorf("status %d, want 200 (body %s)", r.Status, r.Raw)
		return
	}
	if len(r.Body) != 0 {
		t.Errorf("body %s, want {}", r.Raw)
	}
}

// acctExpectChallenge checks a user-interactive auth challenge offering the
// single stage, and returns its session.
func acctExpectChallenge(t *testing.T, r testutil.Response, stage string) string {
	t.Helper()
	if r.Status != http.StatusUnauthorized {
		t.Errorf("status %d, want 401 (body %s)", r.Status, r.Raw)
	}
	flows, ok := r.Body["flows"].([]any)
	if !ok || len(flows) != 1 {
		t.Errorf("flows %v, want exactly one flow (body %s)", r.Body["flows"], r.Raw)
	} else {
		flow, _ := flows[0].(map[string]any)
		stages, _ := flow["stages"].([]any)
		if len(stages) != 1 || stages[0] != stage {
			t.Errorf("flows[0].stages %v, want [%q] (body %s)", flow["stages"], stage, r.Raw)
		}
	}
	if params, ok := r.Body["params"].(map[string]any); !ok || len(params) != 0 {
		t.Errorf("params %v, want {} (body %s)", r.Body["params"], r.Raw)
	}
	session, _ := r.Body["session"].(string)
	if session == "" {
		t.Errorf("session %v, want a non-empty string (body %s)", r.Body["session"], r.Raw)
	}
	if completed, ok := r.Body["completed"].([]any); !ok || len(completed) != 0 {
		t.Errorf("completed %v, want [] (body %s)", r.Body["completed"], r.Raw)
	}
	return session
}

// acctDevices returns the caller's devices by ID, as GET /devices lists them.
func acctDevices(t *testing.T, srv *testutil.Server, token string) map[string]map[string]any {
	t.Helper()
	body := srv.Must(t, "GET", acctV3+"/devices", token, nil)
	list, ok := body["devices"].([]any)
	if !ok {
		t.Fatalf("GET /devices: devices is %T, want an array: %v", body["devices"], body)
	}
	out := map[string]map[string]any{}
	for _, d := range list {
		dev, ok := d.(map[string]any)
		if !ok {
			t.Fatalf("GET /devices: entry %v is not an object", d)
		}
		id, ok := dev["device_id"].(string)
		if !ok || id == "" {
			t.Fatalf("GET /devices: entry without device_id: %v", dev)
		}
		if _, dup := out[id]; dup {
			t.Fatalf("GET /devices: device %s listed twice", id)
		}
		out[id] = dev
	}
	return out
}

// acctDeviceIDs returns the sorted IDs of the caller's devices.
func acctDeviceIDs(t *testing.T, srv *testutil.Server, token string) []string {
	t.Helper()
	var ids []string
	for id := range acctDevices(t, srv, token) {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func acctSameIDs(got []string, want ...string) bool {
	w := append([]string(nil), want...)
	sort.Strings(w)
	if len(got) != len(w) {
		return false
	}
	for i := range got {
		if got[i] != w[i] {
			return false
		}
	}
	return true
}

// acctWhoami checks that the token is valid for the user and device.
func acctWhoami(t *testing.T, srv *testutil.Server, token, userID, deviceID string) {
	t.Helper()
	r := srv.Do(t, "GET", acctV3+"/account/whoami", token, nil)
	if r.Status != http.StatusOK {
		t.Errorf("whoami: status %d, want 200 (body %s)", r.Status, r.Raw)
		return
	}
	if r.Body["user_id"] != userID || r.Body["device_id"] != deviceID {
		t.Errorf("whoami: %s, want user %s device %s", r.Raw, userID, deviceID)
	}
}

// acctTokenDead checks that the token is refused as unknown.
func acctTokenDead(t *testing.T, srv *testutil.Server, token string) {
	t.Helper()
	acctExpectErr(t, srv.Do(t, "GET", acctV3+"/account/whoami", token, nil), http.StatusUnauthorized, "M_UNKNOWN_TOKEN")
}

// acctRaw sends a request without the helpers of testutil, for the headers
// and for bodies of unknown length.
func acctRaw(t *testing.T, method, url string, body io.Reader, header map[string]string) (int, http.Header, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: answer is not a JSON object (%d): %s", method, url, resp.StatusCode, raw)
	}
	return resp.StatusCode, resp.Header, out
}

func acctPasswordAuth(user, password, session string) map[string]any {
	a := map[string]any{
		"type":       "m.login.password",
		"identifier": map[string]any{"type": "m.id.user", "user": user},
		"password":   password,
	}
	if session != "" {
		a["session"] = session
	}
	return a
}

func acctLocalpart(userID string) string {
	return strings.TrimPrefix(userID[:strings.IndexByte(userID, ':')], "@")
}

func TestHTTPConventions(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")

		t.Run("versions", func(t *testing.T) {
			body := srv.Must(t, "GET", "/_matrix/client/versions", "", nil)
			versions, ok := body["versions"].([]any)
			if !ok {
				t.Fatalf("versions is %T: %v", body["versions"], body)
			}
			found := false
			for _, v := range versions {
				if v == "v1.19" {
					found = true
				}
			}
			if !found {
				t.Errorf("versions %v do not list v1.19", versions)
			}
			if _, ok := body["unstable_features"].(map[string]any); !ok {
				t.Errorf("unstable_features is %T, want an object", body["unstable_features"])
			}
		})

		t.Run("errors", func(t *testing.T) {
			pw := map[string]any{"type": "m.login.password", "identifier": map[string]any{"type": "m.id.user", "user": "alice"}, "password": 5}
			cases := []struct {
				name, method, path, token string
				body                      any
				status                    int
				errcode                   string
			}{
				{"unknown client path", "GET", acctV3 + "/no/such/endpoint", "", nil, 404, "M_UNRECOGNIZED"},
				{"unknown path with token", "POST", acctV3 + "/nonexistent", alice.Token, map[string]any{}, 404, "M_UNRECOGNIZED"},
				{"unknown matrix path", "GET", "/_matrix/nothing", "", nil, 404, "M_UNRECOGNIZED"},
				{"GET keys/query", "GET", acctV3 + "/keys/query", alice.Token, nil, 405, "M_UNRECOGNIZED"},
				{"DELETE login", "DELETE", acctV3 + "/login", "", nil, 405, "M_UNRECOGNIZED"},
				{"POST versions", "POST", "/_matrix/client/versions", "", map[string]any{}, 405, "M_UNRECOGNIZED"},
				{"PUT whoami r0", "PUT", "/_matrix/client/r0/account/whoami", alice.Token, map[string]any{}, 405, "M_UNRECOGNIZED"},
				// Room paths have a router of their own (splitRouter): the same answers.
				{"GET send", "GET", acctV3 + "/rooms/!r:x/send/m.room.message/t1", alice.Token, nil, 405, "M_UNRECOGNIZED"},
				{"POST members r0", "POST", "/_matrix/client/r0/rooms/!r:x/members", alice.Token, map[string]any{}, 405, "M_UNRECOGNIZED"},
				{"unknown room path", "GET", acctV3 + "/rooms/!r:x/no/such/endpoint", alice.Token, nil, 404, "M_UNRECOGNIZED"},
				{"rooms without a room", "GET", acctV3 + "/rooms/", alice.Token, nil, 404, "M_UNRECOGNIZED"},
				{"not JSON", "POST", acctV3 + "/login", "", "this is not json", 400, "M_NOT_JSON"},
				{"truncated JSON", "POST", acctV3 + "/login", "", `{"type": "m.login.password"`, 400, "M_NOT_JSON"},
				{"not JSON register", "POST", acctV3 + "/register", "", "{username: alice}", 400, "M_NOT_JSON"},
				{"not JSON authed", "POST", acctV3 + "/keys/query", alice.Token, "<xml/>", 400, "M_NOT_JSON"},
				{"JSON array", "POST", acctV3 + "/login", "", `[{"type":"m.login.password"}]`, 400, "M_BAD_JSON"},
				{"JSON string", "POST", acctV3 + "/login", "", `"m.login.password"`, 400, "M_BAD_JSON"},
				{"JSON number", "POST", acctV3 + "/register", "", `42`, 400, "M_BAD_JSON"},
				{"JSON array authed", "POST", acctV3 + "/keys/query", alice.Token, `[]`, 400, "M_BAD_JSON"},
				{"password is a number", "POST", acctV3 + "/login", "", pw, 400, "M_BAD_JSON"},
				{"type is an object", "POST", acctV3 + "/login", "", map[string]any{"type": map[string]any{}}, 400, "M_BAD_JSON"},
				{"devices is a string", "POST", acctV3 + "/delete_devices", alice.Token, map[string]any{"devices": alice.DeviceID}, 400, "M_BAD_JSON"},
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					acctExpectErr(t, srv.Do(t, c.method, c.path, c.token, c.body), c.status, c.errcode)
				})
			}
			// None of the refused requests changed anything.
			if ids := acctDeviceIDs(t, srv, alice.Token); !acctSameIDs(ids, alice.DeviceID) {
				t.Errorf("devices after refused requests: %v, want [%s]", ids, alice.DeviceID)
			}
		})

		t.Run("CORS", func(t *testing.T) {
			paths := []string{
				"/_matrix/client/versions",
				acctV3 + "/keys/query",
				acctV3 + "/devices/" + alice.DeviceID,
				acctV3 + "/logout",
				"/_matrix/client/r0/login",
				acctV3 + "/no/such/endpoint",
			}
			for _, p := range paths {
				t.Run("OPTIONS "+p, func(t *testing.T) {
					status, h, _ := acctRaw(t, "OPTIONS", srv.URL+p, nil, map[string]string{
						"Authorization":                  "Bearer " + alice.Token,
						"Origin":                         "https://app.example",
						"Access-Control-Request-Method":  "POST",
						"Access-Control-Request-Headers": "Authorization, Content-Type",
					})
					if status != http.StatusOK {
						t.Errorf("status %d, want 200", status)
					}
					if got := h.Get("Access-Control-Allow-Origin"); got != "*" {
						t.Errorf("Access-Control-Allow-Origin %q, want *", got)
					}
					for _, m := range []string{"GET", "POST", "PUT", "DELETE", "OPTIONS"} {
						if !strings.Contains(h.Get("Access-Control-Allow-Methods"), m) {
							t.Errorf("Access-Control-Allow-Methods %q lacks %s", h.Get("Access-Control-Allow-Methods"), m)
						}
					}
					if !strings.Contains(strings.ToLower(h.Get("Access-Control-Allow-Headers")), "authorization") {
						t.Errorf("Access-Control-Allow-Headers %q lacks Authorization", h.Get("Access-Control-Allow-Headers"))
					}
				})
			}
			// OPTIONS /logout did not run the endpoint: the token still works.
			acctWhoami(t, srv, alice.Token, alice.UserID, alice.DeviceID)

			// Ordinary answers, errors included, carry the header too.
			for _, p := range []string{"/_matrix/client/versions", acctV3 + "/account/whoami"} {
				status, h, _ := acctRaw(t, "GET", srv.URL+p, nil, nil)
				if got := h.Get("Access-Control-Allow-Origin"); got != "*" {
					t.Errorf("GET %s (%d): Access-Control-Allow-Origin %q, want *", p, status, got)
				}
				if ct := h.Get("Content-Type"); ct != "application/json" {
					t.Errorf("GET %s: Content-Type %q, want application/json", p, ct)
				}
			}
		})

		t.Run("body cap", func(t *testing.T) {
			small := testutil.NewServer(t, db, testutil.ServerOptions{MaxRequestBytes: 2048})
			bob := small.Register(t, "bob", "")
			big := `{"type":"m.login.password","identifier":{"type":"m.id.user","user":"bob"},"password":"` + bob.Password +
				`","pad":"` + strings.Repeat("x", 4096) + `"}`
			acctExpectErr(t, small.Do(t, "POST", acctV3+"/login", "", big), http.StatusRequestEntityTooLarge, "M_TOO_LARGE")

			// Without a Content-Length (chunked) the cap holds as well.
			status, _, body := acctRaw(t, "POST", small.URL+acctV3+"/login", io.MultiReader(strings.NewReader(big)), nil)
			if status != http.StatusRequestEntityTooLarge || body["errcode"] != "M_TOO_LARGE" {
				t.Errorf("chunked 4 KiB body: %d %v, want 413 M_TOO_LARGE", status, body)
			}
			if _, ok := body["error"].(string); !ok {
				t.Errorf("chunked 4 KiB body: no error string in %v", body)
			}
			if ids := acctDeviceIDs(t, small, bob.Token); !acctSameIDs(ids, bob.DeviceID) {
				t.Errorf("devices after refused logins: %v, want [%s]", ids, bob.DeviceID)
			}

			// A body under the cap passes.
			ok := `{"type":"m.login.password","identifier":{"type":"m.id.user","user":"bob"},"password":"` + bob.Password +
				`","pad":"` + strings.Repeat("x", 1024) + `"}`
			r := small.Do(t, "POST", acctV3+"/login", "", ok)
			if r.Status != http.StatusOK || r.Body["user_id"] != bob.UserID {
				t.Errorf("1 KiB body: %d %s, want 200 for %s", r.Status, r.Raw, bob.UserID)
			}

			// The same 4 KiB body is fine on the default server (1 MiB cap),
			// which shares the database and so knows bob.
			if r := srv.Do(t, "POST", acctV3+"/login", "", big); r.Status != http.StatusOK || r.Body["user_id"] != bob.UserID {
				t.Errorf("4 KiB body on the default server: %d %s, want 200 for %s", r.Status, r.Raw, bob.UserID)
			}
		})

		t.Run("r0 prefix", func(t *testing.T) {
			r := srv.Do(t, "GET", "/_matrix/client/r0/account/whoami", alice.Token, nil)
			if r.Status != http.StatusOK || r.Body["user_id"] != alice.UserID || r.Body["device_id"] != alice.DeviceID {
				t.Errorf("r0 whoami: %d %s, want 200 %s/%s", r.Status, r.Raw, alice.UserID, alice.DeviceID)
			}
			acctExpectErr(t, srv.Do(t, "GET", "/_matrix/client/r0/account/whoami", "", nil), http.StatusUnauthorized, "M_MISSING_TOKEN")
			lr := srv.Do(t, "POST", "/_matrix/client/r0/login", "", map[string]any{
				"type": "m.login.password", "identifier": map[string]any{"type": "m.id.user", "user": "alice"}, "password": alice.Password,
			})
			if lr.Status != http.StatusOK || lr.Body["user_id"] != alice.UserID {
				t.Errorf("r0 login: %d %s", lr.Status, lr.Raw)
			}
		})
	})
}

func TestAccountsRegister(t *testing.T) {
	userIDRe := regexp.MustCompile(`^@[a-z0-9._=\-/+]+:test\.local$`)
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		reg := acctV3 + "/register"
		available := func(t *testing.T, name string) {
			t.Helper()
			r := srv.Do(t, "GET", acctV3+"/register/available?username="+url.QueryEscape(name), "", nil)
			if r.Status != http.StatusOK || r.Body["available"] != true {
				t.Errorf("available(%q): %d %s, want 200 {available: true}", name, r.Status, r.Raw)
			}
		}
		login := func(t *testing.T, user, password string) testutil.Response {
			t.Helper()
			return srv.Do(t, "POST", acctV3+"/login", "", map[string]any{
				"type": "m.login.password", "identifier": map[string]any{"type": "m.id.user", "user": user}, "password": password,
			})
		}
		var alice struct{ userID, token, deviceID string }

		t.Run("dummy flow", func(t *testing.T) {
			r := srv.Do(t, "POST", reg, "", map[string]any{"username": "alice", "password": "s3cret"})
			session := acctExpectChallenge(t, r, "m.login.dummy")
			if _, ok := r.Body["errcode"]; ok {
				t.Errorf("first challenge carries an errcode: %s", r.Raw)
			}
			available(t, "alice") // the challenge created nothing

			r = srv.Do(t, "POST", reg, "", map[string]any{"username": "alice", "password": "s3cret",
				"auth": map[string]any{"type": "m.login.dummy", "session": session}})
			if r.Status != http.StatusOK {
				t.Fatalf("register: %d %s", r.Status, r.Raw)
			}
			alice.userID, _ = r.Body["user_id"].(string)
			alice.token, _ = r.Body["access_token"].(string)
			alice.deviceID, _ = r.Body["device_id"].(string)
			if alice.userID != "@alice:test.local" || alice.token == "" || alice.deviceID == "" {
				t.Fatalf("register: %s, want user_id @alice:test.local, access_token and device_id", r.Raw)
			}
			acctWhoami(t, srv, alice.token, alice.userID, alice.deviceID)
			if ids := acctDeviceIDs(t, srv, alice.token); !acctSameIDs(ids, alice.deviceID) {
				t.Errorf("devices %v, want [%s]", ids, alice.deviceID)
			}
		})

		// Clients (Element, Complement's "POST {} returns a set of flows")
		// discover the flows with an empty request: every field is optional
		// and the first auth-less request MUST be answered 401 (spec §4.2).
		t.Run("challenge without username or password", func(t *testing.T) {
			for _, body := range []any{map[string]any{"password": "pw"}, map[string]any{}, map[string]any{"username": "zed"}, nil} {
				r := srv.Do(t, "POST", reg, "", body)
				acctExpectChallenge(t, r, "m.login.dummy")
			}
			available(t, "zed")
		})

		t.Run("dummy without session", func(t *testing.T) {
			r := srv.Do(t, "POST", reg, "", map[string]any{"username": "carol", "password": "pw",
				"auth": map[string]any{"type": "m.login.dummy"}})
			if r.Status != http.StatusOK || r.Body["user_id"] != "@carol:test.local" {
				t.Fatalf("register: %d %s, want 200 @carol:test.local", r.Status, r.Raw)
			}
			tok, _ := r.Body["access_token"].(string)
			dev, _ := r.Body["device_id"].(string)
			acctWhoami(t, srv, tok, "@carol:test.local", dev)
		})

		t.Run("username lower-cased", func(t *testing.T) {
			u := srv.Register(t, "Bob", "")
			if u.UserID != "@bob:test.local" {
				t.Errorf("user_id %s, want @bob:test.local", u.UserID)
			}
			if r := login(t, "bob", "pw-Bob"); r.Status != http.StatusOK || r.Body["user_id"] != "@bob:test.local" {
				t.Errorf("login as bob: %d %s", r.Status, r.Raw)
			}
		})

		t.Run("username taken", func(t *testing.T) {
			for _, name := range []string{"alice", "ALICE", "Alice"} {
				for _, withAuth := range []bool{false, true} {
					body := map[string]any{"username": name, "password": "other"}
					if withAuth {
						body["auth"] = map[string]any{"type": "m.login.dummy"}
					}
					r := srv.Do(t, "POST", reg, "", body)
					acctExpectErr(t, r, http.StatusBadRequest, "M_USER_IN_USE")
					if _, ok := r.Body["flows"]; ok {
						t.Errorf("%q (auth %v): the refusal is a UIA challenge: %s", name, withAuth, r.Raw)
					}
				}
			}
			// Alice's account is untouched: old token and password still work,
			// the other password does not.
			acctWhoami(t, srv, alice.token, alice.userID, alice.deviceID)
			if r := login(t, "alice", "s3cret"); r.Status != http.StatusOK {
				t.Errorf("login with the original password: %d %s", r.Status, r.Raw)
			}
			acctExpectErr(t, login(t, "alice", "other"), http.StatusForbidden, "M_FORBIDDEN")
		})

		t.Run("invalid username", func(t *testing.T) {
			// A NUL in any string of a body is refused before anything looks
			// at it, as M_BAD_JSON.
			acctExpectErr(t, srv.Do(t, "POST", reg, "", map[string]any{"username": "\x00", "password": "pw"}),
				http.StatusBadRequest, "M_BAD_JSON")
			for _, name := range []string{"al ice", "al:ice", "é", "", "al@ice", "alice!"} {
				for _, withAuth := range []bool{false, true} {
					t.Run(fmt.Sprintf("%q auth=%v", name, withAuth), func(t *testing.T) {
						body := map[string]any{"username": name, "password": "pw"}
						if withAuth {
							body["auth"] = map[string]any{"type": "m.login.dummy"}
						}
						acctExpectErr(t, srv.Do(t, "POST", reg, "", body), http.StatusBadRequest, "M_INVALID_USERNAME")
					})
				}
			}
			// A user ID longer than 255 bytes is refused too.
			long := strings.Repeat("a", 255-len("@:test.local")+1)
			acctExpectErr(t, srv.Do(t, "POST", reg, "", map[string]any{"username": long, "password": "pw",
				"auth": map[string]any{"type": "m.login.dummy"}}), http.StatusBadRequest, "M_INVALID_USERNAME")
			// All valid characters are accepted.
			u := srv.Register(t, "a-z.0_9=/+", "")
			if u.UserID != "@a-z.0_9=/+:test.local" {
				t.Errorf("user_id %s, want @a-z.0_9=/+:test.local", u.UserID)
			}
		})

		t.Run("missing password", func(t *testing.T) {
			acctExpectErr(t, srv.Do(t, "POST", reg, "", map[string]any{"username": "dan",
				"auth": map[string]any{"type": "m.login.dummy"}}), http.StatusBadRequest, "M_MISSING_PARAM")
			available(t, "dan")
		})

		t.Run("device_id", func(t *testing.T) {
			u := srv.Register(t, "dave", "DAVEPHONE")
			if u.DeviceID != "DAVEPHONE" {
				t.Errorf("device_id %s, want DAVEPHONE", u.DeviceID)
			}
			acctWhoami(t, srv, u.Token, "@dave:test.local", "DAVEPHONE")
			if ids := acctDeviceIDs(t, srv, u.Token); !acctSameIDs(ids, "DAVEPHONE") {
				t.Errorf("devices %v, want [DAVEPHONE]", ids)
			}
			// 255 characters of the unreserved set are accepted.
			long := strings.Repeat("a-b.c_d~E9", 25) + "abcde"
			u2 := srv.Register(t, "dave2", long)
			if u2.DeviceID != long {
				t.Errorf("device_id %q, want the 255-character one", u2.DeviceID)
			}
		})

		t.Run("invalid device_id", func(t *testing.T) {
			for _, id := range []string{"bad/id", "has space", strings.Repeat("A", 256), "", "ÉCRAN", "a:b"} {
				t.Run(fmt.Sprintf("%.20q", id), func(t *testing.T) {
					acctExpectErr(t, srv.Do(t, "POST", reg, "", map[string]any{"username": "eve", "password": "pw", "device_id": id,
						"auth": map[string]any{"type": "m.login.dummy"}}), http.StatusBadRequest, "M_INVALID_PARAM")
				})
			}
			available(t, "eve")
		})

		t.Run("initial_device_display_name", func(t *testing.T) {
			r := srv.Do(t, "POST", reg, "", map[string]any{"username": "erin", "password": "pw",
				"initial_device_display_name": "Erin's laptop", "auth": map[string]any{"type": "m.login.dummy"}})
			if r.Status != http.StatusOK {
				t.Fatalf("register: %d %s", r.Status, r.Raw)
			}
			tok, _ := r.Body["access_token"].(string)
			dev, _ := r.Body["device_id"].(string)
			devs := acctDevices(t, srv, tok)
			if len(devs) != 1 || devs[dev] == nil || devs[dev]["display_name"] != "Erin's laptop" {
				t.Errorf("devices %v, want %s named Erin's laptop", devs, dev)
			}
			one := srv.Must(t, "GET", acctV3+"/devices/"+dev, tok, nil)
			if one["device_id"] != dev || one["display_name"] != "Erin's laptop" {
				t.Errorf("GET /devices/%s: %v", dev, one)
			}
			// Longer than 100 characters: refused, and nothing is created.
			acctExpectErr(t, srv.Do(t, "POST", reg, "", map[string]any{"username": "erin2", "password": "pw",
				"initial_device_display_name": strings.Repeat("é", 101), "auth": map[string]any{"type": "m.login.dummy"}}),
				http.StatusBadRequest, "M_INVALID_PARAM")
			available(t, "erin2")
		})

		t.Run("inhibit_login", func(t *testing.T) {
			r := srv.Do(t, "POST", reg, "", map[string]any{"username": "frank", "password": "pw", "inhibit_login": true,
				"auth": map[string]any{"type": "m.login.dummy"}})
			if r.Status != http.StatusOK || r.Body["user_id"] != "@frank:test.local" {
				t.Fatalf("register: %d %s, want 200 @frank:test.local", r.Status, r.Raw)
			}
			for _, k := range []string{"access_token", "device_id"} {
				if _, ok := r.Body[k]; ok {
					t.Errorf("inhibited registration returned %s: %s", k, r.Raw)
				}
			}
			lr := login(t, "frank", "pw")
			if lr.Status != http.StatusOK || lr.Body["user_id"] != "@frank:test.local" {
				t.Fatalf("login after inhibited registration: %d %s", lr.Status, lr.Raw)
			}
			tok, _ := lr.Body["access_token"].(string)
			dev, _ := lr.Body["device_id"].(string)
			if ids := acctDeviceIDs(t, srv, tok); !acctSameIDs(ids, dev) {
				t.Errorf("devices %v, want only the login's %s (the registration made none)", ids, dev)
			}
			acctExpectErr(t, srv.Do(t, "GET", acctV3+"/register/available?username=frank", "", nil), http.StatusBadRequest, "M_USER_IN_USE")
		})

		t.Run("guest", func(t *testing.T) {
			for _, withAuth := range []bool{false, true} {
				body := map[string]any{"username": "gus", "password": "pw"}
				if withAuth {
					body["auth"] = map[string]any{"type": "m.login.dummy"}
				}
				acctExpectErr(t, srv.Do(t, "POST", reg+"?kind=guest", "", body), http.StatusForbidden, "M_FORBIDDEN")
			}
			available(t, "gus")
			// kind=user is the default and explicit use works.
			r := srv.Do(t, "POST", reg+"?kind=user", "", map[string]any{"username": "gus", "password": "pw",
				"auth": map[string]any{"type": "m.login.dummy"}})
			if r.Status != http.StatusOK || r.Body["user_id"] != "@gus:test.local" {
				t.Errorf("kind=user: %d %s", r.Status, r.Raw)
			}
		})

		t.Run("registration closed", func(t *testing.T) {
			closed := testutil.NewServer(t, db, testutil.ServerOptions{RegistrationClosed: true})
			for _, withAuth := range []bool{false, true} {
				body := map[string]any{"username": "henry", "password": "pw"}
				if withAuth {
					body["auth"] = map[string]any{"type": "m.login.dummy"}
				}
				acctExpectErr(t, closed.Do(t, "POST", reg, "", body), http.StatusForbidden, "M_FORBIDDEN")
			}
			// Nothing was created: henry cannot log in.
			acctExpectErr(t, closed.Do(t, "POST", acctV3+"/login", "", map[string]any{"type": "m.login.password",
				"identifier": map[string]any{"type": "m.id.user", "user": "henry"}, "password": "pw"}), http.StatusForbidden, "M_FORBIDDEN")
		})

		t.Run("available", func(t *testing.T) {
			available(t, "x")
			srv.Register(t, "x", "")
			acctExpectErr(t, srv.Do(t, "GET", acctV3+"/register/available?username=x", "", nil), http.StatusBadRequest, "M_USER_IN_USE")
			acctExpectErr(t, srv.Do(t, "GET", acctV3+"/register/available?username=X", "", nil), http.StatusBadRequest, "M_USER_IN_USE")
			acctExpectErr(t, srv.Do(t, "GET", acctV3+"/register/available?username="+url.QueryEscape("al ice"), "", nil),
				http.StatusBadRequest, "M_INVALID_USERNAME")
		})

		t.Run("generated username", func(t *testing.T) {
			seen := map[string]bool{}
			for i := 0; i < 2; i++ {
				r := srv.Do(t, "POST", reg, "", map[string]any{"password": "pw", "auth": map[string]any{"type": "m.login.dummy"}})
				if r.Status != http.StatusOK {
					t.Fatalf("register without username: %d %s", r.Status, r.Raw)
				}
				id, _ := r.Body["user_id"].(string)
				if !userIDRe.MatchString(id) || len(id) > 255 {
					t.Errorf("generated user_id %q is not a valid user ID of test.local", id)
				}
				if seen[id] {
					t.Errorf("user_id %s generated twice", id)
				}
				seen[id] = true
				tok, _ := r.Body["access_token"].(string)
				dev, _ := r.Body["device_id"].(string)
				acctWhoami(t, srv, tok, id, dev)
				if lr := login(t, id, "pw"); lr.Status != http.StatusOK || lr.Body["user_id"] != id {
					t.Errorf("login as generated %s: %d %s", id, lr.Status, lr.Raw)
				}
			}
		})
	})
}

func TestAccountsLogin(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		srv.Register(t, "bob", "")
		path := acctV3 + "/login"

		t.Run("flows", func(t *testing.T) {
			body := srv.Must(t, "GET", path, "", nil)
			flows, _ := body["flows"].([]any)
			found := false
			for _, f := range flows {
				if m, _ := f.(map[string]any); m["type"] == "m.login.password" {
					found = true
				}
			}
			if !found {
				t.Errorf("flows %v do not list m.login.password", body["flows"])
			}
		})

		t.Run("password", func(t *testing.T) {
			cases := []struct {
				name string
				body map[string]any
			}{
				{"identifier localpart", map[string]any{"type": "m.login.password",
					"identifier": map[string]any{"type": "m.id.user", "user": "alice"}, "password": alice.Password}},
				{"identifier user ID", map[string]any{"type": "m.login.password",
					"identifier": map[string]any{"type": "m.id.user", "user": alice.UserID}, "password": alice.Password}},
				{"legacy user localpart", map[string]any{"type": "m.login.password", "user": "alice", "password": alice.Password}},
				{"legacy user ID", map[string]any{"type": "m.login.password", "user": alice.UserID, "password": alice.Password}},
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					before := acctDeviceIDs(t, srv, alice.Token)
					r := srv.Do(t, "POST", path, "", c.body)
					if r.Status != http.StatusOK {
						t.Fatalf("login: %d %s", r.Status, r.Raw)
					}
					tok, _ := r.Body["access_token"].(string)
					dev, _ := r.Body["device_id"].(string)
					if r.Body["user_id"] != alice.UserID || tok == "" || dev == "" {
						t.Fatalf("login: %s, want user_id %s, access_token and device_id", r.Raw, alice.UserID)
					}
					acctWhoami(t, srv, tok, alice.UserID, dev)
					if after := acctDeviceIDs(t, srv, alice.Token); len(after) != len(before)+1 {
						t.Errorf("devices %v after login, had %v", after, before)
					}
				})
			}
		})

		t.Run("refused", func(t *testing.T) {
			before := acctDeviceIDs(t, srv, alice.Token)
			cases := []struct {
				name    string
				body    map[string]any
				status  int
				errcode string
			}{
				{"wrong password", map[string]any{"type": "m.login.password",
					"identifier": map[string]any{"type": "m.id.user", "user": "alice"}, "password": "wrong"}, 403, "M_FORBIDDEN"},
				{"other user's password", map[string]any{"type": "m.login.password",
					"identifier": map[string]any{"type": "m.id.user", "user": "alice"}, "password": "pw-bob"}, 403, "M_FORBIDDEN"},
				{"empty password", map[string]any{"type": "m.login.password",
					"identifier": map[string]any{"type": "m.id.user", "user": "alice"}, "password": ""}, 403, "M_FORBIDDEN"},
				{"unknown user", map[string]any{"type": "m.login.password",
					"identifier": map[string]any{"type": "m.id.user", "user": "nobody"}, "password": "pw-nobody"}, 403, "M_FORBIDDEN"},
				{"unknown user ID", map[string]any{"type": "m.login.password",
					"identifier": map[string]any{"type": "m.id.user", "user": "@nobody:test.local"}, "password": "x"}, 403, "M_FORBIDDEN"},
				{"other server", map[string]any{"type": "m.login.password",
					"identifier": map[string]any{"type": "m.id.user", "user": "@alice:other.example"}, "password": alice.Password}, 403, "M_FORBIDDEN"},
				{"legacy user wrong password", map[string]any{"type": "m.login.password", "user": "alice", "password": "wrong"}, 403, "M_FORBIDDEN"},
				{"token login", map[string]any{"type": "m.login.token", "token": "abc"}, 400, "M_UNKNOWN"},
				{"token login with password", map[string]any{"type": "m.login.token",
					"identifier": map[string]any{"type": "m.id.user", "user": "alice"}, "password": alice.Password}, 400, "M_UNKNOWN"},
				{"invalid device_id", map[string]any{"type": "m.login.password", "device_id": "bad/id",
					"identifier": map[string]any{"type": "m.id.user", "user": "alice"}, "password": alice.Password}, 400, "M_INVALID_PARAM"},
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					r := srv.Do(t, "POST", path, "", c.body)
					acctExpectErr(t, r, c.status, c.errcode)
					if _, ok := r.Body["access_token"]; ok {
						t.Errorf("refused login returned an access token: %s", r.Raw)
					}
				})
			}
			if after := acctDeviceIDs(t, srv, alice.Token); !acctSameIDs(after, before...) {
				t.Errorf("devices %v after refused logins, want %v", after, before)
			}
		})

		t.Run("existing device_id", func(t *testing.T) {
			old := srv.Login(t, alice, "")
			before := acctDeviceIDs(t, srv, alice.Token)
			again := srv.Login(t, alice, old.DeviceID)
			if again.DeviceID != old.DeviceID {
				t.Errorf("device_id %s, want the named %s", again.DeviceID, old.DeviceID)
			}
			if again.Token == old.Token {
				t.Fatalf("login returned the same token twice")
			}
			if after := acctDeviceIDs(t, srv, alice.Token); !acctSameIDs(after, before...) {
				t.Errorf("devices %v after re-login, want unchanged %v", after, before)
			}
			acctTokenDead(t, srv, old.Token)
			acctWhoami(t, srv, again.Token, alice.UserID, old.DeviceID)
			acctWhoami(t, srv, alice.Token, alice.UserID, alice.DeviceID) // other devices keep their tokens
		})

		t.Run("new device", func(t *testing.T) {
			before := acctDeviceIDs(t, srv, alice.Token)
			u := srv.Login(t, alice, "")
			after := acctDeviceIDs(t, srv, alice.Token)
			if len(after) != len(before)+1 {
				t.Errorf("devices %v after login, had %v", after, before)
			}
			for _, id := range before {
				if id == u.DeviceID {
					t.Errorf("login without device_id reused device %s", id)
				}
			}
			if !acctSameIDs(after, append(before, u.DeviceID)...) {
				t.Errorf("devices %v, want %v plus %s", after, before, u.DeviceID)
			}
			acctWhoami(t, srv, u.Token, alice.UserID, u.DeviceID)

			// initial_device_display_name names the new device.
			r := srv.Do(t, "POST", path, "", map[string]any{"type": "m.login.password", "initial_device_display_name": "Tablet",
				"identifier": map[string]any{"type": "m.id.user", "user": "alice"}, "password": alice.Password})
			if r.Status != http.StatusOK {
				t.Fatalf("login: %d %s", r.Status, r.Raw)
			}
			tablet, _ := r.Body["device_id"].(string)
			if got := acctDevices(t, srv, alice.Token)[tablet]["display_name"]; got != "Tablet" {
				t.Errorf("display_name of %s: %v, want Tablet", tablet, got)
			}
			after = append(after, tablet)

			// A named, unknown device is created with that ID.
			named := srv.Login(t, alice, "LAPTOP")
			if named.DeviceID != "LAPTOP" {
				t.Errorf("device_id %s, want LAPTOP", named.DeviceID)
			}
			if got := acctDeviceIDs(t, srv, alice.Token); !acctSameIDs(got, append(after, "LAPTOP")...) {
				t.Errorf("devices %v, want %v plus LAPTOP", got, after)
			}
		})
	})
}

func TestAccountsTokens(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		whoami := acctV3 + "/account/whoami"

		t.Run("missing and unknown", func(t *testing.T) {
			for _, p := range []string{whoami, acctV3 + "/devices", acctV3 + "/logout"} {
				method := "GET"
				if strings.HasSuffix(p, "/logout") {
					method = "POST"
				}
				acctExpectErr(t, srv.Do(t, method, p, "", nil), http.StatusUnauthorized, "M_MISSING_TOKEN")
				acctExpectErr(t, srv.Do(t, method, p, "garbage", nil), http.StatusUnauthorized, "M_UNKNOWN_TOKEN")
				acctExpectErr(t, srv.Do(t, method, p+"?access_token=garbage", "", nil), http.StatusUnauthorized, "M_UNKNOWN_TOKEN")
			}
			acctWhoami(t, srv, alice.Token, alice.UserID, alice.DeviceID)
		})

		t.Run("query parameter", func(t *testing.T) {
			q := "?access_token=" + url.QueryEscape(alice.Token)
			r := srv.Do(t, "GET", whoami+q, "", nil)
			if r.Status != http.StatusOK || r.Body["user_id"] != alice.UserID || r.Body["device_id"] != alice.DeviceID {
				t.Errorf("query token: %d %s", r.Status, r.Raw)
			}
		})

		t.Run("header wins", func(t *testing.T) {
			r := srv.Do(t, "GET", whoami+"?access_token=garbage", alice.Token, nil)
			if r.Status != http.StatusOK || r.Body["user_id"] != alice.UserID {
				t.Errorf("valid header, garbage query: %d %s, want 200 as alice", r.Status, r.Raw)
			}
			r = srv.Do(t, "GET", whoami+"?access_token="+url.QueryEscape(alice.Token), bob.Token, nil)
			if r.Status != http.StatusOK || r.Body["user_id"] != bob.UserID || r.Body["device_id"] != bob.DeviceID {
				t.Errorf("bob's header, alice's query: %d %s, want bob", r.Status, r.Raw)
			}
			acctExpectErr(t, srv.Do(t, "GET", whoami+"?access_token="+url.QueryEscape(alice.Token), "garbage", nil),
				http.StatusUnauthorized, "M_UNKNOWN_TOKEN")
		})

		t.Run("whoami", func(t *testing.T) {
			r := srv.Do(t, "GET", whoami, alice.Token, nil)
			if r.Status != http.StatusOK {
				t.Fatalf("whoami: %d %s", r.Status, r.Raw)
			}
			if r.Body["user_id"] != alice.UserID || r.Body["device_id"] != alice.DeviceID {
				t.Errorf("whoami: %s, want %s/%s", r.Raw, alice.UserID, alice.DeviceID)
			}
			if g, ok := r.Body["is_guest"].(bool); !ok || g {
				t.Errorf("is_guest %v, want false", r.Body["is_guest"])
			}
		})

		t.Run("logout", func(t *testing.T) {
			phone := srv.Login(t, alice, "")
			srv.Upload(t, phone, map[string]any{"device_keys": phone.DeviceKeys(t), "one_time_keys": phone.OneTimeKeys(t, "A", 2)})
			acctExpectEmptyOK(t, srv.Do(t, "POST", acctV3+"/logout", phone.Token, nil))
			acctTokenDead(t, srv, phone.Token)
			devs := acctDeviceIDs(t, srv, alice.Token)
			if !acctSameIDs(devs, alice.DeviceID) {
				t.Errorf("devices after logout %v, want [%s]", devs, alice.DeviceID)
			}
			acctExpectErr(t, srv.Do(t, "GET", acctV3+"/devices/"+phone.DeviceID, alice.Token, nil), http.StatusNotFound, "M_NOT_FOUND")
			// Its keys went with it (spec §4.4).
			q := srv.Must(t, "POST", acctV3+"/keys/query", bob.Token, map[string]any{"device_keys": map[string]any{alice.UserID: []string{}}})
			if dk, _ := q["device_keys"].(map[string]any); dk != nil {
				if ud, _ := dk[alice.UserID].(map[string]any); ud[phone.DeviceID] != nil {
					t.Errorf("keys of the logged-out device are still served: %v", ud[phone.DeviceID])
				}
			}
			c := srv.Must(t, "POST", acctV3+"/keys/claim", bob.Token, map[string]any{"one_time_keys": map[string]any{
				alice.UserID: map[string]string{phone.DeviceID: "signed_curve25519"}}})
			if otk, _ := c["one_time_keys"].(map[string]any); otk != nil {
				if ud, _ := otk[alice.UserID].(map[string]any); ud[phone.DeviceID] != nil {
					t.Errorf("one-time key of the logged-out device was claimed: %v", ud[phone.DeviceID])
				}
			}
			// Logging out the second time with the dead token fails.
			acctExpectErr(t, srv.Do(t, "POST", acctV3+"/logout", phone.Token, nil), http.StatusUnauthorized, "M_UNKNOWN_TOKEN")
			acctWhoami(t, srv, alice.Token, alice.UserID, alice.DeviceID)
		})

		t.Run("logout all", func(t *testing.T) {
			a2 := srv.Login(t, alice, "")
			a3 := srv.Login(t, alice, "")
			bob2 := srv.Login(t, bob, "")
			bobDevs := acctDeviceIDs(t, srv, bob.Token)
			acctExpectEmptyOK(t, srv.Do(t, "POST", acctV3+"/logout/all", a2.Token, nil))
			for _, tok := range []string{alice.Token, a2.Token, a3.Token} {
				acctTokenDead(t, srv, tok)
			}
			acctWhoami(t, srv, bob.Token, bob.UserID, bob.DeviceID)
			acctWhoami(t, srv, bob2.Token, bob.UserID, bob2.DeviceID)
			if got := acctDeviceIDs(t, srv, bob.Token); !acctSameIDs(got, bobDevs...) {
				t.Errorf("bob's devices %v after alice's logout/all, want %v", got, bobDevs)
			}
			// The devices are gone: a fresh login finds only itself.
			fresh := srv.Login(t, alice, "")
			if got := acctDeviceIDs(t, srv, fresh.Token); !acctSameIDs(got, fresh.DeviceID) {
				t.Errorf("alice's devices after logout/all and login: %v, want [%s]", got, fresh.DeviceID)
			}
		})
	})
}

func TestDevices(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		a2 := srv.Login(t, alice, "")
		bob := srv.Register(t, "bob", "")
		devPath := func(id string) string { return acctV3 + "/devices/" + url.PathEscape(id) }
		nameOf := func(t *testing.T, token, id string) any {
			t.Helper()
			return srv.Must(t, "GET", devPath(id), token, nil)["display_name"]
		}
		deviceThere := func(t *testing.T, u *testutil.User) {
			t.Helper()
			if r := srv.Do(t, "GET", devPath(u.DeviceID), alice.Token, nil); r.Status != http.StatusOK || r.Body["device_id"] != u.DeviceID {
				t.Errorf("device %s: %d %s, want it still there", u.DeviceID, r.Status, r.Raw)
			}
			acctWhoami(t, srv, u.Token, u.UserID, u.DeviceID)
		}
		deviceGone := func(t *testing.T, u *testutil.User) {
			t.Helper()
			acctExpectErr(t, srv.Do(t, "GET", devPath(u.DeviceID), alice.Token, nil), http.StatusNotFound, "M_NOT_FOUND")
			if _, ok := acctDevices(t, srv, alice.Token)[u.DeviceID]; ok {
				t.Errorf("device %s still listed", u.DeviceID)
			}
			acctTokenDead(t, srv, u.Token)
		}

		t.Run("list", func(t *testing.T) {
			devs := acctDevices(t, srv, alice.Token)
			if len(devs) != 2 || devs[alice.DeviceID] == nil || devs[a2.DeviceID] == nil {
				t.Fatalf("devices %v, want %s and %s", devs, alice.DeviceID, a2.DeviceID)
			}
			for id, d := range devs {
				if _, ok := d["display_name"]; ok {
					t.Errorf("device %s: display_name %v although never set", id, d["display_name"])
				}
			}
			if got := acctDeviceIDs(t, srv, bob.Token); !acctSameIDs(got, bob.DeviceID) {
				t.Errorf("bob's devices %v, want [%s]", got, bob.DeviceID)
			}
		})

		t.Run("get", func(t *testing.T) {
			for _, id := range []string{alice.DeviceID, a2.DeviceID} {
				r := srv.Do(t, "GET", devPath(id), alice.Token, nil)
				if r.Status != http.StatusOK || r.Body["device_id"] != id {
					t.Errorf("GET own device %s: %d %s", id, r.Status, r.Raw)
				}
			}
			// The path parameter is percent-decoded.
			enc := acctV3 + "/devices/" + fmt.Sprintf("%%%02X", alice.DeviceID[0]) + alice.DeviceID[1:]
			if r := srv.Do(t, "GET", enc, alice.Token, nil); r.Status != http.StatusOK || r.Body["device_id"] != alice.DeviceID {
				t.Errorf("GET %s: %d %s, want %s", enc, r.Status, r.Raw, alice.DeviceID)
			}
			acctExpectErr(t, srv.Do(t, "GET", devPath("NOSUCHDEVICE"), alice.Token, nil), http.StatusNotFound, "M_NOT_FOUND")
			acctExpectErr(t, srv.Do(t, "GET", devPath(bob.DeviceID), alice.Token, nil), http.StatusNotFound, "M_NOT_FOUND")
			acctExpectErr(t, srv.Do(t, "GET", devPath(alice.DeviceID), bob.Token, nil), http.StatusNotFound, "M_NOT_FOUND")
		})

		t.Run("rename", func(t *testing.T) {
			acctExpectEmptyOK(t, srv.Do(t, "PUT", devPath(a2.DeviceID), alice.Token, map[string]any{"display_name": "Alice's phone"}))
			if got := nameOf(t, alice.Token, a2.DeviceID); got != "Alice's phone" {
				t.Errorf("display_name %v, want Alice's phone", got)
			}
			if got := acctDevices(t, srv, a2.Token)[a2.DeviceID]["display_name"]; got != "Alice's phone" {
				t.Errorf("GET /devices display_name %v, want Alice's phone", got)
			}
			if got := acctDevices(t, srv, alice.Token)[alice.DeviceID]["display_name"]; got != nil {
				t.Errorf("the other device got named %v", got)
			}

			cases := []struct {
				name    string
				body    any
				status  int
				errcode string
			}{
				{"101 characters", map[string]any{"display_name": strings.Repeat("é", 101)}, 400, "M_INVALID_PARAM"},
				{"101 ASCII characters", map[string]any{"display_name": strings.Repeat("x", 101)}, 400, "M_INVALID_PARAM"},
				{"wrong type", map[string]any{"display_name": 5}, 400, "M_BAD_JSON"},
				{"not JSON", "name", 400, "M_NOT_JSON"},
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					acctExpectErr(t, srv.Do(t, "PUT", devPath(a2.DeviceID), alice.Token, c.body), c.status, c.errcode)
					if got := nameOf(t, alice.Token, a2.DeviceID); got != "Alice's phone" {
						t.Errorf("display_name %v after refused rename, want Alice's phone", got)
					}
				})
			}

			// The same name again is fine.
			acctExpectEmptyOK(t, srv.Do(t, "PUT", devPath(a2.DeviceID), alice.Token, map[string]any{"display_name": "Alice's phone"}))
			if got := nameOf(t, alice.Token, a2.DeviceID); got != "Alice's phone" {
				t.Errorf("display_name %v after renaming to the same name, want Alice's phone", got)
			}

			// Absent display_name leaves the name as it is.
			acctExpectEmptyOK(t, srv.Do(t, "PUT", devPath(a2.DeviceID), alice.Token, map[string]any{}))
			if got := nameOf(t, alice.Token, a2.DeviceID); got != "Alice's phone" {
				t.Errorf("display_name %v after empty PUT, want Alice's phone", got)
			}

			// 100 characters (200 bytes) are accepted: the limit counts characters.
			hundred := strings.Repeat("é", 100)
			acctExpectEmptyOK(t, srv.Do(t, "PUT", devPath(a2.DeviceID), alice.Token, map[string]any{"display_name": hundred}))
			if got := nameOf(t, alice.Token, a2.DeviceID); got != hundred {
				t.Errorf("display_name %v, want 100 × é", got)
			}

			acctExpectErr(t, srv.Do(t, "PUT", devPath("NOSUCHDEVICE"), alice.Token, map[string]any{"display_name": "x"}),
				http.StatusNotFound, "M_NOT_FOUND")
			acctExpectErr(t, srv.Do(t, "PUT", devPath(bob.DeviceID), alice.Token, map[string]any{"display_name": "stolen"}),
				http.StatusNotFound, "M_NOT_FOUND")
			if got := nameOf(t, bob.Token, bob.DeviceID); got != nil {
				t.Errorf("bob's device renamed to %v by alice", got)
			}
			if _, ok := acctDevices(t, srv, alice.Token)["NOSUCHDEVICE"]; ok {
				t.Errorf("PUT on an unknown device created it")
			}
		})

		t.Run("delete UIA", func(t *testing.T) {
			victim := srv.Login(t, alice, "")

			// No auth: the challenge.
			r := srv.Do(t, "DELETE", devPath(victim.DeviceID), alice.Token, nil)
			session := acctExpectChallenge(t, r, "m.login.password")
			r = srv.Do(t, "DELETE", devPath(victim.DeviceID), alice.Token, map[string]any{})
			acctExpectChallenge(t, r, "m.login.password")
			deviceThere(t, victim)

			// Wrong password: the challenge again, with M_FORBIDDEN.
			r = srv.Do(t, "DELETE", devPath(victim.DeviceID), alice.Token,
				map[string]any{"auth": acctPasswordAuth("alice", "wrong", session)})
			if again := acctExpectChallenge(t, r, "m.login.password"); again != session {
				t.Errorf("session %q after a wrong password, want the same %q", again, session)
			}
			acctExpectErr(t, r, http.StatusUnauthorized, "M_FORBIDDEN")
			deviceThere(t, victim)

			// Another user's correct credentials: forbidden.
			for _, user := range []string{"bob", bob.UserID} {
				r = srv.Do(t, "DELETE", devPath(victim.DeviceID), alice.Token,
					map[string]any{"auth": acctPasswordAuth(user, bob.Password, session)})
				acctExpectErr(t, r, http.StatusForbidden, "M_FORBIDDEN")
				deviceThere(t, victim)
			}
			// Nor can bob's credentials with alice's token reach bob's device.
			r = srv.Do(t, "DELETE", devPath(bob.DeviceID), alice.Token,
				map[string]any{"auth": acctPasswordAuth("bob", bob.Password, session)})
			acctExpectErr(t, r, http.StatusForbidden, "M_FORBIDDEN")
			acctWhoami(t, srv, bob.Token, bob.UserID, bob.DeviceID)

			// The right password, by localpart then by user ID, in a
			// session started for that device's deletion.
			for _, user := range []string{acctLocalpart(alice.UserID), alice.UserID} {
				t.Run("identifier "+user, func(t *testing.T) {
					d := srv.Login(t, alice, "")
					session := acctExpectChallenge(t, srv.Do(t, "DELETE", devPath(d.DeviceID), alice.Token, nil), "m.login.password")
					acctExpectEmptyOK(t, srv.Do(t, "DELETE", devPath(d.DeviceID), alice.Token,
						map[string]any{"auth": acctPasswordAuth(user, alice.Password, session)}))
					deviceGone(t, d)
					deviceThere(t, victim)
				})
			}
			acctExpectEmptyOK(t, srv.Do(t, "DELETE", devPath(victim.DeviceID), victim.Token,
				map[string]any{"auth": acctPasswordAuth("alice", alice.Password, "")}))
			deviceGone(t, victim)
			acctWhoami(t, srv, alice.Token, alice.UserID, alice.DeviceID)

			// A device that does not exist (any more): 200 all the same.
			for _, id := range []string{victim.DeviceID, "NOSUCHDEVICE"} {
				acctExpectEmptyOK(t, srv.Do(t, "DELETE", devPath(id), alice.Token,
					map[string]any{"auth": acctPasswordAuth("alice", alice.Password, "")}))
			}
			// And naming bob's device only ever looks at alice's devices.
			acctExpectEmptyOK(t, srv.Do(t, "DELETE", devPath(bob.DeviceID), alice.Token,
				map[string]any{"auth": acctPasswordAuth("alice", alice.Password, "")}))
			acctWhoami(t, srv, bob.Token, bob.UserID, bob.DeviceID)
		})

		t.Run("delete_devices", func(t *testing.T) {
			x := srv.Login(t, alice, "")
			y := srv.Login(t, alice, "")
			path := acctV3 + "/delete_devices"

			acctExpectChallenge(t, srv.Do(t, "POST", path, alice.Token, map[string]any{"devices": []string{x.DeviceID, y.DeviceID}}), "m.login.password")
			deviceThere(t, x)
			deviceThere(t, y)

			r := srv.Do(t, "POST", path, alice.Token, map[string]any{"devices": []string{x.DeviceID, y.DeviceID},
				"auth": acctPasswordAuth("alice", "wrong", "")})
			acctExpectChallenge(t, r, "m.login.password")
			acctExpectErr(t, r, http.StatusUnauthorized, "M_FORBIDDEN")
			deviceThere(t, x)
			deviceThere(t, y)

			acctExpectErr(t, srv.Do(t, "POST", path, alice.Token, map[string]any{"auth": acctPasswordAuth("alice", alice.Password, "")}),
				http.StatusBadRequest, "M_MISSING_PARAM")
			deviceThere(t, x)

			acctExpectEmptyOK(t, srv.Do(t, "POST", path, alice.Token, map[string]any{"devices": []string{x.DeviceID, y.DeviceID, "NOSUCHDEVICE"},
				"auth": acctPasswordAuth(alice.UserID, alice.Password, "")}))
			deviceGone(t, x)
			deviceGone(t, y)
			acctWhoami(t, srv, alice.Token, alice.UserID, alice.DeviceID)
			acctWhoami(t, srv, a2.Token, alice.UserID, a2.DeviceID)

			// An empty list deletes nothing.
			before := acctDeviceIDs(t, srv, alice.Token)
			acctExpectEmptyOK(t, srv.Do(t, "POST", path, alice.Token, map[string]any{"devices": []string{},
				"auth": acctPasswordAuth("alice", alice.Password, "")}))
			if got := acctDeviceIDs(t, srv, alice.Token); !acctSameIDs(got, before...) {
				t.Errorf("devices %v after deleting none, want %v", got, before)
			}
		})

		t.Run("delete removes keys", func(t *testing.T) {
			k := srv.Login(t, alice, "")
			keep := srv.Login(t, alice, "")
			for _, u := range []*testutil.User{k, keep} {
				srv.Upload(t, u, map[string]any{"device_keys": u.DeviceKeys(t), "one_time_keys": u.OneTimeKeys(t, "A", 3)})
			}
			query := func(t *testing.T) map[string]any {
				t.Helper()
				q := srv.Must(t, "POST", acctV3+"/keys/query", bob.Token, map[string]any{"device_keys": map[string]any{alice.UserID: []string{}}})
				dk, _ := q["device_keys"].(map[string]any)
				ud, _ := dk[alice.UserID].(map[string]any)
				return ud
			}
			claim := func(t *testing.T, u *testutil.User) any {
				t.Helper()
				c := srv.Must(t, "POST", acctV3+"/keys/claim", bob.Token, map[string]any{"one_time_keys": map[string]any{
					alice.UserID: map[string]string{u.DeviceID: "signed_curve25519"}}})
				otk, _ := c["one_time_keys"].(map[string]any)
				ud, _ := otk[alice.UserID].(map[string]any)
				return ud[u.DeviceID]
			}
			// Before: both devices' keys are served and claimable.
			before := query(t)
			if before[k.DeviceID] == nil || before[keep.DeviceID] == nil {
				t.Fatalf("keys/query before deletion: %v, want %s and %s", before, k.DeviceID, keep.DeviceID)
			}
			if claim(t, k) == nil {
				t.Fatalf("keys/claim before deletion returned nothing for %s", k.DeviceID)
			}

			acctExpectEmptyOK(t, srv.Do(t, "DELETE", devPath(k.DeviceID), alice.Token,
				map[string]any{"auth": acctPasswordAuth("alice", alice.Password, "")}))
			deviceGone(t, k)

			after := query(t)
			if _, ok := after[k.DeviceID]; ok {
				t.Errorf("keys/query after deletion still lists %s: %v", k.DeviceID, after[k.DeviceID])
			}
			if after[keep.DeviceID] == nil {
				t.Errorf("keys/query after deletion lost the other device %s", keep.DeviceID)
			}
			if got := claim(t, k); got != nil {
				t.Errorf("keys/claim after deletion returned %v for %s", got, k.DeviceID)
			}
			if claim(t, keep) == nil {
				t.Errorf("keys/claim after deletion returned nothing for the other device %s", keep.DeviceID)
			}
		})
	})
}
