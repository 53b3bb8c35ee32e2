package faultproxy

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// backend is a TLS server counting the requests it answers.
func backend(t *testing.T) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	s := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		_, _ = io.WriteString(w, "ok "+r.URL.Path)
	}))
	t.Cleanup(s.Close)
	return s, &n
}

func startProxy(t *testing.T, backends ...string) *Proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(ln, backends...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func send(p *Proxy, origin string) (string, error) {
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true}}
	req, _ := http.NewRequest("PUT", "https://"+p.Addr()+"/_matrix/federation/v1/send/1", nil)
	if origin != "" {
		req.Header.Set("Authorization", `X-Matrix origin="`+origin+`",destination="d",key="ed25519:k",sig="s"`)
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestOrigin(t *testing.T) {
	for h, want := range map[string]string{
		`X-Matrix origin="a.example:8448",key="ed25519:1",sig="x"`: "a.example:8448",
		`X-Matrix key="ed25519:1", origin=b,sig="x"`:               "b",
		`x-matrix ORIGIN="c"`:                                      "c",
		`Bearer origin="a"`:                                        "",
		``:                                                         "",
	} {
		if got := Origin(h); got != want {
			t.Errorf("Origin(%q) = %q, want %q", h, got, want)
		}
	}
}

// Each mode does what it says to the link it is set on, and to no other.
func TestModes(t *testing.T) {
	b, count := backend(t)
	p := startProxy(t, b.Listener.Addr().String())
	var seen atomic.Int64
	p.OnRequest = func(Request) { seen.Add(1) }

	if got, err := send(p, "a"); err != nil || got != "ok /_matrix/federation/v1/send/1" {
		t.Fatalf("pass: %q %v", got, err)
	}
	if count.Load() != 1 {
		t.Fatalf("pass: backend saw %d", count.Load())
	}

	p.Set("a", Fault{Mode: Refuse})
	if _, err := send(p, "a"); err == nil {
		t.Fatal("refuse: answered")
	}
	if count.Load() != 1 {
		t.Fatalf("refuse: forwarded (%d)", count.Load())
	}
	// Other senders, and requests naming none, pass.
	if _, err := send(p, "b"); err != nil {
		t.Fatalf("other origin: %v", err)
	}
	if _, err := send(p, ""); err != nil {
		t.Fatalf("no origin: %v", err)
	}
	if count.Load() != 3 {
		t.Fatalf("backend saw %d, want 3", count.Load())
	}

	p.Set("a", Fault{Mode: DropAnswer})
	if _, err := send(p, "a"); err == nil {
		t.Fatal("drop-answer: answered")
	}
	if count.Load() != 4 {
		t.Fatalf("drop-answer: not delivered (%d)", count.Load())
	}

	p.Set("a", Fault{Mode: Hang})
	done := make(chan error, 1)
	go func() { _, err := send(p, "a"); done <- err }()
	select {
	case err := <-done:
		t.Fatalf("hang: answered (%v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	p.Set("a", Fault{Mode: Pass}) // ends the hanging request, unanswered
	if err := <-done; err == nil {
		t.Fatal("hang: answered once the fault ended")
	}
	if count.Load() != 4 {
		t.Fatalf("hang: forwarded (%d)", count.Load())
	}

	p.Set("a", Fault{Mode: Delay, Delay: 300 * time.Millisecond})
	start := time.Now()
	if _, err := send(p, "a"); err != nil {
		t.Fatalf("delay: %v", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("delay: answered after %v", d)
	}
	p.Clear()
	if _, err := send(p, "a"); err != nil {
		t.Fatalf("after clear: %v", err)
	}
	if count.Load() != 6 {
		t.Fatalf("backend saw %d, want 6", count.Load())
	}
	if seen.Load() != 7 { // every request naming an origin
		t.Fatalf("OnRequest called %d times, want 7", seen.Load())
	}
}

// With two backends, requests are spread over both, and a backend that
// is down is skipped.
func TestBackends(t *testing.T) {
	b1, c1 := backend(t)
	b2, c2 := backend(t)
	p := startProxy(t, b1.Listener.Addr().String(), b2.Listener.Addr().String())
	for range 4 {
		if _, err := send(p, "a"); err != nil {
			t.Fatal(err)
		}
	}
	if c1.Load() != 2 || c2.Load() != 2 {
		t.Fatalf("spread %d/%d", c1.Load(), c2.Load())
	}
	b2.Close()
	for range 4 {
		if _, err := send(p, "a"); err != nil {
			t.Fatal(err)
		}
	}
	if c1.Load() != 6 {
		t.Fatalf("backend 1 saw %d, want 6", c1.Load())
	}
}

// Latency holds the target's answers back by the delay set.
func TestLatency(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	l, err := NewLatency("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	echo := func() time.Duration {
		start := time.Now()
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 1)
		if _, err := io.ReadFull(c, b); err != nil || b[0] != 'x' {
			t.Fatalf("echo %q %v", b, err)
		}
		return time.Since(start)
	}
	echo()
	l.SetDelay(200 * time.Millisecond)
	if d := echo(); d < 200*time.Millisecond {
		t.Fatalf("answered after %v with a delay of 200ms", d)
	}
}
