package keyserver

import (
	"context"
	"encoding/base64"
	"errors"
	"testing"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/storage/sqlstore"
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
