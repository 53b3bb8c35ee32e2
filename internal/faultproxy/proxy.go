// Package faultproxy holds proxies that put faults between daemons in
// tests: Proxy stands in front of a server's federation listener and
// fails each one-way link (one sending server to this one) as told;
// Latency delays a TCP peer's answers.
//
// A Proxy listens on the address that is the server's name, so every
// other server reaches the server through it, and forwards to the
// server's real listener (or listeners, for instances sharing a
// database). It tells senders apart by the origin of their X-Matrix
// Authorization header; requests without one (key fetches) always pass.
package faultproxy

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is what a link does with a request.
type Mode int

const (
	// Pass forwards the request and its answer.
	Pass Mode = iota
	// Refuse resets the connection without forwarding the request.
	Refuse
	// Hang holds the request unanswered, without forwarding it, until the
	// link's fault changes or the sender gives up; then the connection is
	// closed.
	Hang
	// DropAnswer forwards the request, reads the whole answer, and then
	// resets the connection instead of answering: the request took effect
	// but the sender cannot know it.
	DropAnswer
	// Delay forwards the request after Fault.Delay.
	Delay
)

func (m Mode) String() string {
	return [...]string{"pass", "refuse", "hang", "drop-answer", "delay"}[m]
}

// Fault is a link's behaviour.
type Fault struct {
	Mode  Mode
	Delay time.Duration // for Delay
}

// Request is what OnRequest is told of each request with an origin.
type Request struct {
	Origin, Method, Path string
	// RemoteAddr is the sender's end of the connection.
	RemoteAddr string
	Fault      Fault
	// Status is the backend's answer (0 if it was not forwarded or
	// failed).
	Status int
}

// Proxy is a fault-injecting TLS proxy in front of one server's
// federation listener(s).
type Proxy struct {
	ln       net.Listener
	srv      *http.Server
	client   *http.Client
	backends []string
	next     atomic.Uint64

	mu     sync.Mutex
	faults map[string]Fault
	// changed is closed (and replaced) whenever the faults change, to
	// end hanging requests.
	changed chan struct{}

	// OnRequest, if set before the first request, is called after each
	// request that names an origin.
	OnRequest func(Request)
}

// New starts a proxy on ln (which it serves over TLS with a self-signed
// certificate) forwarding to the TLS listeners at backends
// ("host:port"), spread over them and skipping those that refuse.
func New(ln net.Listener, backends ...string) (*Proxy, error) {
	cert, err := selfSigned()
	if err != nil {
		return nil, err
	}
	p := &Proxy{backends: backends, faults: map[string]Fault{}, changed: make(chan struct{})}
	p.client = &http.Client{
		Transport: &http.Transport{
			TLSClientConfig:     &tls.Config{InsecureSkipVerify: true}, // the daemons' self-signed certificates
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     30 * time.Second,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	// HTTP/1.1 only, so that a connection can be taken over and reset.
	p.ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}})
	p.srv = &http.Server{Handler: http.HandlerFunc(p.serve), ReadHeaderTimeout: 30 * time.Second}
	go func() { _ = p.srv.Serve(p.ln) }()
	return p, nil
}

// Addr is the address the proxy listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops the proxy, closing every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
	err := p.srv.Close()
	p.client.CloseIdleConnections()
	return err
}

// Set sets the fault of the link from origin.
func (p *Proxy) Set(origin string, f Fault) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f.Mode == Pass {
		delete(p.faults, origin)
	} else {
		p.faults[origin] = f
	}
	close(p.changed)
	p.changed = make(chan struct{})
}

// Clear ends every fault.
func (p *Proxy) Clear() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.faults = map[string]Fault{}
	close(p.changed)
	p.changed = make(chan struct{})
}

// FaultOf returns the fault of the link from origin.
func (p *Proxy) FaultOf(origin string) Fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faults[origin]
}

func (p *Proxy) fault(origin string) (Fault, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faults[origin], p.changed
}

// Origin returns the origin named by an X-Matrix Authorization header, or
// "".
func Origin(authorization string) string {
	scheme, params, ok := strings.Cut(authorization, " ")
	if !ok || !strings.EqualFold(scheme, "X-Matrix") {
		return ""
	}
	for _, kv := range strings.Split(params, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if ok && strings.EqualFold(strings.TrimSpace(k), "origin") {
			return strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	return ""
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) {
	origin := Origin(r.Header.Get("Authorization"))
	f, changed := p.fault(origin)
	if origin == "" {
		f = Fault{}
	}
	status := 0
	// report tells OnRequest, before the sender learns the outcome.
	report := func() {
		if origin != "" && p.OnRequest != nil {
			p.OnRequest(Request{Origin: origin, Method: r.Method, Path: r.URL.Path, RemoteAddr: r.RemoteAddr, Fault: f, Status: status})
		}
	}
	switch f.Mode {
	case Refuse:
		report()
		reset(w)
		return
	case Hang:
		select {
		case <-changed:
		case <-r.Context().Done():
		}
		report()
		reset(w)
		return
	case Delay:
		t := time.NewTimer(f.Delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			report()
			return
		}
	}
	resp, body, err := p.forward(r)
	if resp != nil {
		status = resp.StatusCode
	}
	report()
	if err != nil || f.Mode == DropAnswer {
		reset(w)
		return
	}
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(body)
}

// forward sends r to a backend, the next one in turn that accepts the
// connection, and reads the whole answer.
func (p *Proxy) forward(r *http.Request) (*http.Response, []byte, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, nil, err
	}
	start := p.next.Add(1)
	var lastErr error
	for i := range p.backends {
		backend := p.backends[(int(start)+i)%len(p.backends)]
		req, err := http.NewRequestWithContext(r.Context(), r.Method, "https://"+backend+r.URL.RequestURI(), strings.NewReader(string(body)))
		if err != nil {
			return nil, nil, err
		}
		req.Header = r.Header.Clone()
		req.Host = r.Host
		resp, err := p.client.Do(req)
		if err != nil {
			lastErr = err
			var op *net.OpError
			if errors.As(err, &op) && op.Op == "dial" {
				continue // a backend that is down: the next one
			}
			return nil, nil, err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, nil, err
		}
		return resp, b, nil
	}
	return nil, nil, lastErr
}

// reset closes the request's connection at once, with a TCP reset, and
// without an answer.
func reset(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	c, _, err := hj.Hijack()
	if err != nil {
		return
	}
	if tc, ok := c.(*tls.Conn); ok {
		if nc, ok := tc.NetConn().(*net.TCPConn); ok {
			_ = nc.SetLinger(0)
		}
	}
	_ = c.Close()
}

func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "faultproxy"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
