package federationapi_test

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/testutil"
)

// slowRemote is a server that answers device lists and claims for any of
// its users after delay: longer than a short timeout, far shorter than the
// default one.
type slowRemote struct {
	*testutil.Origin
	users atomic.Int32
}

const remoteDelay = 300 * time.Millisecond

func newSlowRemote(t *testing.T) *slowRemote {
	o := &slowRemote{Origin: testutil.NewOrigin(t)}
	wait := func(r *http.Request) bool {
		select {
		case <-time.After(remoteDelay):
			return true
		case <-r.Context().Done():
			return false
		}
	}
	userOf := func(userID string) *testutil.User {
		// A key derived from the user ID, so that the device list and the
		// claim agree.
		seed := make([]byte, ed25519.SeedSize)
		copy(seed, userID)
		return &testutil.User{UserID: userID, DeviceID: "DEV", Key: ed25519.NewKeyFromSeed(seed)}
	}
	o.Mux.HandleFunc("GET /_matrix/federation/v1/user/devices/{user}", func(w http.ResponseWriter, r *http.Request) {
		if !wait(r) {
			return
		}
		u := userOf(r.PathValue("user"))
		writeJSON(w, map[string]any{"user_id": u.UserID, "stream_id": 1, "devices": []any{
			map[string]any{"device_id": u.DeviceID, "keys": u.DeviceKeys(t)}}})
	})
	o.Mux.HandleFunc("POST /_matrix/federation/v1/user/keys/claim", func(w http.ResponseWriter, r *http.Request) {
		if !wait(r) {
			return
		}
		var req struct {
			OneTimeKeys map[string]map[string]string `json:"one_time_keys"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		out := map[string]any{}
		for userID := range req.OneTimeKeys {
			out[userID] = map[string]any{"DEV": map[string]any{"signed_curve25519:K1": userOf(userID).SignedKey(t, false)}}
		}
		writeJSON(w, map[string]any{"one_time_keys": out})
	})
	return o
}

// newUser names a user of the remote not asked about before, so that a
// query must fetch their list.
func (o *slowRemote) newUser() string {
	return fmt.Sprintf("@user%d:%s", o.users.Add(1), o.Name)
}

// A /keys/query or /keys/claim whose timeout is not a non-negative
// integer (an object as Element's Rust crypto sends, a string, a negative
// number, a float) is served with the default timeout; an integer keeps its
// meaning, in the body or in the query string.
func TestKeyRequestTimeoutShapes(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, nil)
		bob := n.Register(t, "bob", "")
		const (
			queryPath = "/_matrix/client/v3/keys/query"
			claimPath = "/_matrix/client/v3/keys/claim"
		)
		queryBody := func(user string, timeout any) map[string]any {
			b := map[string]any{"device_keys": map[string][]string{user: {}}}
			if timeout != nil {
				b["timeout"] = timeout
			}
			return b
		}
		claimBody := func(user string, timeout any) map[string]any {
			b := map[string]any{"one_time_keys": map[string]any{user: map[string]string{"DEV": "signed_curve25519"}}}
			if timeout != nil {
				b["timeout"] = timeout
			}
			return b
		}
		// answered reports whether the remote user's device (query) or key
		// (claim) is in the answer, and fails the test on a failure that
		// comes with it.
		answered := func(t *testing.T, path, user string, r map[string]any) bool {
			t.Helper()
			field := "device_keys"
			if path == claimPath {
				field = "one_time_keys"
			}
			got, _ := r[field].(map[string]any)[user].(map[string]any)
			ok := got["DEV"] != nil
			if ok == (len(failuresOf(r)) != 0) {
				t.Fatalf("%s: an answer and failures do not agree: %v", path, r)
			}
			return ok
		}

		// The default timeout (10 s) outlasts the remote's delay.
		defaulted := []struct {
			name    string
			timeout any
		}{
			{"none", nil},
			{"an object", map[string]any{"secs": 10, "nanos": 0}},
			{"an object of a few nanoseconds", map[string]any{"secs": 0, "nanos": 5}},
			{"a string", "1"},
			{"a negative number", -1},
			{"a float", 2.5},
			{"a whole float", json.Number("10.0")},
			{"an exponent", json.Number("1e1")},
			{"a boolean", true},
			{"an array", []int{1}},
			{"too large", json.Number("99999999999999999999999")},
		}
		// Sent at once, each for a user of its own: the remote's delays
		// add up otherwise.
		remote := newSlowRemote(t)
		type result struct {
			what, path, user string
			status           int
			body             map[string]any
			err              error
		}
		results := make(chan result)
		for _, c := range defaulted {
			for _, path := range []string{queryPath, claimPath} {
				user := remote.newUser()
				body := queryBody(user, c.timeout)
				if path == claimPath {
					body = claimBody(user, c.timeout)
				}
				go func() {
					res := result{what: c.name, path: path, user: user}
					res.status, res.body, res.err = post(n.URL+path, bob.Token, body)
					results <- res
				}()
			}
		}
		for range 2 * len(defaulted) {
			res := <-results
			if res.err != nil || res.status != http.StatusOK {
				t.Errorf("%s with timeout %s: %d %v %v", res.path, res.what, res.status, res.body, res.err)
				continue
			}
			if !answered(t, res.path, res.user, res.body) {
				t.Errorf("%s with timeout %s: the remote's answer was not waited for: %v", res.path, res.what, res.body)
			}
		}
		if t.Failed() {
			t.FailNow()
		}
		// A valid integer is waited for as long as it says.
		for _, path := range []string{queryPath, claimPath} {
			user := remote.newUser()
			body := queryBody(user, 5000)
			if path == claimPath {
				body = claimBody(user, 5000)
			}
			if !answered(t, path, user, n.Must(t, "POST", path, bob.Token, body)) {
				t.Fatalf("%s with timeout 5000: no answer", path)
			}
		}
		// A short one gives up: in the body, or in the query string (also
		// beside a body timeout of another shape). Each on a remote of its
		// own, since a server that did not answer in time is then left
		// alone for a while.
		for _, c := range []struct {
			name, query string
			timeout     any
		}{
			{"body", "", 50},
			{"query string", "?timeout=50", nil},
			{"query string beside an object", "?timeout=50", map[string]any{"secs": 10, "nanos": 0}},
		} {
			for _, path := range []string{queryPath, claimPath} {
				remote := newSlowRemote(t)
				user := remote.newUser()
				body := queryBody(user, c.timeout)
				if path == claimPath {
					body = claimBody(user, c.timeout)
				}
				start := time.Now()
				r := n.Must(t, "POST", path+c.query, bob.Token, body)
				if answered(t, path, user, r) {
					t.Fatalf("%s, timeout in the %s: the remote's answer (after %v) was waited for: %v", path, c.name, remoteDelay, r)
				}
				if f, _ := failuresOf(r)[remote.Name].(map[string]any); f == nil {
					t.Fatalf("%s, timeout in the %s: no failure for the remote: %v", path, c.name, r)
				}
				if d := time.Since(start); d >= remoteDelay+2*time.Second {
					t.Fatalf("%s, timeout in the %s: answered after %v", path, c.name, d)
				}
			}
		}
		// A valid integer in the body wins over the query string.
		user := remote.newUser()
		if !answered(t, queryPath, user, n.Must(t, "POST", queryPath+"?timeout=50", bob.Token, queryBody(user, 5000))) {
			t.Fatal("the query string's timeout won over the body's")
		}
	})
}

// post sends a JSON request from any goroutine and decodes the answer.
func post(url, token string, body any) (int, map[string]any, error) {
	js, err := json.Marshal(body)
	if err != nil {
		return 0, nil, err
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(js))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var out map[string]any
	err = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out, err
}
