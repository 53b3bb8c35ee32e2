package clientapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/keybackup"
)

const backupAlgorithm = "m.megolm_backup.v1.curve25519-aes-sha2"

// backupClient sends one user's key backup requests.
type backupClient struct {
	t   *testing.T
	srv *testutil.Server
	u   *testutil.User
}

func (b backupClient) do(method, path string, body any) testutil.Response {
	b.t.Helper()
	return b.srv.Do(b.t, method, "/_matrix/client/v3/room_keys"+path, b.u.Token, body)
}

func (b backupClient) must(method, path string, body any) map[string]any {
	b.t.Helper()
	r := b.do(method, path, body)
	if r.Status != http.StatusOK {
		b.t.Fatalf("%s %s: %d %s", method, path, r.Status, r.Raw)
	}
	return r.Body
}

// fails checks that a request is refused with status and errcode.
func (b backupClient) fails(method, path string, body any, status int, errcode string) testutil.Response {
	b.t.Helper()
	r := b.do(method, path, body)
	if r.Status != status || r.Errcode() != errcode {
		b.t.Fatalf("%s %s %v: got %d %s, want %d %s", method, path, body, r.Status, r.Raw, status, errcode)
	}
	if msg, _ := r.Body["error"].(string); msg == "" {
		b.t.Fatalf("%s %s: no error message: %s", method, path, r.Raw)
	}
	return r
}

func (b backupClient) create(authData map[string]any) string {
	b.t.Helper()
	return b.must("POST", "/version", map[string]any{"algorithm": backupAlgorithm, "auth_data": authData})["version"].(string)
}

// state returns the etag and count of a version.
func (b backupClient) state(version string) (string, int) {
	b.t.Helper()
	r := b.must("GET", "/version/"+version, nil)
	return r["etag"].(string), int(r["count"].(float64))
}

// expectState checks a {etag, count} answer, and that the version
// reports the same.
func (b backupClient) expectState(what string, r map[string]any, version, etag string, count int) {
	b.t.Helper()
	if r["etag"] != etag || r["count"] != float64(count) {
		b.t.Fatalf("%s: answered etag %v count %v, want %s and %d", what, r["etag"], r["count"], etag, count)
	}
	if e, c := b.state(version); e != etag || c != count {
		b.t.Fatalf("%s: version %s has etag %s count %d, want %s and %d", what, version, e, c, etag, count)
	}
}

func backupKey(fmi, fc int, verified bool, data string) map[string]any {
	return map[string]any{"first_message_index": fmi, "forwarded_count": fc, "is_verified": verified,
		"session_data": map[string]any{"ephemeral": "eph", "ciphertext": data, "mac": "mac"}}
}

func keysPath(version string, ids ...string) string {
	p := "/keys"
	for _, id := range ids {
		p += "/" + url.PathEscape(id)
	}
	return p + "?version=" + url.QueryEscape(version)
}

func ciphertext(t *testing.T, key any) string {
	t.Helper()
	return key.(map[string]any)["session_data"].(map[string]any)["ciphertext"].(string)
}

func TestKeyBackupVersions(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := backupClient{t, srv, srv.Register(t, "alice", "")}
		bob := backupClient{t, srv, srv.Register(t, "bob", "")}

		alice.fails("GET", "/version", nil, http.StatusNotFound, "M_NOT_FOUND")
		alice.fails("GET", "/version/1", nil, http.StatusNotFound, "M_NOT_FOUND")
		if r := srv.Do(t, "GET", "/_matrix/client/v3/room_keys/version", "", nil); r.Status != http.StatusUnauthorized || r.Errcode() != "M_MISSING_TOKEN" {
			t.Fatalf("without a token: %d %s", r.Status, r.Raw)
		}

		auth := map[string]any{"public_key": "abcdefg", "signatures": map[string]any{alice.u.UserID: map[string]any{"ed25519:X": "sig"}}}
		if v := alice.create(auth); v != "1" {
			t.Fatalf("first version %q", v)
		}
		got := alice.must("GET", "/version", nil)
		want := map[string]any{"algorithm": backupAlgorithm, "auth_data": auth, "count": 0, "etag": "0", "version": "1"}
		if testutil.Canonical(t, got) != testutil.Canonical(t, want) {
			t.Fatalf("current version: %s, want %s", testutil.Canonical(t, got), testutil.Canonical(t, want))
		}
		// Any algorithm is kept; a new version is current, the old one stays.
		if v := alice.must("POST", "/version", map[string]any{"algorithm": "org.example.other", "auth_data": map[string]any{}})["version"]; v != "2" {
			t.Fatalf("second version %v", v)
		}
		if r := alice.must("GET", "/version", nil); r["version"] != "2" || r["algorithm"] != "org.example.other" {
			t.Fatalf("current after a second: %v", r)
		}
		if r := alice.must("GET", "/version/1", nil); r["version"] != "1" || r["algorithm"] != backupAlgorithm {
			t.Fatalf("version 1: %v", r)
		}
		// Another user sees none of them.
		bob.fails("GET", "/version", nil, http.StatusNotFound, "M_NOT_FOUND")
		bob.fails("GET", "/version/1", nil, http.StatusNotFound, "M_NOT_FOUND")
		bob.fails("PUT", "/version/1", map[string]any{"algorithm": backupAlgorithm, "auth_data": map[string]any{}}, http.StatusNotFound, "M_NOT_FOUND")
		bob.fails("DELETE", "/version/1", nil, http.StatusNotFound, "M_NOT_FOUND")

		// An update changes auth_data only; the version in the body may be
		// given, and must then be the path's.
		alice.must("PUT", "/version/1", map[string]any{"algorithm": backupAlgorithm, "auth_data": map[string]any{"public_key": "new"}})
		alice.must("PUT", "/version/1", map[string]any{"algorithm": backupAlgorithm, "auth_data": map[string]any{"public_key": "newer"}, "version": "1"})
		if r := alice.must("GET", "/version/1", nil); testutil.Canonical(t, r["auth_data"]) != `{"public_key":"newer"}` || r["etag"] != "0" {
			t.Fatalf("after the update: %v", r)
		}
		if r := alice.must("GET", "/version", nil); r["version"] != "2" {
			t.Fatalf("an update made version %v current", r["version"])
		}
		for _, c := range []struct {
			path    string
			body    any
			status  int
			errcode string
		}{
			{"/version/1", map[string]any{"algorithm": "org.example.other", "auth_data": map[string]any{}}, 400, "M_INVALID_PARAM"},
			{"/version/1", map[string]any{"algorithm": backupAlgorithm, "auth_data": map[string]any{}, "version": "2"}, 400, "M_INVALID_PARAM"},
			{"/version/1", map[string]any{"algorithm": backupAlgorithm, "auth_data": map[string]any{}, "version": 1}, 400, "M_BAD_JSON"},
			{"/version/1", map[string]any{"auth_data": map[string]any{}}, 400, "M_MISSING_PARAM"},
			{"/version/1", map[string]any{"algorithm": backupAlgorithm}, 400, "M_MISSING_PARAM"},
			{"/version/1", map[string]any{"algorithm": backupAlgorithm, "auth_data": "text"}, 400, "M_BAD_JSON"},
			{"/version/1", "not json", 400, "M_NOT_JSON"},
			{"/version/9", map[string]any{"algorithm": backupAlgorithm, "auth_data": map[string]any{}}, 404, "M_NOT_FOUND"},
			{"/version/abc", map[string]any{"algorithm": backupAlgorithm, "auth_data": map[string]any{}}, 404, "M_NOT_FOUND"},
		} {
			alice.fails("PUT", c.path, c.body, c.status, c.errcode)
		}
		if r := alice.must("GET", "/version/1", nil); testutil.Canonical(t, r["auth_data"]) != `{"public_key":"newer"}` || r["algorithm"] != backupAlgorithm {
			t.Fatalf("refused updates changed the version: %v", r)
		}

		// Bad creations create nothing.
		for _, c := range []struct {
			body    any
			errcode string
		}{
			{map[string]any{"auth_data": map[string]any{}}, "M_MISSING_PARAM"},
			{map[string]any{"algorithm": nil, "auth_data": map[string]any{}}, "M_MISSING_PARAM"},
			{map[string]any{"algorithm": "", "auth_data": map[string]any{}}, "M_INVALID_PARAM"},
			{map[string]any{"algorithm": 7, "auth_data": map[string]any{}}, "M_BAD_JSON"},
			{map[string]any{"algorithm": backupAlgorithm}, "M_MISSING_PARAM"},
			{map[string]any{"algorithm": backupAlgorithm, "auth_data": nil}, "M_MISSING_PARAM"},
			{map[string]any{"algorithm": backupAlgorithm, "auth_data": []string{"x"}}, "M_BAD_JSON"},
			{map[string]any{"algorithm": backupAlgorithm, "auth_data": "x"}, "M_BAD_JSON"},
			{`["algorithm"]`, "M_BAD_JSON"},
			{"{", "M_NOT_JSON"},
			{"", "M_NOT_JSON"},
		} {
			alice.fails("POST", "/version", c.body, 400, c.errcode)
		}
		if r := alice.must("GET", "/version", nil); r["version"] != "2" {
			t.Fatalf("a refused creation made version %v current", r["version"])
		}

		// Deleting the current version makes the one before current again;
		// deleting it twice is no error, a version never made is not found.
		alice.must("DELETE", "/version/2", nil)
		alice.fails("GET", "/version/2", nil, http.StatusNotFound, "M_NOT_FOUND")
		if r := alice.must("GET", "/version", nil); r["version"] != "1" {
			t.Fatalf("current after deleting 2: %v", r["version"])
		}
		alice.must("DELETE", "/version/2", nil)
		alice.fails("PUT", "/version/2", map[string]any{"algorithm": "org.example.other", "auth_data": map[string]any{}}, http.StatusNotFound, "M_NOT_FOUND")
		for _, v := range []string{"3", "0", "01", "-1", "x", "99999999999999999999"} {
			alice.fails("DELETE", "/version/"+v, nil, http.StatusNotFound, "M_NOT_FOUND")
		}
		// Numbers are never given twice.
		if v := alice.create(map[string]any{}); v != "3" {
			t.Fatalf("version after a deletion: %q", v)
		}
		alice.must("DELETE", "/version/1", nil)
		alice.must("DELETE", "/version/3", nil)
		alice.fails("GET", "/version", nil, http.StatusNotFound, "M_NOT_FOUND")
		if v := alice.create(map[string]any{}); v != "4" {
			t.Fatalf("version after deleting all: %q", v)
		}
		if v := bob.create(map[string]any{}); v != "1" {
			t.Fatalf("bob's first version: %q", v)
		}
	})
}

func TestKeyBackupKeys(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := backupClient{t, srv, srv.Register(t, "alice", "")}
		const r1, r2, r3 = "!one:test.local", "!two:other.example", "!roomWithoutServerName_v12"
		v := alice.create(map[string]any{})

		// The three depths of upload; each change bumps the etag.
		r := alice.must("PUT", keysPath(v), map[string]any{"rooms": map[string]any{r1: map[string]any{"sessions": map[string]any{
			"s1": backupKey(0, 0, false, "c1"), "s2": backupKey(3, 1, true, "c2")}}}})
		alice.expectState("upload of two", r, v, "1", 2)
		r = alice.must("PUT", keysPath(v, r2), map[string]any{"sessions": map[string]any{"s/3": backupKey(1, 0, false, "c3")}})
		alice.expectState("upload to a room", r, v, "2", 3)
		r = alice.must("PUT", keysPath(v, r3, "s4"), backupKey(2, 2, false, "c4"))
		alice.expectState("upload of a session", r, v, "3", 4)
		// An empty upload, and one of what is stored, change nothing.
		r = alice.must("PUT", keysPath(v), map[string]any{"rooms": map[string]any{}})
		alice.expectState("empty upload", r, v, "3", 4)
		r = alice.must("PUT", keysPath(v, r1), map[string]any{"sessions": map[string]any{"s1": backupKey(0, 0, false, "c1")}})
		alice.expectState("same key again", r, v, "3", 4)

		all := alice.must("GET", keysPath(v), nil)
		want := map[string]any{"rooms": map[string]any{
			r1: map[string]any{"sessions": map[string]any{"s1": backupKey(0, 0, false, "c1"), "s2": backupKey(3, 1, true, "c2")}},
			r2: map[string]any{"sessions": map[string]any{"s/3": backupKey(1, 0, false, "c3")}},
			r3: map[string]any{"sessions": map[string]any{"s4": backupKey(2, 2, false, "c4")}},
		}}
		if testutil.Canonical(t, all) != testutil.Canonical(t, want) {
			t.Fatalf("all keys:\n%s\nwant\n%s", testutil.Canonical(t, all), testutil.Canonical(t, want))
		}
		room := alice.must("GET", keysPath(v, r1), nil)
		if testutil.Canonical(t, room) != testutil.Canonical(t, want["rooms"].(map[string]any)[r1]) {
			t.Fatalf("room keys: %s", testutil.Canonical(t, room))
		}
		if room := alice.must("GET", keysPath(v, "!empty:test.local"), nil); testutil.Canonical(t, room) != `{"sessions":{}}` {
			t.Fatalf("keys of a room without any: %s", testutil.Canonical(t, room))
		}
		if k := alice.must("GET", keysPath(v, r2, "s/3"), nil); testutil.Canonical(t, k) != testutil.Canonical(t, backupKey(1, 0, false, "c3")) {
			t.Fatalf("one key: %s", testutil.Canonical(t, k))
		}
		alice.fails("GET", keysPath(v, r2, "s9"), nil, http.StatusNotFound, "M_NOT_FOUND")

		// Deleting keys: one, a room's, all; deleting none changes nothing.
		r = alice.must("DELETE", keysPath(v, r1, "s1"), nil)
		alice.expectState("delete one", r, v, "4", 3)
		r = alice.must("DELETE", keysPath(v, r1, "s1"), nil)
		alice.expectState("delete it again", r, v, "4", 3)
		alice.fails("GET", keysPath(v, r1, "s1"), nil, http.StatusNotFound, "M_NOT_FOUND")
		r = alice.must("DELETE", keysPath(v, r2), nil)
		alice.expectState("delete a room", r, v, "5", 2)
		r = alice.must("DELETE", keysPath(v), nil)
		alice.expectState("delete all", r, v, "6", 0)
		if all := alice.must("GET", keysPath(v), nil); testutil.Canonical(t, all) != `{"rooms":{}}` {
			t.Fatalf("keys after deleting all: %s", testutil.Canonical(t, all))
		}
		r = alice.must("PUT", keysPath(v, r1, "s1"), backupKey(0, 0, false, "c1"))
		alice.expectState("upload after deletions", r, v, "7", 1)
	})
}

// The replacement rule: a verified key beats an unverified one, then the
// lower first_message_index wins, then the lower forwarded_count;
// otherwise the stored key stays. The etag changes exactly when the
// stored key does, and the count never.
func TestKeyBackupReplacementRule(t *testing.T) {
	type k struct {
		verified bool
		fmi, fc  int
	}
	cases := []struct {
		name             string
		stored, uploaded k
		replaced         bool
	}{
		{"verified beats unverified with worse indexes", k{false, 0, 0}, k{true, 9, 9}, true},
		{"unverified loses to verified with better indexes", k{true, 5, 5}, k{false, 0, 0}, false},
		{"lower first_message_index wins", k{false, 5, 1}, k{false, 4, 9}, true},
		{"higher first_message_index loses", k{false, 5, 1}, k{false, 6, 0}, false},
		{"then lower forwarded_count wins", k{false, 5, 1}, k{false, 5, 0}, true},
		{"higher forwarded_count loses", k{false, 5, 1}, k{false, 5, 2}, false},
		{"a tie keeps the stored key", k{false, 5, 1}, k{false, 5, 1}, false},
		{"verified: lower first_message_index wins", k{true, 5, 1}, k{true, 4, 3}, true},
		{"verified: lower forwarded_count wins", k{true, 5, 1}, k{true, 5, 0}, true},
		{"verified: a tie keeps the stored key", k{true, 5, 1}, k{true, 5, 1}, false},
	}
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := backupClient{t, srv, srv.Register(t, "alice", "")}
		v := alice.create(map[string]any{})
		const room = "!room:test.local"
		count := 0
		for i, c := range cases {
			session := fmt.Sprintf("session%d", i)
			r := alice.must("PUT", keysPath(v, room, session), backupKey(c.stored.fmi, c.stored.fc, c.stored.verified, "stored"))
			count++
			etag := r["etag"].(string)
			// The whole-backup upload goes through the same rule.
			r = alice.must("PUT", keysPath(v), map[string]any{"rooms": map[string]any{room: map[string]any{"sessions": map[string]any{
				session: backupKey(c.uploaded.fmi, c.uploaded.fc, c.uploaded.verified, "uploaded")}}}})
			if r["count"] != float64(count) {
				t.Fatalf("%s: count %v, want %d", c.name, r["count"], count)
			}
			got := alice.must("GET", keysPath(v, room, session), nil)
			want, wantEtag := c.stored, etag
			if c.replaced {
				want = c.uploaded
				wantEtag = fmt.Sprint(mustAtoi(t, etag) + 1)
			}
			if testutil.Canonical(t, got) != testutil.Canonical(t, backupKey(want.fmi, want.fc, want.verified, map[bool]string{true: "uploaded", false: "stored"}[c.replaced])) {
				t.Fatalf("%s: stored key is %s", c.name, testutil.Canonical(t, got))
			}
			if r["etag"] != wantEtag {
				t.Fatalf("%s: etag %v after the upload, was %s (replaced: %v)", c.name, r["etag"], etag, c.replaced)
			}
		}
	})
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatalf("etag %q: %v", s, err)
	}
	return n
}

// Keys go only to the current version; an older version that exists is
// the wrong version (with the current one named), any other unknown.
func TestKeyBackupWrongAndUnknownVersions(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := backupClient{t, srv, srv.Register(t, "alice", "")}
		bob := backupClient{t, srv, srv.Register(t, "bob", "")}
		const room = "!room:test.local"
		key := backupKey(0, 0, false, "c")

		// No backup at all.
		bob.fails("PUT", keysPath("1", room, "s"), key, http.StatusNotFound, "M_NOT_FOUND")
		bob.fails("GET", keysPath("1"), nil, http.StatusNotFound, "M_NOT_FOUND")
		bob.fails("DELETE", keysPath("1"), nil, http.StatusNotFound, "M_NOT_FOUND")

		v1 := alice.create(map[string]any{})
		alice.must("PUT", keysPath(v1, room, "s"), key)
		v2 := alice.create(map[string]any{})
		for _, path := range []string{keysPath(v1, room, "s2"), keysPath(v1, room), keysPath(v1)} {
			body := map[string]any{"rooms": map[string]any{room: map[string]any{"sessions": map[string]any{"s2": key}}}}
			if path == keysPath(v1, room) {
				body = map[string]any{"sessions": map[string]any{"s2": key}}
			} else if path == keysPath(v1, room, "s2") {
				body = key
			}
			r := alice.fails("PUT", path, body, http.StatusForbidden, "M_WRONG_ROOM_KEYS_VERSION")
			if r.Body["current_version"] != v2 {
				t.Fatalf("current_version %v, want %s", r.Body["current_version"], v2)
			}
		}
		if etag, count := alice.state(v1); etag != "1" || count != 1 {
			t.Fatalf("refused uploads changed version 1: etag %s count %d", etag, count)
		}
		// The old version can still be read, and lose keys.
		if k := alice.must("GET", keysPath(v1, room, "s"), nil); ciphertext(t, k) != "c" {
			t.Fatalf("old version's key: %v", k)
		}
		for _, v := range []string{"3", "0", "x", "01"} {
			alice.fails("PUT", keysPath(v, room, "s"), key, http.StatusNotFound, "M_NOT_FOUND")
			alice.fails("GET", keysPath(v), nil, http.StatusNotFound, "M_NOT_FOUND")
			alice.fails("GET", keysPath(v, room, "s"), nil, http.StatusNotFound, "M_NOT_FOUND")
			alice.fails("DELETE", keysPath(v, room), nil, http.StatusNotFound, "M_NOT_FOUND")
		}
		for _, method := range []string{"PUT", "GET", "DELETE"} {
			alice.fails(method, "/keys/"+url.PathEscape(room)+"/s", key, http.StatusBadRequest, "M_MISSING_PARAM")
			alice.fails(method, "/keys?version=", map[string]any{"rooms": map[string]any{}}, http.StatusBadRequest, "M_MISSING_PARAM")
		}
		// Another user's version number is not theirs.
		bob.fails("GET", keysPath(v1), nil, http.StatusNotFound, "M_NOT_FOUND")

		// Deleting a version deletes its keys: a new version does not see
		// them, and none is left in the database.
		alice.must("PUT", keysPath(v2, room, "s"), key)
		alice.must("DELETE", "/version/"+v1, nil)
		alice.must("DELETE", "/version/"+v2, nil)
		alice.fails("GET", keysPath(v2), nil, http.StatusNotFound, "M_NOT_FOUND")
		v3 := alice.create(map[string]any{})
		if all := alice.must("GET", keysPath(v3), nil); testutil.Canonical(t, all) != `{"rooms":{}}` {
			t.Fatalf("a new version holds %s", testutil.Canonical(t, all))
		}
		if n := backupKeyRows(t, srv); n != 0 {
			t.Fatalf("%d keys left in the database after deleting their versions", n)
		}
	})
}

func backupKeyRows(t *testing.T, srv *testutil.Server) int {
	t.Helper()
	var n int
	if err := srv.Store.DB().QueryRow(`SELECT COUNT(*) FROM backup_keys`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Every bad upload is refused with the Matrix error it deserves, and
// changes nothing, the valid keys sent with it included.
func TestKeyBackupBadInput(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := backupClient{t, srv, srv.Register(t, "alice", "")}
		v := alice.create(map[string]any{})
		const room = "!room:test.local"
		alice.must("PUT", keysPath(v, room, "kept"), backupKey(0, 0, false, "c"))

		good := backupKey(0, 0, false, "new")
		with := func(k string, val any) map[string]any {
			m := backupKey(0, 0, false, "bad")
			if val == nil {
				delete(m, k)
			} else {
				m[k] = val
			}
			return m
		}
		// Each bad key goes in a whole-backup upload next to a good one.
		for _, c := range []struct {
			name    string
			key     any
			errcode string
		}{
			{"no first_message_index", with("first_message_index", nil), "M_MISSING_PARAM"},
			{"no forwarded_count", with("forwarded_count", nil), "M_MISSING_PARAM"},
			{"no is_verified", with("is_verified", nil), "M_MISSING_PARAM"},
			{"no session_data", with("session_data", nil), "M_MISSING_PARAM"},
			{"negative first_message_index", with("first_message_index", -1), "M_INVALID_PARAM"},
			{"negative forwarded_count", with("forwarded_count", -5), "M_INVALID_PARAM"},
			{"first_message_index above 2^53-1", with("first_message_index", json.Number("9007199254740992")), "M_INVALID_PARAM"},
			{"fractional first_message_index", with("first_message_index", 1.5), "M_BAD_JSON"},
			{"first_message_index as text", with("first_message_index", "1"), "M_BAD_JSON"},
			{"is_verified as text", with("is_verified", "yes"), "M_BAD_JSON"},
			{"session_data as text", with("session_data", "ciphertext"), "M_BAD_JSON"},
			{"session_data as a list", with("session_data", []int{1}), "M_BAD_JSON"},
			{"key as text", "key", "M_BAD_JSON"},
			{"null key", json.RawMessage("null"), "M_MISSING_PARAM"},
		} {
			body := map[string]any{"rooms": map[string]any{room: map[string]any{"sessions": map[string]any{"a-good": good, "b-bad": c.key}}}}
			r := alice.do("PUT", keysPath(v), body)
			if r.Status != 400 || r.Errcode() != c.errcode {
				t.Fatalf("%s: %d %s, want 400 %s", c.name, r.Status, r.Raw, c.errcode)
			}
			// The same key alone, at the depth of a session.
			if _, isMap := c.key.(map[string]any); isMap {
				alice.fails("PUT", keysPath(v, room, "b-bad"), c.key, 400, c.errcode)
			}
		}
		for _, c := range []struct {
			name, path string
			body       any
			errcode    string
		}{
			{"not JSON", keysPath(v), "{", "M_NOT_JSON"},
			{"empty body", keysPath(v), "", "M_NOT_JSON"},
			{"a list", keysPath(v), "[]", "M_BAD_JSON"},
			{"no rooms", keysPath(v), map[string]any{}, "M_MISSING_PARAM"},
			{"rooms as a list", keysPath(v), map[string]any{"rooms": []any{}}, "M_BAD_JSON"},
			{"a room as text", keysPath(v), map[string]any{"rooms": map[string]any{room: "x"}}, "M_BAD_JSON"},
			{"a room without sessions", keysPath(v), map[string]any{"rooms": map[string]any{room: map[string]any{}}}, "M_MISSING_PARAM"},
			{"sessions as a list", keysPath(v, room), map[string]any{"sessions": []any{good}}, "M_BAD_JSON"},
			{"no sessions", keysPath(v, room), map[string]any{}, "M_MISSING_PARAM"},
			{"not a room ID in the body", keysPath(v), map[string]any{"rooms": map[string]any{"room": map[string]any{"sessions": map[string]any{"s": good}}}}, "M_INVALID_PARAM"},
			{"not a room ID in the path", keysPath(v, "room"), map[string]any{"sessions": map[string]any{"s": good}}, "M_INVALID_PARAM"},
			{"an empty session ID", keysPath(v), map[string]any{"rooms": map[string]any{room: map[string]any{"sessions": map[string]any{"": good}}}}, "M_INVALID_PARAM"},
			{"a control character in a session ID", keysPath(v, room, "s\x01"), good, "M_INVALID_PARAM"},
			{"a session ID too long", keysPath(v, room, string(make([]byte, 256))), good, "M_INVALID_PARAM"},
		} {
			if r := alice.do("PUT", c.path, c.body); r.Status != 400 || r.Errcode() != c.errcode {
				t.Fatalf("%s: %d %s, want 400 %s", c.name, r.Status, r.Raw, c.errcode)
			}
		}
		alice.fails("GET", keysPath(v, "room"), nil, 400, "M_INVALID_PARAM")
		alice.fails("DELETE", keysPath(v, "room", "s"), nil, 400, "M_INVALID_PARAM")
		if etag, count := alice.state(v); etag != "1" || count != 1 {
			t.Fatalf("refused uploads changed the backup: etag %s count %d", etag, count)
		}
		if all := alice.must("GET", keysPath(v), nil); testutil.Canonical(t, all) !=
			testutil.Canonical(t, map[string]any{"rooms": map[string]any{room: map[string]any{"sessions": map[string]any{"kept": backupKey(0, 0, false, "c")}}}}) {
			t.Fatalf("refused uploads changed the keys: %s", testutil.Canonical(t, all))
		}
	})
}

// DeleteAll, for the deactivation of an account, removes every version
// and key of the user and nobody else's; version numbers go on.
func TestKeyBackupDeleteAll(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := backupClient{t, srv, srv.Register(t, "alice", "")}
		bob := backupClient{t, srv, srv.Register(t, "bob", "")}
		const room = "!room:test.local"
		for _, u := range []backupClient{alice, bob} {
			u.create(map[string]any{})
			u.must("PUT", keysPath("1", room, "s"), backupKey(0, 0, false, "c"))
			u.create(map[string]any{})
			u.must("PUT", keysPath("2", room, "s"), backupKey(0, 0, false, "c"))
		}
		if err := keybackup.New(srv.Store, nil, keybackup.Options{}).DeleteAll(context.Background(), alice.u.UserID); err != nil {
			t.Fatal(err)
		}
		alice.fails("GET", "/version", nil, http.StatusNotFound, "M_NOT_FOUND")
		alice.fails("GET", "/version/1", nil, http.StatusNotFound, "M_NOT_FOUND")
		if n := backupKeyRows(t, srv); n != 2 {
			t.Fatalf("%d keys left, want bob's 2", n)
		}
		if etag, count := bob.state("2"); etag != "1" || count != 1 {
			t.Fatalf("bob's backup: etag %s count %d", etag, count)
		}
		if v := alice.create(map[string]any{}); v != "3" {
			t.Fatalf("alice's next version: %s", v)
		}
		// A user who never had a backup.
		if err := keybackup.New(srv.Store, nil, keybackup.Options{}).DeleteAll(context.Background(), "@nobody:test.local"); err != nil {
			t.Fatal(err)
		}
	})
}

// The daemon serves the key backup on its database.
func TestKeyBackupServedByTheDaemon(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, nil)
		alice := backupClient{t, n.Server, n.Register(t, "alice", "")}
		v := alice.create(map[string]any{"public_key": "k"})
		r := alice.must("PUT", keysPath(v, "!room:x", "s"), backupKey(0, 0, true, "c"))
		alice.expectState("upload", r, v, "1", 1)
		// Kept across a restart.
		n.Stop()
		n.Restart()
		alice.srv = n.Server
		if k := alice.must("GET", keysPath(v, "!room:x", "s"), nil); ciphertext(t, k) != "c" {
			t.Fatalf("after a restart: %v", k)
		}
	})
}

// keys.strict_validation false reaches the key backup: auth_data may be
// any JSON value.
func TestKeyBackupLaxDaemon(t *testing.T) {
	n := testutil.StartNode(t, testutil.SQLite(t), func(c *config.Config) { c.Keys.StrictValidation = false })
	alice := backupClient{t, n.Server, n.Register(t, "alice", "")}
	v := alice.must("POST", "/version", map[string]any{"algorithm": backupAlgorithm, "auth_data": "anopaquestring"})["version"].(string)
	if r := alice.must("GET", "/version/"+v, nil); r["auth_data"] != "anopaquestring" {
		t.Fatalf("auth_data as kept: %v", r)
	}
}

// Deactivating an account deletes its key backups, and nobody else's.
func TestKeyBackupGoesWithTheAccount(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := backupClient{t, srv, srv.Register(t, "alice", "")}
		bob := backupClient{t, srv, srv.Register(t, "bob", "")}
		for _, u := range []backupClient{alice, bob} {
			v := u.create(map[string]any{})
			u.must("PUT", keysPath(v, "!room:x", "s"), backupKey(0, 0, false, "c"))
		}
		path := acctV3 + "/account/deactivate"
		session := acctExpectChallenge(t, srv.Do(t, "POST", path, alice.u.Token, map[string]any{}), "m.login.password")
		srv.Must(t, "POST", path, alice.u.Token, map[string]any{"auth": acctPasswordAuth("alice", alice.u.Password, session)})
		var versions int
		if err := srv.Store.DB().QueryRow(`SELECT COUNT(*) FROM backup_versions WHERE user_id = $1`, alice.u.UserID).Scan(&versions); err != nil {
			t.Fatal(err)
		}
		if n := backupKeyRows(t, srv); versions != 0 || n != 1 {
			t.Fatalf("after alice's deactivation: %d of her versions, %d keys (want bob's 1)", versions, n)
		}
		if etag, count := bob.state("1"); etag != "1" || count != 1 {
			t.Fatalf("bob's backup: etag %s count %d", etag, count)
		}
	})
}

// Concurrent requests of one user: each new version gets its own number,
// and concurrent uploads leave the exact count and the best key of each
// session.
func TestKeyBackupConcurrentRequests(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := backupClient{t, srv, srv.Register(t, "alice", "")}
		const workers = 6
		versions := make(chan string, workers)
		done := make(chan struct{})
		for i := 0; i < workers; i++ {
			go func() {
				defer func() { done <- struct{}{} }()
				r := srv.Do(t, "POST", "/_matrix/client/v3/room_keys/version", alice.u.Token,
					map[string]any{"algorithm": backupAlgorithm, "auth_data": map[string]any{}})
				v, _ := r.Body["version"].(string)
				versions <- v
			}()
		}
		seen := map[string]bool{}
		for i := 0; i < workers; i++ {
			<-done
			v := <-versions
			if v == "" || seen[v] {
				t.Fatalf("concurrent creations: version %q (seen %v)", v, seen)
			}
			seen[v] = true
		}
		v := fmt.Sprint(workers)
		if r := alice.must("GET", "/version", nil); r["version"] != v {
			t.Fatalf("current after %d creations: %v", workers, r["version"])
		}

		// Every worker uploads its own 5 sessions and its copy of 3 shared
		// ones; worker i's shared copies have first_message_index i, so
		// worker 0's win wherever they land in the order.
		const room = "!room:test.local"
		errs := make(chan string, workers)
		for i := 0; i < workers; i++ {
			go func() {
				sessions := map[string]any{}
				for j := 0; j < 5; j++ {
					sessions[fmt.Sprintf("own-%d-%d", i, j)] = backupKey(0, 0, false, "own")
				}
				for j := 0; j < 3; j++ {
					sessions[fmt.Sprintf("shared-%d", j)] = backupKey(i, 0, false, fmt.Sprint("worker", i))
				}
				r := srv.Do(t, "PUT", "/_matrix/client/v3/room_keys"+keysPath(v, room), alice.u.Token, map[string]any{"sessions": sessions})
				if r.Status != http.StatusOK {
					errs <- fmt.Sprintf("%d %s", r.Status, r.Raw)
					return
				}
				errs <- ""
			}()
		}
		for i := 0; i < workers; i++ {
			if e := <-errs; e != "" {
				t.Fatalf("concurrent upload: %s", e)
			}
		}
		if _, count := alice.state(v); count != workers*5+3 {
			t.Fatalf("count %d after concurrent uploads, want %d", count, workers*5+3)
		}
		for j := 0; j < 3; j++ {
			if k := alice.must("GET", keysPath(v, room, fmt.Sprintf("shared-%d", j)), nil); ciphertext(t, k) != "worker0" {
				t.Fatalf("shared session %d holds %v, want worker 0's", j, k)
			}
		}
	})
}

// With keys.strict_validation false, auth_data may be any JSON value (test
// tools send an opaque string), kept and answered as sent, on creation and
// update; strict mode keeps requiring an object. In both, more than ten
// versions can be made, each readable until deleted.
func TestKeyBackupAuthDataByMode(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		for _, lax := range []bool{false, true} {
			t.Run(fmt.Sprintf("lax=%v", lax), func(t *testing.T) {
				srv := testutil.NewServer(t, db, testutil.ServerOptions{LaxKeyValidation: lax})
				alice := backupClient{t, srv, srv.Register(t, fmt.Sprintf("alice%v", lax), "")}
				values := []any{map[string]any{"public_key": "abc"}, map[string]any{}}
				refused := []any{"anopaquestring", 42, []any{1, "two"}, true}
				if lax {
					values = append(values, append(refused, nil)...)
					refused = nil
				} else {
					alice.fails("POST", "/version", map[string]any{"algorithm": backupAlgorithm, "auth_data": nil}, 400, "M_MISSING_PARAM")
				}
				for _, v := range refused {
					alice.fails("POST", "/version", map[string]any{"algorithm": backupAlgorithm, "auth_data": v}, 400, "M_BAD_JSON")
				}
				alice.fails("POST", "/version", map[string]any{"algorithm": backupAlgorithm}, 400, "M_MISSING_PARAM")
				alice.fails("GET", "/version", nil, http.StatusNotFound, "M_NOT_FOUND")

				// Twelve versions, each with its auth_data.
				want := map[string]any{}
				var order []string
				for i := range 12 {
					authData := values[i%len(values)]
					v := alice.must("POST", "/version", map[string]any{"algorithm": backupAlgorithm, "auth_data": authData})["version"].(string)
					if v != fmt.Sprint(i+1) {
						t.Fatalf("version %d is %q", i+1, v)
					}
					want[v] = authData
					order = append(order, v)
				}
				check := func(what string) {
					t.Helper()
					for v, authData := range want {
						r := alice.must("GET", "/version/"+v, nil)
						if r["version"] != v || testutil.Canonical(t, r["auth_data"]) != testutil.Canonical(t, authData) {
							t.Fatalf("%s: version %s is %v, want auth_data %v", what, v, r, authData)
						}
					}
					if len(want) == 0 {
						alice.fails("GET", "/version", nil, http.StatusNotFound, "M_NOT_FOUND")
						return
					}
					if cur := alice.must("GET", "/version", nil)["version"]; cur != order[len(order)-1] {
						t.Fatalf("%s: current version %v, want %s", what, cur, order[len(order)-1])
					}
				}
				check("after creating")
				// Keys go to the current version, the twelfth.
				alice.must("PUT", keysPath("12", "!room:test.local", "s1"), backupKey(0, 0, false, "c"))
				if _, count := alice.state("12"); count != 1 {
					t.Fatalf("version 12 holds %d keys", count)
				}

				// An update keeps the new value as sent, or is refused as a
				// creation is.
				update := map[string]any{"algorithm": backupAlgorithm, "auth_data": "replaced"}
				if lax {
					alice.must("PUT", "/version/11", update)
					want["11"] = "replaced"
				} else {
					alice.fails("PUT", "/version/11", update, 400, "M_BAD_JSON")
				}
				check("after an update")

				// Deleted one by one, the newest first and then the oldest,
				// the others stay readable.
				for len(order) > 0 {
					i := 0
					if len(order)%2 == 0 {
						i = len(order) - 1
					}
					v := order[i]
					alice.must("DELETE", "/version/"+v, nil)
					alice.fails("GET", "/version/"+v, nil, http.StatusNotFound, "M_NOT_FOUND")
					delete(want, v)
					order = append(order[:i], order[i+1:]...)
					check("after deleting " + v)
				}
			})
		}
	})
}
