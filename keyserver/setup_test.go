package keyserver_test

import (
	"context"
	"io"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/keyserver"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// openService opens a store on uri, closed when the test ends, and a quiet
// service of the server "local.test" on it.
func openService(ctx context.Context, t *testing.T, uri string) (*sqlstore.Store, *keyserver.Service) {
	t.Helper()
	store, err := sqlstore.Open(ctx, uri, "local.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	log := logrus.New()
	log.SetOutput(io.Discard)
	return store, keyserver.New(store, keyserver.Options{ServerName: "local.test", Logger: log})
}
