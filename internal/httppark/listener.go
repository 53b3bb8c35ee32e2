package httppark

import (
	"net"
	"sync"
	"sync/atomic"
)

// Listener hands answered connections back to the http.Server serving on
// it. The connections are those the server accepted from its own
// listener, so whatever that listener counts per connection (the
// per-address cap) stays counted once, until the connection closes.
type Listener struct {
	conns     chan net.Conn
	closed    chan struct{}
	closeOnce sync.Once

	mu sync.Mutex
	// idle are the connections handed back whose client has sent nothing
	// since: the server counts them as new, not idle, so its graceful
	// Shutdown would wait for them; Close closes them itself.
	idle map[*backConn]struct{}
}

func newListener() *Listener {
	return &Listener{conns: make(chan net.Conn), closed: make(chan struct{}), idle: map[*backConn]struct{}{}}
}

// Accept returns the next connection handed back.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// handBack gives c to the server, or closes it once the listener is.
func (l *Listener) handBack(c *backConn) {
	l.mu.Lock()
	select {
	case <-l.closed:
		l.mu.Unlock()
		c.Close()
		return
	default:
	}
	c.waiting.Store(true)
	l.idle[c] = struct{}{}
	l.mu.Unlock()
	select {
	case l.conns <- c:
	case <-l.closed:
		c.Close()
	}
}

func (l *Listener) forget(c *backConn) {
	l.mu.Lock()
	delete(l.idle, c)
	l.mu.Unlock()
}

// Close stops Accept and closes the connections handed back that wait for
// their client's next request; connections handed back from then on are
// closed.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	l.mu.Lock()
	idle := make([]*backConn, 0, len(l.idle))
	for c := range l.idle {
		idle = append(idle, c)
	}
	l.mu.Unlock()
	for _, c := range idle {
		c.Close()
	}
	return nil
}

// Addr is a placeholder: the connections come from another listener.
func (l *Listener) Addr() net.Addr { return parkAddr{} }

type parkAddr struct{}

func (parkAddr) Network() string { return "parked" }
func (parkAddr) String() string  { return "parked" }

// backConn is a connection that has been parked. It replays the bytes the
// server had read ahead when it was taken over, and tells the listener
// when its client speaks again. A connection parked again keeps its one
// wrapper.
type backConn struct {
	net.Conn
	l       *Listener
	pending []byte
	waiting atomic.Bool // handed back, nothing read since
}

func (c *backConn) Read(b []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(b, c.pending)
		c.pending = c.pending[n:]
		if len(c.pending) == 0 {
			c.pending = nil
		}
		c.active()
		return n, nil
	}
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.active()
	}
	return n, err
}

func (c *backConn) active() {
	if c.waiting.CompareAndSwap(true, false) {
		c.l.forget(c)
	}
}

func (c *backConn) Close() error {
	c.active()
	return c.Conn.Close()
}

// NetConn returns the connection underneath.
func (c *backConn) NetConn() net.Conn { return c.Conn }
