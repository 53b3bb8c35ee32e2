package federationapi_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/url"
	"testing"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

const claimPath = "/_matrix/federation/v1/user/keys/claim"

// Only correctly signed requests addressed to us are served; every other
// one is 401 M_UNAUTHORIZED and changes nothing.
func TestInboundAuthentication(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, nil)
		origin := testutil.NewOrigin(t)
		alice := n.Register(t, "alice", "ALICEDEV")
		n.Upload(t, alice, map[string]any{"device_keys": alice.DeviceKeys(t), "one_time_keys": alice.OneTimeKeys(t, "A", 5)})
		claim := map[string]any{"one_time_keys": map[string]any{alice.UserID: map[string]string{"ALICEDEV": "signed_curve25519"}}}
		_, otherKey, _ := ed25519.GenerateKey(rand.Reader)

		for _, tc := range []struct {
			name string
			req  func() *http.Request
		}{
			{"missing header", func() *http.Request {
				r := origin.SignedRequest(t, "POST", n.ServerName, claimPath, claim, "", nil)
				r.Header.Del("Authorization")
				return r
			}},
			{"malformed header", func() *http.Request {
				r := origin.SignedRequest(t, "POST", n.ServerName, claimPath, claim, "", nil)
				r.Header.Set("Authorization", "X-Matrix nonsense")
				return r
			}},
			{"wrong key", func() *http.Request {
				return origin.SignedRequest(t, "POST", n.ServerName, claimPath, claim, origin.KeyID, otherKey)
			}},
			{"unknown key ID", func() *http.Request {
				return origin.SignedRequest(t, "POST", n.ServerName, claimPath, claim, "ed25519:notpublished", otherKey)
			}},
			{"tampered body", func() *http.Request {
				r := origin.SignedRequest(t, "POST", n.ServerName, claimPath, claim, "", nil)
				return testutil.WithBody(r, `{"one_time_keys":{"`+alice.UserID+`":{"ALICEDEV":"signed_curve25519","X":"signed_curve25519"}}}`)
			}},
			{"wrong destination", func() *http.Request {
				return origin.SignedRequest(t, "POST", "elsewhere.example", claimPath, claim, "", nil)
			}},
			{"unreachable origin", func() *http.Request {
				r := origin.SignedRequest(t, "POST", n.ServerName, claimPath, claim, "", nil)
				r.Header.Set("Authorization", `X-Matrix origin="127.0.0.1:1",destination="`+n.ServerName+`",key="ed25519:x",sig="AAAA"`)
				return r
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := testutil.SendTo(t, n, tc.req())
				if r.Status != http.StatusUnauthorized || r.Errcode() != "M_UNAUTHORIZED" {
					t.Fatalf("got %d %s", r.Status, r.Raw)
				}
				if c := counts(t, n, alice); c != 5 {
					t.Fatalf("a refused request claimed a key: %v left", c)
				}
			})
		}
		// The same request, correctly signed, is served.
		r := testutil.SendTo(t, n, origin.SignedRequest(t, "POST", n.ServerName, claimPath, claim, "", nil))
		keys, _ := r.Body["one_time_keys"].(map[string]any)[alice.UserID].(map[string]any)["ALICEDEV"].(map[string]any)
		if r.Status != 200 || keys["signed_curve25519:A0000"] == nil {
			t.Fatalf("signed claim: %d %s", r.Status, r.Raw)
		}
		if c := counts(t, n, alice); c != 4 {
			t.Fatalf("%v keys left after one claim", c)
		}
	})
}

func TestInboundKeyEndpoints(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, nil)
		named := testutil.StartNode(t, testutil.SQLite(t), func(c *config.Config) { c.Federation.AllowDeviceNames = true })
		origin := testutil.NewOrigin(t)
		for _, node := range []*testutil.Node{n, named} {
			alice := node.Register(t, "alice", "ALICEDEV")
			node.Must(t, "PUT", "/_matrix/client/v3/devices/ALICEDEV", alice.Token, map[string]string{"display_name": "phone"})
			keys := alice.DeviceKeys(t)
			node.Upload(t, alice, map[string]any{"device_keys": keys})
			node.Login(t, alice, "KEYLESS") // a device without keys is not listed

			// /user/keys/query: local users only, names only when allowed.
			r := testutil.SendTo(t, node, origin.SignedRequest(t, "POST", node.ServerName, "/_matrix/federation/v1/user/keys/query",
				map[string]any{"device_keys": map[string][]string{alice.UserID: {}, "@x:" + origin.Name: {}}}, "", nil))
			dk, _ := r.Body["device_keys"].(map[string]any)
			dev, _ := dk[alice.UserID].(map[string]any)["ALICEDEV"].(map[string]any)
			if r.Status != 200 || dev == nil || testutil.Canonical(t, dev) != testutil.Canonical(t, keys) || len(dk) != 1 {
				t.Fatalf("query: %d %s", r.Status, r.Raw)
			}
			unsigned, ok := dev["unsigned"].(map[string]any)
			if !ok {
				t.Fatalf("unsigned is %v, want an object", dev["unsigned"])
			}
			if _, hasName := unsigned["device_display_name"]; hasName != node.Config.Federation.AllowDeviceNames {
				t.Fatalf("allow_device_names=%v but unsigned is %v", node.Config.Federation.AllowDeviceNames, unsigned)
			}

			// /user/devices: the devices with keys and the current stream_id.
			r = testutil.SendTo(t, node, origin.SignedRequest(t, "GET", node.ServerName, devicesPath+url.PathEscape(alice.UserID), nil, "", nil))
			devices, _ := r.Body["devices"].([]any)
			if r.Status != 200 || r.Body["user_id"] != alice.UserID || len(devices) != 1 {
				t.Fatalf("user devices: %d %s", r.Status, r.Raw)
			}
			d := devices[0].(map[string]any)
			if d["device_id"] != "ALICEDEV" || testutil.Canonical(t, d["keys"]) != testutil.Canonical(t, keys) {
				t.Fatalf("device %v", d)
			}
			// The keys carry "unsigned" as /user/keys/query has them.
			if u, ok := d["keys"].(map[string]any)["unsigned"].(map[string]any); !ok || fmt.Sprint(u) != fmt.Sprint(unsigned) {
				t.Fatalf("/user/devices keys.unsigned is %v, /user/keys/query has %v", d["keys"].(map[string]any)["unsigned"], unsigned)
			}
			if (d["device_display_name"] == "phone") != node.Config.Federation.AllowDeviceNames {
				t.Fatalf("device_display_name %v with allow_device_names=%v", d["device_display_name"], node.Config.Federation.AllowDeviceNames)
			}
			stream, _ := r.Body["stream_id"].(float64)
			if stream <= 0 {
				t.Fatalf("stream_id %v", r.Body["stream_id"])
			}
			// A change moves the stream_id on.
			node.Must(t, "PUT", "/_matrix/client/v3/devices/ALICEDEV", alice.Token, map[string]string{"display_name": "renamed"})
			r = testutil.SendTo(t, node, origin.SignedRequest(t, "GET", node.ServerName, devicesPath+url.PathEscape(alice.UserID), nil, "", nil))
			if s, _ := r.Body["stream_id"].(float64); s <= stream {
				t.Fatalf("stream_id %v after a change, was %v", r.Body["stream_id"], stream)
			}
		}

		for _, tc := range []struct {
			name, user string
			status     int
			errcode    string
		}{
			{"remote user", "@bob:" + origin.Name, 400, "M_INVALID_PARAM"},
			{"unknown local user", "@nobody:" + n.ServerName, 404, "M_NOT_FOUND"},
			{"not a user ID", "nobody", 400, "M_INVALID_PARAM"},
		} {
			r := testutil.SendTo(t, n, origin.SignedRequest(t, "GET", n.ServerName, devicesPath+url.PathEscape(tc.user), nil, "", nil))
			if r.Status != tc.status || r.Errcode() != tc.errcode {
				t.Errorf("%s: %d %s", tc.name, r.Status, r.Raw)
			}
		}
		// Bad bodies are the sender's mistake.
		r := testutil.SendTo(t, n, origin.SignedRequest(t, "POST", n.ServerName, claimPath, map[string]any{"one_time_keys": 5}, "", nil))
		if r.Status != 400 || r.Errcode() != "M_BAD_JSON" {
			t.Errorf("bad claim body: %d %s", r.Status, r.Raw)
		}
	})
}
