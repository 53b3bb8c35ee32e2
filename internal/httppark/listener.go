package httppark

import (
	"net"
	"sync"
)

// Listener hands answered connections back to the http.Server serving on
// it. The connections are those the server accepted from its own
// listener, so whatever that listener counts per connection (the
// per-address cap) stays counted once, until the connection closes.
type Listener struct {
	conns     chan net.Conn
	closed    chan struct{}
	closeOnce sync.Once
}

func newListener() *Listener {
	return &Listener{conns: make(chan net.Conn), closed: make(chan struct{})}
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
func (l *Listener) handBack(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.closed:
		c.Close()
	}
}

// Close stops Accept; connections handed back from then on are closed.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return nil
}

// Addr is a placeholder: the connections come from another listener.
func (l *Listener) Addr() net.Addr { return parkAddr{} }

type parkAddr struct{}

func (parkAddr) Network() string { return "parked" }
func (parkAddr) String() string  { return "parked" }
