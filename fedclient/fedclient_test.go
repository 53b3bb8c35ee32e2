package fedclient

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/iprange"
)

// clock is a controllable time source.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newTestClient(t *testing.T, h http.Handler, o Options) (*Client, string, *clock) {
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	clk := &clock{now: time.Unix(1_700_000_000, 0)}
	log := logrus.New()
	log.SetOutput(io.Discard)
	o.ServerName, o.KeyID, o.PrivateKey, o.SkipVerify, o.Now, o.Logger = "origin.test", "ed25519:k", priv, true, clk.Now, log
	if o.AddressPolicy == nil { // the test server is on loopback
		o.AddressPolicy = &AddressPolicy{Allow: iprange.MustParse([]string{"127.0.0.0/8"})}
	}
	return New(o), strings.TrimPrefix(srv.URL, "https://"), clk
}

func TestRequestsAreSignedAndBounded(t *testing.T) {
	var inFlight, peak atomic.Int32
	release := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.Header.Get("Authorization"), "X-Matrix origin=\"origin.test\"") {
			t.Errorf("unsigned request: %q", r.Header.Get("Authorization"))
		}
		n := inFlight.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		<-release
		inFlight.Add(-1)
		_, _ = w.Write([]byte(`{}`))
	})
	c, dest, _ := newTestClient(t, h, Options{MaxInFlight: 2})
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Do(context.Background(), "GET", dest, "/_matrix/federation/v1/version", nil, nil); err != nil {
				t.Error(err)
			}
		}()
	}
	deadline := time.Now().Add(10 * time.Second)
	for inFlight.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("requests never arrived")
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	if p := peak.Load(); p != 2 {
		t.Fatalf("%d requests in flight at once, want 2", p)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.dests) != 0 {
		t.Fatalf("%d destinations remembered after they went idle", len(c.dests))
	}
}

func TestBackoff(t *testing.T) {
	var status atomic.Int32
	var calls atomic.Int32
	status.Store(500)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if status.Load() == 429 {
			w.Header().Set("Retry-After", "120")
		}
		w.WriteHeader(int(status.Load()))
		_, _ = w.Write([]byte(`{"errcode":"M_UNKNOWN","error":"no"}`))
	})
	c, dest, clk := newTestClient(t, h, Options{MinBackoff: time.Second, MaxBackoff: time.Minute})
	do := func() error { return c.Do(context.Background(), "GET", dest, "/x", nil, nil) }

	// Failures back off, doubling, capped.
	var last time.Duration
	for i := 0; i < 8; i++ {
		var he *HTTPError
		if err := do(); !errors.As(err, &he) || he.Status != 500 {
			t.Fatalf("attempt %d: %v", i, err)
		}
		wait := c.Backoff(dest).Sub(clk.Now())
		if wait < last && wait < time.Minute || wait > time.Minute*5/4+time.Second {
			t.Fatalf("attempt %d: backoff %v after %v", i, wait, last)
		}
		last = wait
		// While backing off, nothing is sent, but for a destination
		// known to be up (WithLive), whose failures still count.
		var be *BackoffError
		if err := do(); !errors.As(err, &be) {
			t.Fatalf("request sent while backing off: %v", err)
		}
		if err := c.Do(WithLive(context.Background(), "elsewhere.test"), "GET", dest, "/x", nil, nil); !errors.As(err, &be) {
			t.Fatalf("request sent while backing off, live elsewhere: %v", err)
		}
		clk.Advance(wait + time.Millisecond)
	}
	if last < time.Minute {
		t.Fatalf("backoff never reached its cap: %v", last)
	}
	if n := calls.Load(); n != 8 {
		t.Fatalf("%d requests reached the server, want 8", n)
	}

	// Retry-After is honoured.
	status.Store(429)
	clk.Advance(2 * time.Minute)
	_ = do()
	if wait := c.Backoff(dest).Sub(clk.Now()); wait < time.Minute {
		t.Fatalf("Retry-After: 120 gave a backoff of %v", wait)
	}

	// A sign of life ends the backoff; an answer that is the request's
	// fault (404) does not start one.
	c.MarkAlive(dest)
	status.Store(404)
	if err := do(); Status(err) != 404 {
		t.Fatalf("after MarkAlive: %v", err)
	}
	if !c.Backoff(dest).IsZero() {
		t.Fatal("a 404 started a backoff")
	}

	// A live destination is sent to while backing off; its failure
	// backs it off further.
	status.Store(500)
	_ = do()
	before, n := c.Backoff(dest), calls.Load()
	if err := c.Do(WithLive(context.Background(), dest), "GET", dest, "/x", nil, nil); Status(err) != 500 || calls.Load() != n+1 {
		t.Fatalf("request to a live destination: %v", err)
	}
	if after := c.Backoff(dest); !after.After(before) {
		t.Fatalf("a live destination's failure did not count: backoff until %v, then %v", before, after)
	}
}

func TestRequestToItselfRefused(t *testing.T) {
	c, _, _ := newTestClient(t, http.NotFoundHandler(), Options{})
	if err := c.Do(context.Background(), "GET", "origin.test", "/x", nil, nil); err == nil {
		t.Fatal("sent a request to ourselves")
	}
}

// A server name without a port makes gomatrixserverlib fetch
// https://NAME/.well-known/matrix/server with a client of its own: a name
// that resolves to a denied address is refused before that happens.
func TestDeniedNameRefusedBeforeWellKnown(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	c := New(Options{ServerName: "origin.test", KeyID: "ed25519:k", PrivateKey: priv, Logger: logrus.New()})
	err := c.Do(context.Background(), "GET", "localhost", "/_matrix/federation/v1/version", nil, nil)
	if !errors.Is(err, ErrDeniedAddress) {
		t.Fatalf("request to localhost: %v, want ErrDeniedAddress", err)
	}
	if msg := PublicMessage(err); msg != "The server could not be reached" {
		t.Errorf("PublicMessage = %q", msg)
	}
}
