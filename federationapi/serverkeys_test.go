package federationapi_test

import (
	"crypto/ed25519"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

// The published key response is signed by the key it lists, passes the
// checks other servers make, and lists retired keys as old_verify_keys.
func TestServerKeys(t *testing.T) {
	n := testutil.StartNode(t, testutil.SQLite(t), func(c *config.Config) {
		c.Federation.OldVerifyKeys = map[string]config.OldVerifyKey{
			"ed25519:a_old": {Key: "XGX0JRS2Af3be3knz2fBiRbApjm2Dh61gXDJA8kcJNI", ExpiredTS: 1700000000000},
		}
	})
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Get("https://" + n.Config.Federation.Listen + "/_matrix/key/v2/server")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var keys gomatrixserverlib.ServerKeys
	if err := json.Unmarshal(raw, &keys); err != nil {
		t.Fatal(err)
	}
	checks, _ := gomatrixserverlib.CheckKeys(spec.ServerName(n.ServerName), time.Now(), keys)
	if !checks.AllChecksOK {
		t.Fatalf("key response fails the checks: %+v\n%s", checks, raw)
	}
	if len(keys.VerifyKeys) != 1 {
		t.Fatalf("verify keys %v", keys.VerifyKeys)
	}
	for id, k := range keys.VerifyKeys {
		if err := gomatrixserverlib.VerifyJSON(n.ServerName, id, ed25519.PublicKey(k.Key), raw); err != nil {
			t.Fatalf("not self-signed: %v", err)
		}
	}
	old, ok := keys.OldVerifyKeys["ed25519:a_old"]
	if !ok || old.ExpiredTS != 1700000000000 || base64.RawStdEncoding.EncodeToString(old.Key) != "XGX0JRS2Af3be3knz2fBiRbApjm2Dh61gXDJA8kcJNI" {
		t.Fatalf("old_verify_keys %s", raw)
	}
	if until := keys.ValidUntilTS.Time(); until.Before(time.Now().Add(time.Hour)) {
		t.Fatalf("valid_until_ts %v is too soon", until)
	}
	// The version endpoint needs no signature.
	resp, err = c.Get("https://" + n.Config.Federation.Listen + "/_matrix/federation/v1/version")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("version: %v %v", resp, err)
	}
	resp.Body.Close()
}

// Each remote server has its own token bucket.
func TestRateLimitPerServer(t *testing.T) {
	n := testutil.StartNode(t, testutil.SQLite(t), func(c *config.Config) {
		c.Federation.RateLimitPerSecond, c.Federation.RateLimitBurst = 1, 2
	})
	o := testutil.NewOrigin(t)
	query := func() testutil.Response {
		return testutil.SendTo(t, n, o.SignedRequest(t, "POST", n.ServerName, "/_matrix/federation/v1/user/keys/query",
			map[string]any{"device_keys": map[string][]string{}}, "", nil))
	}
	for i := 0; i < 2; i++ {
		if r := query(); r.Status != 200 {
			t.Fatalf("request %d: %d %s", i, r.Status, r.Raw)
		}
	}
	if r := query(); r.Status != 429 || r.Errcode() != "M_LIMIT_EXCEEDED" {
		t.Fatalf("over the limit: %d %s", r.Status, r.Raw)
	}
}

// The deprecated path naming a key ID, still fetched by peers and test
// tools, answers what /_matrix/key/v2/server answers, whatever the ID.
func TestServerKeysByKeyID(t *testing.T) {
	n := testutil.StartNode(t, testutil.SQLite(t), nil)
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	fetch := func(path string) (int, map[string]json.RawMessage, []byte) {
		t.Helper()
		resp, err := c.Get("https://" + n.Config.Federation.Listen + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var body map[string]json.RawMessage
		if err := json.Unmarshal(raw, &body); err != nil {
			t.Fatalf("%s: not JSON: %s", path, raw)
		}
		return resp.StatusCode, body, raw
	}
	_, want, _ := fetch("/_matrix/key/v2/server")
	var keyID string
	var verifyKeys map[string]any
	if err := json.Unmarshal(want["verify_keys"], &verifyKeys); err != nil || len(verifyKeys) != 1 {
		t.Fatalf("verify_keys %s", want["verify_keys"])
	}
	for id := range verifyKeys {
		keyID = id
	}
	for _, path := range []string{
		"/_matrix/key/v2/server/" + keyID,
		"/_matrix/key/v2/server/" + url.PathEscape(keyID),
		"/_matrix/key/v2/server/ed25519:unknown",
		"/_matrix/key/v2/server/",
	} {
		status, got, raw := fetch(path)
		if status != http.StatusOK {
			t.Fatalf("%s: %d %s", path, status, raw)
		}
		// valid_until_ts and so the signature follow the clock; the rest is
		// the same object.
		for _, field := range []string{"server_name", "verify_keys", "old_verify_keys"} {
			if string(got[field]) != string(want[field]) {
				t.Fatalf("%s: %s is %s, want %s", path, field, got[field], want[field])
			}
		}
		if len(got) != len(want) {
			t.Fatalf("%s: members differ:\n%s", path, raw)
		}
		var keys gomatrixserverlib.ServerKeys
		if err := json.Unmarshal(raw, &keys); err != nil {
			t.Fatal(err)
		}
		if checks, _ := gomatrixserverlib.CheckKeys(spec.ServerName(n.ServerName), time.Now(), keys); !checks.AllChecksOK {
			t.Fatalf("%s: key response fails the checks: %+v\n%s", path, checks, raw)
		}
	}
}
