package roomserver_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/internal/iprange"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// newRooms makes rooms on db that reach other servers on loopback with
// a real federation client, waiting at most remoteTimeout for them.
func newRooms(t *testing.T, db testutil.Database, remoteTimeout time.Duration) *roomserver.Service {
	t.Helper()
	store, err := sqlstore.Open(context.Background(), db.URI, "test.local")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	log := logrus.New()
	log.SetOutput(io.Discard)
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	fed := fedclient.New(fedclient.Options{ServerName: "test.local", KeyID: "ed25519:test", PrivateKey: key, SkipVerify: true,
		AddressPolicy: &fedclient.AddressPolicy{Allow: iprange.MustParse([]string{"127.0.0.0/8"})}, Logger: log})
	return roomserver.New(store, roomserver.Options{ServerName: "test.local", KeyID: "ed25519:test", PrivateKey: key,
		Directory: fed, RemoteTimeout: remoteTimeout, Logger: log})
}

// An alias' server that accepts the connection and never answers is a
// 504 once the remote timeout has passed, for the directory and for a
// join by alias alike.
func TestRemoteAliasTimeout(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		rooms := newRooms(t, db, 300*time.Millisecond)
		start := time.Now()
		_, err := rooms.ResolveAlias(context.Background(), "#room:"+silentServer(t))
		expect504(t, err)
		// Another silent server (this one now backs off, which is a 502).
		_, err = rooms.Join(context.Background(), "@alice:test.local", "#room:"+silentServer(t), nil, nil)
		expect504(t, err)
		// The bound is generous: this checks that the wait ends, not how fast.
		if elapsed := time.Since(start); elapsed > 10*time.Second {
			t.Fatalf("the lookup took %v twice with a 300 ms timeout", elapsed)
		}
	})
}

func expect504(t *testing.T, err error) {
	t.Helper()
	var me *mxerr.Error
	if !errors.As(err, &me) || me.Status != http.StatusGatewayTimeout || me.Code != "M_UNKNOWN" {
		t.Fatalf("silent server: %v, want 504 M_UNKNOWN", err)
	}
}

// silentServer accepts connections and never answers, until the test ends.
func silentServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	return ln.Addr().String()
}
