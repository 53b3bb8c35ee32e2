package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// echoServer answers each request with what it received, counting the
// connections made to it.
func echoServer(t *testing.T, tlsServer bool) (*httptest.Server, *atomic.Int64) {
	var conns atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/base/close":
			w.Header().Set("Connection", "close")
		case "/base/chunked":
			w.(http.Flusher).Flush() // no Content-Length: the answer is chunked
		}
		fmt.Fprintf(w, "%s %s|%s|%s|%d|%s", r.Method, r.URL.RequestURI(), r.Header.Get("Authorization"),
			r.Header.Get("Content-Type"), r.ContentLength, body)
	})
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	if tlsServer {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv, &conns
}

// A client's requests go out whole on one kept-alive connection, and
// their answers come back whole, over http and https.
func TestClientConnKeepsOneConnection(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(fmt.Sprint("tls=", secure), func(t *testing.T) {
			srv, conns := echoServer(t, secure)
			conf := srv.Client().Transport.(*http.Transport).TLSClientConfig
			c, err := newClientConn(srv.URL+"/base/", conf)
			if err != nil {
				t.Fatal(err)
			}
			defer c.close()
			for i := range 20 {
				body := fmt.Sprintf(`{"n":%d}`, i)
				status, raw, err := c.do(context.Background(), "PUT", fmt.Sprintf("/x/%d?a=b", i), "tok", []byte(body))
				want := fmt.Sprintf("PUT /base/x/%d?a=b|Bearer tok|application/json|%d|%s", i, len(body), body)
				if err != nil || status != 200 || string(raw) != want {
					t.Fatalf("request %d: %d %q %v, want %q", i, status, raw, err, want)
				}
			}
			status, raw, err := c.do(context.Background(), "GET", "/chunked", "", nil)
			if err != nil || status != 200 || string(raw) != "GET /base/chunked|||0|" {
				t.Fatalf("chunked answer: %d %q %v", status, raw, err)
			}
			if n := conns.Load(); n != 1 {
				t.Fatalf("%d connections for 21 requests", n)
			}
		})
	}
}

// A connection the server closed while it was idle is made again and the
// request sent on it; one the server says it closes is not used again.
func TestClientConnRedials(t *testing.T) {
	srv, conns := echoServer(t, false)
	c, err := newClientConn(srv.URL+"/base", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	do := func(path string) string {
		t.Helper()
		status, raw, err := c.do(context.Background(), "POST", path, "", []byte("{}"))
		if err != nil || status != 200 {
			t.Fatalf("%s: %d %q %v", path, status, raw, err)
		}
		return string(raw)
	}
	do("/a")
	srv.CloseClientConnections()
	if got := do("/b"); !strings.HasPrefix(got, "POST /base/b|") {
		t.Fatalf("after the server closed the connection: %q", got)
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
	do("/close")
	do("/c")
	if n := conns.Load(); n != 3 {
		t.Fatalf("%d connections after an answer with Connection: close, want 3", n)
	}
	srv.Close()
	if _, _, err := c.do(context.Background(), "POST", "/d", "", nil); err == nil {
		t.Fatal("a request to a server that is gone succeeded")
	}
}

// A request that times out, or whose context is cancelled, ends with an
// error and is not sent again.
func TestClientConnDoesNotResendWhatTimedOut(t *testing.T) {
	var arrived atomic.Int64
	release := make(chan struct{})
	slow := make(chan struct{}, 2) // one for each slow request that arrives
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Add(1)
		if r.URL.Path == "/slow" {
			slow <- struct{}{}
			<-release
		}
	}))
	defer srv.Close()
	defer close(release)
	c, err := newClientConn(srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	c.timeout = 200 * time.Millisecond
	if _, _, err := c.do(context.Background(), "POST", "/fast", "", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.do(context.Background(), "POST", "/slow", "", []byte("{}")); err == nil {
		t.Fatal("a request with no answer within its timeout succeeded")
	}
	if n := arrived.Load(); n != 2 {
		t.Fatalf("%d requests arrived, want 2: the one that timed out was sent again", n)
	}
	c.timeout = time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	<-slow // the request that timed out
	go func() {
		<-slow // this one
		cancel()
	}()
	if _, _, err := c.do(ctx, "POST", "/slow", "", []byte("{}")); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request: %v", err)
	}
	if n := arrived.Load(); n != 3 {
		t.Fatalf("%d requests arrived, want 3", n)
	}
}

func TestClientConnRefusesOtherSchemes(t *testing.T) {
	if _, err := newClientConn("ftp://example.org", nil); err == nil {
		t.Fatal("ftp URL accepted")
	}
}
