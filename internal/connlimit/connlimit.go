// Package connlimit caps the connections one remote address may hold open
// on a listener, so that a single client cannot exhaust the server's
// memory and file descriptors with connections it keeps idle or feeds
// slowly. It counts TCP peers: behind a reverse proxy every client has the
// proxy's address, which is why proxies can be exempted.
package connlimit

import (
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/iprange"
	"github.com/keyserver/keyserver/internal/metrics"
)

// Options configure a capped listener.
type Options struct {
	// Name labels the metric and the log lines ("client", "federation").
	Name string
	// Max is the most connections open at once from one address; 0 or
	// less turns the cap off.
	Max int
	// Exempt are addresses without a cap (trusted reverse proxies).
	Exempt iprange.Set
	Logger logrus.FieldLogger
	// LogEvery bounds the warnings about refused connections to one per
	// period (default a minute); the warning says how many were refused.
	LogEvery time.Duration
}

// Listener is a net.Listener that closes a new connection at once when
// its remote address already holds Max.
type Listener struct {
	net.Listener
	o Options

	mu       sync.Mutex
	open     map[netip.Addr]int
	refused  int // since the last warning
	lastWarn time.Time
}

// Wrap caps ln; with o.Max <= 0 it returns ln unchanged.
func Wrap(ln net.Listener, o Options) net.Listener {
	if o.Max <= 0 {
		return ln
	}
	if o.Logger == nil {
		o.Logger = logrus.StandardLogger()
	}
	if o.LogEvery <= 0 {
		o.LogEvery = time.Minute
	}
	return &Listener{Listener: ln, o: o, open: map[netip.Addr]int{}}
}

// Accept returns the next connection whose address is below its cap;
// connections above it are closed without a word, as early as possible
// (before TLS or HTTP spend anything on them).
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr, ok := iprange.ParseAddr(c.RemoteAddr().String())
		if !ok || l.o.Exempt.Contains(addr) {
			return c, nil
		}
		l.mu.Lock()
		if l.open[addr] >= l.o.Max {
			l.refuse(addr)
			l.mu.Unlock()
			c.Close()
			continue
		}
		l.open[addr]++
		l.mu.Unlock()
		return &conn{Conn: c, l: l, addr: addr}, nil
	}
}

// refuse counts a refused connection and warns at most once per LogEvery;
// l.mu is held.
func (l *Listener) refuse(addr netip.Addr) {
	metrics.ConnectionsRefused.WithLabelValues(l.o.Name).Inc()
	l.refused++
	if now := time.Now(); now.Sub(l.lastWarn) >= l.o.LogEvery {
		l.o.Logger.WithFields(logrus.Fields{
			"listener": l.o.Name, "remote": addr.String(), "max_connections_per_address": l.o.Max, "refused": l.refused,
		}).Warn("refusing connections: an address holds the most connections allowed")
		l.lastWarn, l.refused = now, 0
	}
}

// Open returns how many connections addr holds (for tests and tools).
func (l *Listener) Open(addr netip.Addr) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open[addr]
}

func (l *Listener) release(addr netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[addr]--; l.open[addr] <= 0 {
		delete(l.open, addr)
	}
}

// conn gives its slot back when closed, once.
type conn struct {
	net.Conn
	l    *Listener
	addr netip.Addr
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.addr) })
	return err
}

// NetConn returns the connection underneath (as tls.Conn.NetConn does),
// for code that checks the socket itself.
func (c *conn) NetConn() net.Conn { return c.Conn }
