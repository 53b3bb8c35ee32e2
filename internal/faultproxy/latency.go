package faultproxy

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Latency is a TCP proxy that adds a delay to what the target sends back
// (a database, say), as a distant network would. The delay can be changed
// while connections are open; what is in flight keeps the delay it was
// read with, and the order of the bytes is kept.
type Latency struct {
	ln      net.Listener
	network string
	target  string
	delay   atomic.Int64 // nanoseconds
	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// NewLatency listens on a loopback port and forwards every connection to
// target on network ("tcp", or "unix" for a socket path).
func NewLatency(network, target string) (*Latency, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &Latency{ln: ln, network: network, target: target, conns: map[net.Conn]struct{}{}}
	l.wg.Add(1)
	go l.serve()
	return l, nil
}

// Addr is the proxy's address ("127.0.0.1:PORT").
func (l *Latency) Addr() string { return l.ln.Addr().String() }

// SetDelay sets the delay added to the target's answers from now on.
func (l *Latency) SetDelay(d time.Duration) { l.delay.Store(int64(d)) }

// Close stops listening and closes every connection.
func (l *Latency) Close() {
	_ = l.ln.Close()
	l.mu.Lock()
	for c := range l.conns {
		_ = c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
}

func (l *Latency) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conns == nil {
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *Latency) serve() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial(l.network, l.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		l.track(c)
		l.track(up)
		l.wg.Add(2)
		go func() {
			defer l.wg.Done()
			_, _ = io.Copy(up, c)
			_ = up.Close()
		}()
		go func() {
			defer l.wg.Done()
			l.delayed(c, up)
			_ = c.Close()
		}()
	}
}

type chunk struct {
	b   []byte
	due time.Time
}

// delayed copies src to dst, each read held back by the delay current when
// it was read.
func (l *Latency) delayed(dst, src net.Conn) {
	q := make(chan chunk, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for c := range q {
			if d := time.Until(c.due); d > 0 {
				time.Sleep(d)
			}
			if _, err := dst.Write(c.b); err != nil {
				_ = src.Close()
				for range q {
				}
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			q <- chunk{b: append([]byte(nil), buf[:n]...), due: time.Now().Add(time.Duration(l.delay.Load()))}
		}
		if err != nil {
			break
		}
	}
	close(q)
	<-done
}
