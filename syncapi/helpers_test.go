package syncapi

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/accountdata"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/keyserver"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
	"github.com/keyserver/keyserver/syncnotify"
	"github.com/keyserver/keyserver/todevice"
	"github.com/keyserver/keyserver/userapi"
)

func openTestDB(t *testing.T, db testdb.Database) *sqlstore.Store {
	t.Helper()
	s, err := sqlstore.Open(context.Background(), db.URI, "local.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// testServer is /sync with the domains it reads from on one database,
// their changes passed on to the shared notifier as the server's change
// fan-out does.
type testServer struct {
	store    *sqlstore.Store
	notifier *syncnotify.Notifier
	keys     *keyserver.Service
	users    *userapi.Service
	toDevice *todevice.Service
	account  *accountdata.Service
	sync     *Service
	log      logrus.FieldLogger
}

// newTestServer builds it; with sections, /sync has its to_device and
// account_data sections.
func newTestServer(t *testing.T, store *sqlstore.Store, sections bool) *testServer {
	log := logrus.New()
	log.SetOutput(io.Discard)
	ts := &testServer{store: store, notifier: syncnotify.New(), log: log}
	t.Cleanup(ts.notifier.Close)
	ts.keys = keyserver.New(store, keyserver.Options{ServerName: "local.test", Logger: log, Notifier: ts.notifier})
	ts.users = userapi.New(store, userapi.Options{ServerName: "local.test", BcryptCost: 4, Logger: log, Changes: changesTo{ts.notifier}})
	o := Options{Keys: ts.keys, Notifier: ts.notifier}
	if sections {
		ts.toDevice = todevice.New(store, todevice.Options{ServerName: "local.test", Changed: changesTo{ts.notifier}.streamAdvanced, Logger: log})
		ts.account = accountdata.New(store, changesTo{ts.notifier}.streamAdvanced)
		o.ToDevice, o.AccountData = ts.toDevice, ts.account
	}
	ts.sync = New(store, o)
	return ts
}

// changesTo wakes the waiting requests a committed change concerns.
type changesTo struct{ n *syncnotify.Notifier }

func (c changesTo) streamAdvanced(ch storage.Change) {
	if ch.Pos > 0 {
		c.n.StreamAdvanced(ch.Users)
	}
}

func (c changesTo) DeviceListChanged(ch storage.Change) { c.streamAdvanced(ch) }

func (c changesTo) MembershipChanged(ch storage.Change, _ []storage.StaleUser) { c.streamAdvanced(ch) }

// waitFor waits for cond, up to ten seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
