package userapi

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

func newPasswordTestService(t *testing.T, opts Options) *Service {
	t.Helper()
	store, err := sqlstore.Open(context.Background(), testdb.SQLite(t).URI, "local.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	opts.ServerName, opts.BcryptCost = "local.test", 4
	if opts.Logger == nil {
		log := logrus.New()
		log.SetOutput(nilWriter{})
		opts.Logger = log
	}
	return New(store, opts)
}

type nilWriter struct{}

func (nilWriter) Write(p []byte) (int, error) { return len(p), nil }

// However many logins arrive at once, no more password checks run at once
// than the pool allows; the others wait for a slot.
func TestPasswordPoolBoundsConcurrency(t *testing.T) {
	s := newPasswordTestService(t, Options{RegistrationOpen: true, BcryptConcurrency: 2})
	ctx := context.Background()
	alice, pw := "alice", "pw-alice"
	if _, err := s.Register(ctx, RegisterRequest{Username: &alice, Password: &pw, Auth: &matrixid.AuthData{Type: stageDummy}, InhibitLogin: true}); err != nil {
		t.Fatal(err)
	}

	var active, most, entered atomic.Int64
	release := make(chan struct{})
	real := bcryptCompare
	bcryptCompare = func(hash, password []byte) error {
		entered.Add(1)
		n := active.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		<-release
		active.Add(-1)
		return real(hash, password)
	}
	t.Cleanup(func() { bcryptCompare = real })

	const logins = 6
	var wg sync.WaitGroup
	for i := 0; i < logins; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Login(ctx, LoginRequest{Type: "m.login.password", User: "alice", Password: &pw}); err != nil {
				t.Errorf("login: %v", err)
			}
		}()
	}
	// Every login is either checking its password or waiting for a slot.
	deadline := time.Now().Add(30 * time.Second)
	for entered.Load()+int64(s.passwords.Waiting()) != logins {
		if time.Now().After(deadline) {
			t.Fatalf("%d logins checking and %d waiting, want %d in all", entered.Load(), int64(s.passwords.Waiting()), logins)
		}
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	if m := most.Load(); m > 2 {
		t.Errorf("%d password checks ran at once, want at most 2", m)
	}
	if entered.Load() != logins {
		t.Errorf("%d password checks, want %d", entered.Load(), logins)
	}
}

// A failed login is logged at info with the user and address, never with
// the password.
func TestFailedLoginLogged(t *testing.T) {
	log, hook := test.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	s := newPasswordTestService(t, Options{RegistrationOpen: true, Logger: log})
	ctx := context.Background()
	alice, pw := "alice", "correct horse"
	if _, err := s.Register(ctx, RegisterRequest{Username: &alice, Password: &pw, Auth: &matrixid.AuthData{Type: stageDummy}, InhibitLogin: true}); err != nil {
		t.Fatal(err)
	}
	hook.Reset()
	guess := "battery staple"
	if _, err := s.Login(ctx, LoginRequest{Type: "m.login.password", User: "alice", Password: &guess, IP: "192.0.2.7"}); err == nil {
		t.Fatal("a wrong password was accepted")
	}
	var found bool
	for _, e := range hook.AllEntries() {
		line, _ := e.String()
		if strings.Contains(line, guess) || strings.Contains(line, pw) {
			t.Errorf("a password is logged: %s", line)
		}
		if e.Level == logrus.InfoLevel && e.Data["user_id"] == "@alice:local.test" && e.Data["ip"] == "192.0.2.7" {
			found = true
		}
	}
	if !found {
		t.Errorf("no info entry with the user and address among %d entries", len(hook.AllEntries()))
	}
}
