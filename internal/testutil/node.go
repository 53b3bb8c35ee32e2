package testutil

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/daemon"
	"github.com/keyserver/keyserver/internal/server"
)

// Node is a whole daemon on loopback, named after its federation address
// ("127.0.0.1:PORT") so other daemons reach it over real TLS and X-Matrix.
type Node struct {
	*Server
	Daemon   *daemon.Daemon
	Config   *config.Config
	Requests *RequestCounter
	t        testing.TB
}

// StartNode starts a daemon on db; adjust may change its configuration.
func StartNode(t testing.TB, db Database, adjust func(*config.Config)) *Node {
	t.Helper()
	fedLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.ServerName = fedLn.Addr().String()
	cfg.DataDir = filepath.Join(t.TempDir(), "data")
	cfg.Database = db.URI
	cfg.AdminToken = AdminToken
	cfg.ClientAPI.BcryptCost = 4
	cfg.Federation.Listen = fedLn.Addr().String()
	cfg.Federation.TLSInsecureSkipVerify = true // self-signed certificates on loopback
	// Every test server is on loopback, which outbound requests may not
	// reach by default.
	cfg.Federation.IPRangeAllowlist = []string{"127.0.0.0/8"}
	cfg.ClientAPI.Listen = "127.0.0.1:0"
	// Tests poll for conditions faster than any client would.
	cfg.ClientAPI.RateLimitPerSecond = 0
	// Tests log in many users from one address.
	cfg.ClientAPI.LoginRateLimit.PerSecond = 0
	cfg.ClientAPI.RegistrationRateLimit.PerSecond = 0
	cfg.ClientAPI.FailedLoginRateLimit.PerSecond = 0
	cfg.ClientAPI.ToDeviceRateLimit.PerSecond = 0
	if adjust != nil {
		adjust(cfg)
	}
	n := &Node{Config: cfg, Requests: &RequestCounter{counts: map[string]int{}}, t: t}
	n.start(fedLn)
	t.Cleanup(n.Stop)
	return n
}

func (n *Node) start(fedLn net.Listener) {
	n.t.Helper()
	clientAddr := n.Config.ClientAPI.Listen
	if n.Server != nil {
		clientAddr = strings.TrimPrefix(n.Server.URL, "http://") // same port across restarts
	}
	clientLn, err := listenRetry(clientAddr)
	if err != nil {
		n.t.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	if os.Getenv("KEYSERVER_TEST_LOG") != "" { // debug logs of every node, to stderr
		log.SetOutput(os.Stderr)
		log.SetLevel(logrus.DebugLevel)
		log = log.WithField("node", n.Config.ServerName).Logger
	}
	d, err := daemon.Start(context.Background(), n.Config, log,
		daemon.WithListeners(clientLn, fedLn), daemon.WithFederationMiddleware(n.Requests.middleware),
		daemon.WithTuning(testTuning))
	if err != nil {
		n.t.Fatal(err)
	}
	n.Daemon = d
	n.Server = &Server{URL: "http://" + d.ClientAddr(), ServerName: n.Config.ServerName, Service: d.Service(), Store: d.Store(),
		Updater: d.Server().Updater, Parts: d.Server()}
}

// testTuning shortens the waits of the background workers, so tests of
// retries and recovery take fractions of a second; the backoff logic is
// the same.
func testTuning(t *server.Tuning) {
	t.Federation.MinBackoff = time.Second
	t.Sender.MinRetry = 200 * time.Millisecond
	t.Updater.TimeoutBase, t.Updater.ErrorBase = 200*time.Millisecond, 200*time.Millisecond
	t.Updater.StartSpread = 100 * time.Millisecond
}

// listenRetry listens on addr, retrying briefly while a just-closed
// listener on the same port is released.
func listenRetry(addr string) (net.Listener, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil || time.Now().After(deadline) {
			return ln, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Stop shuts the daemon down (a no-op when it is stopped).
func (n *Node) Stop() {
	if n.Daemon == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.Daemon.Shutdown(ctx); err != nil {
		n.t.Errorf("shutdown %s: %v", n.Config.ServerName, err)
	}
	n.Daemon = nil
}

// Restart starts a stopped node again on the same addresses and database.
func (n *Node) Restart() {
	n.t.Helper()
	fedLn, err := listenRetry(n.Config.Federation.Listen)
	if err != nil {
		n.t.Fatal(err)
	}
	n.start(fedLn)
}

// RequestCounter counts the federation requests a node receives, by path.
type RequestCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func (c *RequestCounter) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		c.counts[r.Method+" "+r.URL.EscapedPath()]++
		c.mu.Unlock()
		next.ServeHTTP(w, r)
	})
}

// Count returns how many requests had method and a path starting with prefix.
func (c *RequestCounter) Count(method, prefix string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for k, v := range c.counts {
		if strings.HasPrefix(k, method+" "+prefix) {
			n += v
		}
	}
	return n
}
