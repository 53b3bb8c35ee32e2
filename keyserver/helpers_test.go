package keyserver

import (
	"context"
	"encoding/base64"
	"errors"
	"testing"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
	"github.com/keyserver/keyserver/userapi"
)

func encodeB64(b []byte) string { return base64.RawStdEncoding.EncodeToString(b) }

// errcodeOf is "" for nil, the errcode of a Matrix error, or "not a Matrix
// error".
func errcodeOf(err error) string {
	if err == nil {
		return ""
	}
	var me *mxerr.Error
	if errors.As(err, &me) {
		return me.Code
	}
	return "not a Matrix error: " + err.Error()
}

func openTestDB(t *testing.T, db testdb.Database) *sqlstore.Store {
	t.Helper()
	s, err := sqlstore.Open(context.Background(), db.URI, "local.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// testUsers are accounts on the service's database whose device and
// membership changes reach the service as the server's change fan-out
// passes them on.
func testUsers(s *Service) *userapi.Service {
	return userapi.New(s.db.(storage.Database), userapi.Options{ServerName: s.opts.ServerName, BcryptCost: 4, Logger: s.log, Changes: changesTo{s}})
}

type changesTo struct{ s *Service }

func (c changesTo) DeviceListChanged(ch storage.Change) { c.s.localChange(ch) }

func (c changesTo) MembershipChanged(ch storage.Change, newlyStale []storage.StaleUser) {
	c.s.membershipChanged(ch, newlyStale)
}
