package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"syscall"
	"time"
)

// A phase's client sends its requests on a keep-alive connection of its
// own, written and read by the client's goroutine. net/http's client hands
// each request to the two goroutines it keeps per connection (one writes,
// one reads) and the answer back, waking a thread at each hand-off: on the
// machine the tool shares with the daemons it measures, that cost about as
// much CPU per request as the rest of the tool, CPU the daemons then lack,
// and put the tool's own scheduling into the latencies it reports. The
// answers are read by net/http's own parser (http.ReadResponse).

// clientConn is a client's connection to one base URL.
type clientConn struct {
	host   string      // Host header
	addr   string      // host:port to dial
	tls    *tls.Config // for https, else nil
	prefix string      // the base URL's path, before each request's
	// timeout bounds one request (requestTimeout).
	timeout time.Duration
	nc      net.Conn
	br      *bufio.Reader
	buf     []byte // the request being written
}

// newClientConn is a connection to base, made at its first request;
// tlsConf, when not nil, is used for https instead of the system's roots.
func newClientConn(base string, tlsConf *tls.Config) (*clientConn, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, err
	}
	c := &clientConn{host: u.Host, addr: u.Host, prefix: u.EscapedPath(), timeout: requestTimeout}
	switch u.Scheme {
	case "http":
		if u.Port() == "" {
			c.addr = net.JoinHostPort(u.Hostname(), "80")
		}
	case "https":
		c.tls = &tls.Config{}
		if tlsConf != nil {
			c.tls = tlsConf.Clone()
		}
		if c.tls.ServerName == "" {
			c.tls.ServerName = u.Hostname()
		}
		if u.Port() == "" {
			c.addr = net.JoinHostPort(u.Hostname(), "443")
		}
	default:
		return nil, fmt.Errorf("%s: not an http or https URL", base)
	}
	for len(c.prefix) > 0 && c.prefix[len(c.prefix)-1] == '/' {
		c.prefix = c.prefix[:len(c.prefix)-1]
	}
	return c, nil
}

// requestTimeout bounds one request, as the set-up's http.Client does.
const requestTimeout = 30 * time.Second

// do sends one request and returns the answer's status and body. A
// kept-alive connection the server had closed (the request found it shut,
// and no answer came) is made again and the request sent on it, once; a
// request that timed out is not sent again. A cancelled ctx ends the
// request under way.
func (c *clientConn) do(ctx context.Context, method, path, token string, body []byte) (int, []byte, error) {
	for attempt := 0; ; attempt++ {
		reused := c.nc != nil
		if !reused {
			if err := c.dial(ctx); err != nil {
				return 0, nil, err
			}
		}
		stop := func() bool { return false }
		if ctx.Done() != nil {
			nc := c.nc
			stop = context.AfterFunc(ctx, func() { nc.SetDeadline(time.Now()) })
		}
		status, raw, answered, err := c.roundTrip(method, path, token, body)
		stop()
		if err == nil {
			return status, raw, nil
		}
		c.close()
		if ctx.Err() != nil {
			return 0, nil, ctx.Err()
		}
		if !reused || answered || attempt > 0 || !closedByServer(err) {
			return 0, nil, err
		}
	}
}

// closedByServer says whether err is a connection the other side had shut.
func closedByServer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func (c *clientConn) dial(ctx context.Context) error {
	d := net.Dialer{Timeout: c.timeout}
	nc, err := d.DialContext(ctx, "tcp", c.addr)
	if err != nil {
		return err
	}
	if c.tls != nil {
		tc := tls.Client(nc, c.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return err
		}
		nc = tc
	}
	c.nc, c.br = nc, bufio.NewReaderSize(nc, 16<<10)
	return nil
}

func (c *clientConn) close() {
	if c.nc != nil {
		c.nc.Close()
		c.nc, c.br = nil, nil
	}
}

// roundTrip writes the request in one write and reads its answer;
// answered says whether any of the answer had arrived when it failed.
func (c *clientConn) roundTrip(method, path, token string, body []byte) (status int, raw []byte, answered bool, err error) {
	b := c.buf[:0]
	b = append(b, method...)
	b = append(b, ' ')
	b = append(b, c.prefix...)
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, c.host...)
	b = append(b, "\r\nUser-Agent: keyserver-bench\r\n"...)
	if token != "" {
		b = append(b, "Authorization: Bearer "...)
		b = append(b, token...)
		b = append(b, "\r\n"...)
	}
	if body != nil {
		b = append(b, "Content-Type: application/json\r\nContent-Length: "...)
		b = strconv.AppendInt(b, int64(len(body)), 10)
		b = append(b, "\r\n\r\n"...)
		b = append(b, body...)
	} else {
		b = append(b, "\r\n"...)
	}
	c.buf = b
	if err := c.nc.SetDeadline(time.Now().Add(c.timeout)); err != nil {
		return 0, nil, false, err
	}
	if _, err := c.nc.Write(b); err != nil {
		return 0, nil, false, err
	}
	if _, err := c.br.Peek(1); err != nil {
		return 0, nil, false, err
	}
	resp, err := http.ReadResponse(c.br, &http.Request{Method: method})
	if err != nil {
		return 0, nil, true, err
	}
	raw, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, nil, true, err
	}
	if resp.Close {
		c.close()
	}
	return resp.StatusCode, raw, true, nil
}
