package clientapi_test

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"testing"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

// proxyLogin logs alice in from the loopback address local with the given
// X-Forwarded-For headers, and returns the new device's last_seen_ip.
func proxyLogin(t *testing.T, n *testutil.Node, local string, xff ...string) string {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}).DialContext,
	}}
	body, _ := json.Marshal(map[string]any{
		"type":       "m.login.password",
		"identifier": map[string]string{"type": "m.id.user", "user": "alice"},
		"password":   "pw-alice",
	})
	req, _ := http.NewRequest("POST", n.URL+"/_matrix/client/v3/login", bytes.NewReader(body))
	for _, h := range xff {
		req.Header.Add("X-Forwarded-For", h)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var login struct {
		AccessToken string `json:"access_token"`
		DeviceID    string `json:"device_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&login); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("login: %d %v", resp.StatusCode, err)
	}
	d := n.Must(t, "GET", "/_matrix/client/v3/devices/"+login.DeviceID, login.AccessToken, nil)
	ip, _ := d["last_seen_ip"].(string)
	return ip
}

// X-Forwarded-For is believed only from configured proxies, read from the
// right past every trusted hop; what a client writes into it itself, or
// sends without a proxy, is ignored.
func TestTrustedProxies(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, func(c *config.Config) {
			c.ClientAPI.TrustedProxies = []string{"127.0.0.1", "10.0.0.0/8"}
		})
		n.Register(t, "alice", "")
		for _, tt := range []struct {
			name, local string
			xff         []string
			want        string
		}{
			{"no header", "127.0.0.1", nil, "127.0.0.1"},
			{"from a trusted proxy", "127.0.0.1", []string{"203.0.113.9"}, "203.0.113.9"},
			{"port and spaces", "127.0.0.1", []string{" 203.0.113.9:5555 "}, "203.0.113.9"},
			{"IPv6", "127.0.0.1", []string{"2001:db8::7"}, "2001:db8::7"},
			{"client-written entries left of the proxy's", "127.0.0.1", []string{"198.51.100.1, 203.0.113.9"}, "203.0.113.9"},
			{"multi-hop chain", "127.0.0.1", []string{"198.51.100.1, 203.0.113.9, 10.1.2.3", "10.0.0.2"}, "203.0.113.9"},
			{"only proxies", "127.0.0.1", []string{"10.0.0.5, 10.0.0.2"}, "10.0.0.5"},
			{"garbage stops the walk", "127.0.0.1", []string{"203.0.113.9, unknown"}, "127.0.0.1"},
			{"spoofed from an untrusted peer", "127.0.0.2", []string{"203.0.113.9"}, "127.0.0.2"},
		} {
			if got := proxyLogin(t, n, tt.local, tt.xff...); got != tt.want {
				t.Errorf("%s: last_seen_ip %q, want %q", tt.name, got, tt.want)
			}
		}
	})
}

// Without trusted_proxies (the default) the header is ignored entirely.
func TestForwardedForIgnoredByDefault(t *testing.T) {
	n := testutil.StartNode(t, testutil.SQLite(t), nil)
	n.Register(t, "alice", "")
	if got := proxyLogin(t, n, "127.0.0.1", "203.0.113.9"); got != "127.0.0.1" {
		t.Errorf("last_seen_ip %q, want the peer's 127.0.0.1", got)
	}
}
