package clientapi_test

import (
	"net/http"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

// No body a client can send makes any endpoint answer 5xx: every mistake is
// a 4xx Matrix error.
func TestGarbageNeverServerError(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "ALICEDEV")
		bodies := []string{
			``, `{`, `[]`, `null`, `"x"`, `5`, `{}`, `{"a":`, "\xff\xfe", `{"device_keys":null}`,
			`{"device_keys":{"@a:b":null}}`, `{"device_keys":{"@a:b":[1,2]}}`, `{"device_keys":{"":[]}}`,
			`{"device_keys":{"user_id":{},"device_id":[],"keys":5,"algorithms":"x","signatures":[]}}`,
			`{"device_keys":{"user_id":"@alice:test.local","device_id":"ALICEDEV","algorithms":[],"keys":{"ed25519:ALICEDEV":"` + testutil.RandomKey() + `"},"signatures":{"@alice:test.local":{"ed25519:ALICEDEV":"!!"}}}}`,
			`{"one_time_keys":{"signed_curve25519:A":{"key":5,"signatures":{}}}}`,
			`{"one_time_keys":{"signed_curve25519:A":{"key":"` + testutil.RandomKey() + `","signatures":{"@alice:test.local":{"ed25519:ALICEDEV":5}}}}}`,
			`{"fallback_keys":{"signed_curve25519:A":[]}}`, `{"one_time_keys":{"a:b":1e400}}`,
			`{"one_time_keys":{"@alice:test.local":{"ALICEDEV":5}}}`, `{"one_time_keys":{"@alice:test.local":null}}`,
			`{"timeout":-5,"device_keys":{}}`, `{"timeout":1e30,"device_keys":{}}`,
			`{"auth":5}`, `{"auth":{"type":5}}`, `{"auth":{"type":"m.login.password","identifier":5}}`,
			`{"auth":{"type":"m.login.password","identifier":{"type":"m.id.user","user":""},"password":"x"}}`,
			`{"username":5}`, `{"username":"` + string(make([]byte, 300)) + `"}`, `{"password":["x"]}`,
			`{"type":"m.login.password","identifier":{"type":"m.id.user","user":"@"},"password":"x"}`,
			`{"type":"m.login.password","user":"@:","password":"x"}`, `{"devices":[5]}`, `{"devices":"x"}`,
			`{"display_name":5}`, `{"display_name":null}`, `{"membership":5}`, `{"display_name":"a\u0000b"}`,
			`{"one_time_keys":{"@alice:test.local":{"A\u0000":"signed_curve25519"}}}`,
			`{"device_keys":{"@alice:test.local":["\u0000"]}}`, `{"username":"a\u0000"}`, "{\"one_time_keys\":{\"org.x:A\":{\"a\":\"\xff\"}}}", "{\"username\":\"\xc3\"}",
		}
		paths := []struct{ method, path string }{
			{"POST", "/_matrix/client/v3/keys/upload"}, {"POST", "/_matrix/client/v3/keys/query"},
			{"POST", "/_matrix/client/v3/keys/claim"}, {"POST", "/_matrix/client/v3/register"},
			{"POST", "/_matrix/client/v3/login"}, {"PUT", "/_matrix/client/v3/devices/ALICEDEV"},
			{"DELETE", "/_matrix/client/v3/devices/NOPE"}, {"POST", "/_matrix/client/v3/delete_devices"},
			{"PUT", "/_keyserver/admin/v1/rooms/!r:x/members/@a:b"},
		}
		for _, p := range paths {
			token := alice.Token
			if p.path[:10] == "/_keyserve" {
				token = testutil.AdminToken
			}
			for _, b := range bodies {
				r := srv.Do(t, p.method, p.path, token, b)
				if r.Status >= 500 || (r.Status >= 400 && r.Status != 401 && r.Errcode() == "") {
					t.Errorf("%s %s %q: %d %s", p.method, p.path, b, r.Status, r.Raw)
				}
			}
		}
		for _, q := range []string{"/_matrix/client/v3/keys/changes?from=s%00&to=s1", "/_matrix/client/v3/sync?since=s99999999999999999999",
			"/_matrix/client/v3/sync?timeout=99999999999999999999", "/_matrix/client/v3/devices/%ff", "/_matrix/client/v3/register/available?username=%00"} {
			if r := srv.Do(t, "GET", q, alice.Token, nil); r.Status >= 500 {
				t.Errorf("GET %s: %d %s", q, r.Status, r.Raw)
			}
		}
		if r := srv.Do(t, "GET", "/_matrix/client/v3/account/whoami", alice.Token, nil); r.Status != http.StatusOK {
			t.Fatalf("the server did not survive: %d", r.Status)
		}
	})
}
