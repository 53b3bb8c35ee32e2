// Package fedclient sends signed requests to other Matrix servers: server
// discovery and TLS (through gomatrixserverlib's client), X-Matrix signing,
// a timeout on every request, a bound on requests in flight per
// destination, and a backoff for destinations that keep failing, so that
// one dead server answers at once with an error instead of slowing every
// query that names it.
package fedclient

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/fclient"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/metrics"
)

// Options configure a Client.
type Options struct {
	ServerName string
	KeyID      gomatrixserverlib.KeyID
	PrivateKey ed25519.PrivateKey
	// SkipVerify accepts any TLS certificate: for test set-ups only.
	SkipVerify bool
	// AddressPolicy says which IP addresses requests may connect to;
	// nil denies every non-public address (DefaultAddressPolicy).
	AddressPolicy *AddressPolicy
	// Timeout bounds each request (default 30 s); callers' contexts may
	// bound it further.
	Timeout time.Duration
	// MaxInFlight bounds the requests in flight to one destination (default 8).
	MaxInFlight int
	// Backoff after a destination's first failure (default 2 s), doubled per
	// further failure up to MaxBackoff (default 10 min).
	MinBackoff, MaxBackoff time.Duration
	Logger                 logrus.FieldLogger
	Now                    func() time.Time
}

// Client is a signing federation client.
type Client struct {
	opts Options
	http *fclient.Client

	mu    sync.Mutex
	dests map[string]*destination // only destinations in use or failing
}

// destination is what is known of one remote server. An entry exists while
// requests are in flight or the server is backing off, and is dropped
// after, so the map stays as large as the set of busy or failing servers.
type destination struct {
	slots    chan struct{}
	inFlight int
	failures int
	retryAt  time.Time
}

// New makes a Client.
func New(o Options) *Client {
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 8
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 2 * time.Second
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 10 * time.Minute
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = logrus.StandardLogger()
	}
	if o.AddressPolicy == nil {
		o.AddressPolicy = DefaultAddressPolicy()
	}
	return &Client{
		opts: o,
		http: fclient.NewClient(fclient.WithTransport(newTransport(o.AddressPolicy, o.SkipVerify)),
			fclient.WithTimeout(o.Timeout), fclient.WithUserAgent("keyserver")),
		dests: map[string]*destination{},
	}
}

// HTTPError is a non-2xx answer.
type HTTPError struct {
	Destination string
	Status      int
	Errcode     string
	Message     string
	RetryAfter  time.Duration
}

func (e *HTTPError) Error() string {
	return fmt.Sprintf("%s answered %d %s %s", e.Destination, e.Status, e.Errcode, e.Message)
}

// StatusCode, ErrCode and ErrMessage describe the answer to callers
// that declare what they need of it.
func (e *HTTPError) StatusCode() int    { return e.Status }
func (e *HTTPError) ErrCode() string    { return e.Errcode }
func (e *HTTPError) ErrMessage() string { return e.Message }

// BackoffError is returned without contacting a destination that is
// backing off after failures.
type BackoffError struct {
	Destination string
	Until       time.Time
}

func (e *BackoffError) Error() string {
	return fmt.Sprintf("%s is unreachable; not retrying before %s", e.Destination, e.Until.UTC().Format(time.RFC3339))
}

// Status is what a failure says about the destination's health, for
// callers that report failures to clients.
func Status(err error) int {
	var he *HTTPError
	if errors.As(err, &he) {
		return he.Status
	}
	return http.StatusServiceUnavailable
}

// PublicMessage describes a failure for clients in a few fixed words.
// The error itself may carry addresses, ports and dial errors, which would
// let a user map the network the server can reach, so it goes to the logs
// only. A denied address reads like an unreachable server.
func PublicMessage(err error) string {
	var he *HTTPError
	var be *BackoffError
	switch {
	case errors.As(err, &be):
		return "Not ready for retry"
	case errors.As(err, &he):
		return "The server answered with an error"
	case errors.Is(err, context.DeadlineExceeded):
		return "The server did not answer in time"
	case errors.Is(err, ErrDeniedAddress), errors.As(err, new(net.Error)):
		return "The server could not be reached"
	default:
		return "The request to the server failed"
	}
}

// liveKey marks a context whose requests go to a destination known to be
// up (WithLive).
type liveKey struct{}

// WithLive returns a context whose requests to dest are sent even while
// dest backs off (their failures still count): for work done while dest
// is making a request to us, such as fetching what its transaction
// refers to, which the failure of one of its endpoints a moment earlier
// must not stop.
func WithLive(ctx context.Context, dest string) context.Context {
	return context.WithValue(ctx, liveKey{}, dest)
}

// acquire takes a request slot for dest, or refuses while it backs off.
func (c *Client) acquire(ctx context.Context, dest string) (*destination, error) {
	c.mu.Lock()
	d := c.dests[dest]
	if d == nil {
		d = &destination{slots: make(chan struct{}, c.opts.MaxInFlight)}
		c.dests[dest] = d
	}
	if now := c.opts.Now(); now.Before(d.retryAt) && ctx.Value(liveKey{}) != dest {
		until := d.retryAt
		c.mu.Unlock()
		return nil, &BackoffError{Destination: dest, Until: until}
	}
	d.inFlight++
	c.mu.Unlock()
	select {
	case d.slots <- struct{}{}:
		return d, nil
	case <-ctx.Done():
		c.mu.Lock()
		d.inFlight--
		c.forgetIfIdle(dest, d)
		c.mu.Unlock()
		return nil, ctx.Err()
	}
}

// forgetIfIdle drops a healthy destination nobody is using; mu is held.
func (c *Client) forgetIfIdle(dest string, d *destination) {
	if d.inFlight == 0 && d.failures == 0 {
		delete(c.dests, dest)
	}
}

// release returns a slot and records the outcome: err nil or an answer
// from the server clears the failures; a network failure, timeout or 5xx
// adds one.
func (c *Client) release(dest string, d *destination, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	<-d.slots
	d.inFlight--
	switch {
	case err != nil && errors.Is(err, context.Canceled):
		// The caller gave up: that says nothing about the server.
	case err != nil && isServerFailure(err):
		metrics.FederationFailure(dest)
		d.failures++
		wait := c.opts.MinBackoff << min(d.failures-1, 20)
		var he *HTTPError
		if errors.As(err, &he) && he.RetryAfter > wait {
			wait = he.RetryAfter
		}
		wait = min(wait, c.opts.MaxBackoff)
		// Jitter spreads retries of many servers that failed together.
		wait += time.Duration(rand.Int64N(int64(wait)/4 + 1))
		d.retryAt = c.opts.Now().Add(wait)
		if d.failures == 3 {
			c.opts.Logger.WithFields(logrus.Fields{"destination": dest, "error": err.Error()}).
				Warn("remote server keeps failing; backing off")
		}
	default:
		d.failures, d.retryAt = 0, time.Time{}
	}
	c.forgetIfIdle(dest, d)
}

func isServerFailure(err error) bool {
	var he *HTTPError
	if errors.As(err, &he) {
		return he.Status >= 500 || he.Status == http.StatusTooManyRequests
	}
	return true // network error, TLS failure, timeout
}

// MarkAlive ends a destination's backoff: it has just shown it is up (by
// sending us an authenticated request).
func (c *Client) MarkAlive(dest string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d := c.dests[dest]; d != nil {
		d.failures, d.retryAt = 0, time.Time{}
		c.forgetIfIdle(dest, d)
	}
}

// Backoff reports until when a destination is being left alone (zero when
// it is not).
func (c *Client) Backoff(dest string) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if d := c.dests[dest]; d != nil {
		return d.retryAt
	}
	return time.Time{}
}

// Do sends a signed request to dest and decodes a 2xx JSON answer into out.
func (c *Client) Do(ctx context.Context, method, dest, path string, body, out any) error {
	if dest == c.opts.ServerName {
		return fmt.Errorf("refusing to send a federation request to ourselves (%s)", dest)
	}
	d, err := c.acquire(ctx, dest)
	if err != nil {
		return err
	}
	err = c.do(ctx, method, dest, path, body, out)
	c.release(dest, d, err)
	return err
}

func (c *Client) do(ctx context.Context, method, dest, path string, body, out any) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	r := fclient.NewFederationRequest(method, spec.ServerName(c.opts.ServerName), spec.ServerName(dest), path)
	if body != nil {
		if err := r.SetContent(body); err != nil {
			return err
		}
	}
	if err := r.Sign(spec.ServerName(c.opts.ServerName), c.opts.KeyID, c.opts.PrivateKey); err != nil {
		return err
	}
	req, err := r.HTTPRequest()
	if err != nil {
		return err
	}
	resp, err := c.http.DoHTTPRequest(ctx, req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, dest, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, dest, err)
	}
	if len(raw) > maxResponseBytes {
		return fmt.Errorf("%s %s: answer larger than %d bytes", method, dest, maxResponseBytes)
	}
	if resp.StatusCode/100 != 2 {
		he := &HTTPError{Destination: dest, Status: resp.StatusCode}
		var e struct {
			Errcode      string `json:"errcode"`
			Error        string `json:"error"`
			RetryAfterMS int64  `json:"retry_after_ms"`
		}
		if json.Unmarshal(raw, &e) == nil {
			he.Errcode, he.Message = e.Errcode, e.Error
			he.RetryAfter = time.Duration(e.RetryAfterMS) * time.Millisecond
		}
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			he.RetryAfter = time.Duration(s) * time.Second
		}
		return he
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return &HTTPError{Destination: dest, Status: http.StatusBadGateway, Message: "answer is not the expected JSON: " + err.Error()}
	}
	return nil
}

// maxResponseBytes caps what a remote server can make us read: 1000
// devices with keys and names fit well within it.
const maxResponseBytes = 16 << 20

// GetServerKeys fetches a server's published keys (for the key ring).
func (c *Client) GetServerKeys(ctx context.Context, server spec.ServerName) (gomatrixserverlib.ServerKeys, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	return c.http.GetServerKeys(ctx, server)
}

// LookupServerKeys is the notary query, which this server does not use:
// keys are fetched only from the servers they belong to.
func (c *Client) LookupServerKeys(context.Context, spec.ServerName, map[gomatrixserverlib.PublicKeyLookupRequest]spec.Timestamp) ([]gomatrixserverlib.ServerKeys, error) {
	return nil, errors.New("no notary servers are configured")
}
