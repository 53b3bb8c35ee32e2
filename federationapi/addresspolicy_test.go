package federationapi_test

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

// countingListener accepts TCP connections on loopback, counts them and
// closes them at once: it proves whether the daemon connected at all.
func countingListener(t *testing.T) (port string, accepted *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted = new(atomic.Int32)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	_, port, _ = net.SplitHostPort(ln.Addr().String())
	return port, accepted
}

// checkFailure asserts that a failure entry is a status and a fixed
// message with nothing of the dial error in it.
func checkFailure(t *testing.T, what string, resp map[string]any, server, port string) {
	t.Helper()
	f, ok := failuresOf(resp)[server].(map[string]any)
	if !ok {
		t.Fatalf("%s: no failure for %s: %v", what, server, resp)
	}
	if status, _ := f["status"].(float64); status != 503 {
		t.Errorf("%s: status %v, want 503", what, f["status"])
	}
	msg := fmt.Sprint(f["message"])
	for _, leak := range []string{port, "127.0.0.1", "::", "localhost", "dial", "refused", "tcp", "denied", "reset", "EOF", "tls"} {
		if strings.Contains(strings.ToLower(msg), strings.ToLower(leak)) {
			t.Errorf("%s: failure message %q reveals %q", what, msg, leak)
		}
	}
	if len(f) != 2 {
		t.Errorf("%s: failure has fields beyond status and message: %v", what, f)
	}
}

// With the default denylist, users on loopback addresses (an IP literal,
// its IPv4-mapped IPv6 form, a DNS name resolving to loopback) are never
// contacted, for queries and claims alike, and the failure says nothing
// of the address.
func TestOutboundDenylist(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, func(c *config.Config) { c.Federation.IPRangeAllowlist = []string{} })
		bob := n.Register(t, "bob", "")
		port, accepted := countingListener(t)
		for _, server := range []string{"127.0.0.1:" + port, "[::ffff:127.0.0.1]:" + port, "localhost:" + port, "127.0.0.2:" + port} {
			user := "@victim:" + server
			r := query(t, n, bob, map[string][]string{user: {}}, 3000)
			checkFailure(t, "query "+server, r, server, port)
			c := n.Must(t, "POST", "/_matrix/client/v3/keys/claim", bob.Token, map[string]any{
				"one_time_keys": map[string]any{user: map[string]string{"DEV": "signed_curve25519"}}, "timeout": 3000})
			checkFailure(t, "claim "+server, c, server, port)
		}
		if a := accepted.Load(); a != 0 {
			t.Fatalf("the daemon opened %d connections to denied addresses", a)
		}
	})
}

// The allowlist opens a denied range again (test set-ups on loopback);
// a real connection failure is still reported without its details.
func TestOutboundAllowlist(t *testing.T) {
	n := testutil.StartNode(t, testutil.SQLite(t), func(c *config.Config) {
		c.Federation.IPRangeAllowlist = []string{"127.0.0.0/8"}
	})
	bob := n.Register(t, "bob", "")
	port, accepted := countingListener(t)
	server := "127.0.0.1:" + port
	r := query(t, n, bob, map[string][]string{"@victim:" + server: {}}, 3000)
	if accepted.Load() == 0 {
		t.Fatalf("no connection to an allowed address: %v", r)
	}
	checkFailure(t, "query", r, server, port)

	// A port nothing listens on: connection refused, reported alike.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	r = query(t, n, bob, map[string][]string{"@victim:127.0.0.1:" + closed: {}}, 3000)
	checkFailure(t, "closed port", r, "127.0.0.1:"+closed, closed)
}
