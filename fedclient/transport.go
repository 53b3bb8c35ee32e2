package fedclient

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/matrix-org/gomatrixserverlib/fclient"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/iprange"
)

// ErrDeniedAddress is the error of a request to a server whose name
// resolves to an address outbound requests may not go to.
var ErrDeniedAddress = errors.New("the server's address is in a denied range")

// AddressPolicy decides which IP addresses outbound requests may connect
// to: any address not in Deny, and any address in Allow.
type AddressPolicy struct {
	Deny, Allow iprange.Set
}

// DefaultAddressPolicy denies every non-public address.
func DefaultAddressPolicy() *AddressPolicy {
	return &AddressPolicy{Deny: iprange.MustParse(iprange.NonPublic)}
}

// Allowed reports whether a may be connected to.
func (p *AddressPolicy) Allowed(a netip.Addr) bool {
	return p.Allow.Contains(a) || !p.Deny.Contains(a)
}

const (
	dialTimeout = 5 * time.Second
	// resolutionTTL is how long a server's resolved addresses (from
	// .well-known and SRV) are reused; a failed request forgets them.
	resolutionTTL = time.Hour
	// idleTransportTTL is how long the connections of a TLS server name
	// nobody has asked for are kept.
	idleTransportTTL = 5 * time.Minute
)

// transport sends requests for matrix:// URLs. It resolves server names
// with gomatrixserverlib's ResolveServer (IP literal or explicit port,
// then .well-known, SRV, port 8448) and connects only to addresses the
// policy allows. The check is in the dialer, after DNS, so it covers every
// way a name can lead to an address: A/AAAA records, SRV and .well-known
// targets, and the key fetches, which share this transport.
type transport struct {
	policy     *AddressPolicy
	skipVerify bool
	dialer     *net.Dialer

	mu        sync.Mutex
	byTLSName map[string]*namedTransport
	resolved  map[spec.ServerName]resolution
	lastReap  time.Time
}

type namedTransport struct {
	*http.Transport
	lastUsed time.Time
}

type resolution struct {
	results []fclient.ResolutionResult
	expires time.Time
}

func newTransport(policy *AddressPolicy, skipVerify bool) *transport {
	t := &transport{
		policy: policy, skipVerify: skipVerify,
		byTLSName: map[string]*namedTransport{}, resolved: map[spec.ServerName]resolution{},
	}
	t.dialer = &net.Dialer{Timeout: dialTimeout, Control: t.control}
	return t
}

// control runs for each address the dialer tries, after name resolution
// and before the connection is opened.
func (t *transport) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil || !t.policy.Allowed(ap.Addr()) {
		return fmt.Errorf("%w: %s", ErrDeniedAddress, address)
	}
	return nil
}

// RoundTrip sends r to the first of the server's resolved addresses that
// answers. When all fail, the resolution is forgotten and tried once more
// afresh, as gomatrixserverlib's own transport does.
func (t *transport) RoundTrip(r *http.Request) (*http.Response, error) {
	serverName := spec.ServerName(r.URL.Host)
	var lastErr error
	for attempt := 0; attempt < 2; attempt++ {
		results, cached, err := t.resolve(r.Context(), serverName)
		if err != nil {
			return nil, err
		}
		for _, res := range results {
			req := r.Clone(r.Context())
			if lastErr != nil && r.GetBody != nil { // the first attempt consumed the body
				if req.Body, err = r.GetBody(); err != nil {
					return nil, err
				}
			}
			u := *r.URL
			u.Scheme, u.Host = "https", res.Destination
			req.URL, req.Host = &u, string(res.Host)
			resp, err := t.forTLSName(res.TLSServerName).RoundTrip(req)
			if err == nil {
				return resp, nil
			}
			lastErr = err
		}
		t.forget(serverName)
		if !cached || errors.Is(lastErr, ErrDeniedAddress) {
			break
		}
	}
	if lastErr == nil {
		lastErr = fmt.Errorf("no address found for %s", serverName)
	}
	return nil, lastErr
}

// resolve returns where to send requests for serverName, and whether the
// answer came from the cache.
func (t *transport) resolve(ctx context.Context, serverName spec.ServerName) ([]fclient.ResolutionResult, bool, error) {
	now := time.Now()
	t.mu.Lock()
	if res, ok := t.resolved[serverName]; ok && now.Before(res.expires) {
		t.mu.Unlock()
		return res.results, true, nil
	}
	t.mu.Unlock()
	host, port, ok := spec.ParseAndValidateServerName(serverName)
	if !ok {
		return nil, false, fmt.Errorf("invalid server name %q", serverName)
	}
	if _, err := netip.ParseAddr(host); err != nil && host[0] != '[' && port == -1 {
		// ResolveServer fetches https://host/.well-known/matrix/server
		// with an HTTP client of its own, which this dialer does not
		// guard: check the host's addresses before it does.
		addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		if err == nil {
			for _, a := range addrs {
				if !t.policy.Allowed(a) {
					return nil, false, fmt.Errorf("%w: %s resolves to %s", ErrDeniedAddress, host, a)
				}
			}
		}
	}
	results, err := fclient.ResolveServer(ctx, serverName)
	if err != nil {
		return nil, false, err
	}
	t.mu.Lock()
	for name, res := range t.resolved {
		if now.After(res.expires) {
			delete(t.resolved, name)
		}
	}
	t.resolved[serverName] = resolution{results: results, expires: now.Add(resolutionTTL)}
	t.mu.Unlock()
	return results, false, nil
}

func (t *transport) forget(serverName spec.ServerName) {
	t.mu.Lock()
	delete(t.resolved, serverName)
	t.mu.Unlock()
}

// forTLSName returns the HTTP transport for one TLS server name: a
// transport's TLS configuration names one server, and SRV and .well-known
// targets are checked against the server name, not the host dialed.
func (t *transport) forTLSName(name string) *http.Transport {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if now.Sub(t.lastReap) > time.Minute {
		t.lastReap = now
		for n, tr := range t.byTLSName {
			if now.Sub(tr.lastUsed) > idleTransportTTL {
				tr.CloseIdleConnections()
				delete(t.byTLSName, n)
			}
		}
	}
	tr := t.byTLSName[name]
	if tr == nil {
		tr = &namedTransport{Transport: &http.Transport{
			DialContext:         t.dialer.DialContext,
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     idleTransportTTL,
			TLSHandshakeTimeout: 10 * time.Second,
			ForceAttemptHTTP2:   true,
			TLSClientConfig: &tls.Config{
				ServerName:         name,
				InsecureSkipVerify: t.skipVerify, //nolint:gosec // test set-ups only, warned about at start-up
				ClientSessionCache: tls.NewLRUClientSessionCache(0),
			},
		}}
		t.byTLSName[name] = tr
	}
	tr.lastUsed = now
	return tr.Transport
}
