package daemon_test

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/metrics"
	kstest "github.com/keyserver/keyserver/internal/testutil"
)

// dialFrom connects to addr from the loopback address local (Linux routes
// all of 127.0.0.0/8 to lo, so each is a distinct client address).
func dialFrom(t *testing.T, local, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, local, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// served sends GET /health on c and reports whether it was answered; a
// refused connection is closed by the server before it answers.
func served(c net.Conn) bool {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET /health HTTP/1.1\r\nHost: keyserver\r\n\r\n"); err != nil {
		return false
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode == http.StatusOK
}

// refusedCount reads keyserver_connections_refused_total{listener="client"}.
func refusedCount(t *testing.T) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "keyserver_connections_refused_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "listener" && l.GetValue() == "client" {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// A client that sends its headers and then its body a byte at a time is
// disconnected once the read timeout has passed.
func TestSlowBodyIsCutOff(t *testing.T) {
	n := kstest.StartNode(t, kstest.SQLite(t), func(c *config.Config) {
		c.ClientAPI.ReadTimeout = config.Duration(500 * time.Millisecond)
	})
	c := dialFrom(t, "127.0.0.1", strings.TrimPrefix(n.URL, "http://"))
	if _, err := io.WriteString(c, "POST /_matrix/client/v3/login HTTP/1.1\r\nHost: keyserver\r\n"+
		"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() { // one byte every 50 ms: far too slow for 1000 bytes in 500 ms
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := c.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(10 * time.Second))
	_, err := io.Copy(io.Discard, c) // until the server closes the connection
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("connection still open after %s", time.Since(start))
	}
}

// /sync waits longer than the read and write timeouts when the client asks
// it to, and still answers.
func TestLongPollOutlastsTimeouts(t *testing.T) {
	kstest.ForEachDatabase(t, func(t *testing.T, db kstest.Database) {
		n := kstest.StartNode(t, db, func(c *config.Config) {
			// Long enough for a registration's password hashing on a
			// loaded machine; the poll waits well past them.
			c.ClientAPI.ReadTimeout = config.Duration(time.Second)
			c.ClientAPI.WriteTimeout = config.Duration(time.Second)
		})
		alice := n.Register(t, "alice", "")
		first := n.Must(t, "GET", "/_matrix/client/v3/sync", alice.Token, nil)
		start := time.Now()
		r := n.Do(t, "GET", fmt.Sprintf("/_matrix/client/v3/sync?since=%s&timeout=2500", first["next_batch"]), alice.Token, nil)
		if r.Status != http.StatusOK {
			t.Fatalf("long poll: %d %s", r.Status, r.Raw)
		}
		if waited := time.Since(start); waited < 2400*time.Millisecond {
			t.Fatalf("long poll answered after %s, before its timeout", waited)
		}
	})
}

// One address may hold max_connections_per_address connections; the next
// is closed at once (and counted), other addresses and trusted proxies are
// not affected, and closing a connection frees its slot.
func TestConnectionCapPerAddress(t *testing.T) {
	n := kstest.StartNode(t, kstest.SQLite(t), func(c *config.Config) {
		c.ClientAPI.MaxConnectionsPerAddress = 3
		c.ClientAPI.TrustedProxies = []string{"127.0.0.3"}
	})
	addr := strings.TrimPrefix(n.URL, "http://")
	var held []net.Conn
	for i := 0; i < 3; i++ {
		c := dialFrom(t, "127.0.0.1", addr)
		if !served(c) {
			t.Fatalf("connection %d not served", i+1)
		}
		held = append(held, c)
	}
	refusedBefore := refusedCount(t)
	if served(dialFrom(t, "127.0.0.1", addr)) {
		t.Fatal("a fourth connection from one address was served")
	}
	if got := refusedCount(t) - refusedBefore; got != 1 {
		t.Errorf("refused connections counted: %v, want 1", got)
	}
	if !served(dialFrom(t, "127.0.0.2", addr)) {
		t.Fatal("another address was refused")
	}
	for i := 0; i < 5; i++ {
		if !served(dialFrom(t, "127.0.0.3", addr)) {
			t.Fatalf("trusted proxy's connection %d refused", i+1)
		}
	}
	// Closing one frees its slot once the server has seen the close.
	held[0].Close()
	kstest.Eventually(t, "a freed slot", func() bool { return served(dialFrom(t, "127.0.0.1", addr)) })
}

// The federation listener has a cap of its own, applied before TLS.
func TestFederationConnectionCap(t *testing.T) {
	n := kstest.StartNode(t, kstest.SQLite(t), func(c *config.Config) { c.Federation.MaxConnectionsPerAddress = 1 })
	handshake := func(local string) error {
		c := dialFrom(t, local, n.Config.Federation.Listen)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		return tls.Client(c, &tls.Config{InsecureSkipVerify: true}).Handshake()
	}
	if err := handshake("127.0.0.1"); err != nil {
		t.Fatalf("first connection: %v", err)
	}
	if err := handshake("127.0.0.1"); err == nil {
		t.Fatal("a second connection from one address completed TLS")
	}
	if err := handshake("127.0.0.2"); err != nil {
		t.Fatalf("another address: %v", err)
	}
}
