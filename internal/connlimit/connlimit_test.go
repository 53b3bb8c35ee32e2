package connlimit

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
)

// Refusals are logged at most once per LogEvery, with how many there were.
func TestRefusalsLoggedRateLimited(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log, hook := test.NewNullLogger()
	ln := Wrap(inner, Options{Name: "test", Max: 1, Logger: log, LogEvery: time.Hour}).(*Listener)
	defer ln.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	var clients []net.Conn
	for i := 0; i < 4; i++ {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	// The listener takes connections in the order they were made: the
	// first is accepted, the three others are closed by the server.
	first := <-accepted
	for i, c := range clients[1:] {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		if ne, ok := err.(net.Error); err == nil || (ok && ne.Timeout()) {
			t.Fatalf("connection %d was not closed: %v", i+2, err)
		}
	}
	warnings := 0
	for _, e := range hook.AllEntries() {
		if e.Level == logrus.WarnLevel {
			warnings++
		}
	}
	if warnings != 1 {
		t.Errorf("%d warnings for 3 refusals within LogEvery, want 1", warnings)
	}
	if got := ln.Open(netip.MustParseAddr("127.0.0.1")); got != 1 {
		t.Errorf("open connections %d, want 1", got)
	}
	first.Close()
	if got := ln.Open(netip.MustParseAddr("127.0.0.1")); got != 0 {
		t.Errorf("open connections after close %d, want 0", got)
	}
}
