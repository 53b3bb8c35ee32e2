package accountdata_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/keyserver/keyserver/accountdata"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

const alice = "@alice:local.test"

func setup(t *testing.T, db testdb.Database) (*accountdata.Service, *[]storage.Change) {
	t.Helper()
	store, err := sqlstore.Open(context.Background(), db.URI, "local.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if _, err := store.CreateAccount(context.Background(), alice, "x", nil); err != nil {
		t.Fatal(err)
	}
	var changes []storage.Change
	return accountdata.New(store, func(ch storage.Change) { changes = append(changes, ch) }), &changes
}

func status(err error) (int, string) {
	var me *mxerr.Error
	if errors.As(err, &me) {
		return me.Status, me.Code
	}
	return 0, ""
}

// Global and per-room account data are kept apart, read back compacted,
// and each write is a change for /sync; a room ID without ":server"
// (room version 12) is accepted.
func TestSetGet(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		s, changes := setup(t, db)
		if err := s.Set(ctx, alice, alice, "", "m.direct", false, json.RawMessage(` { "a" : 1 } `)); err != nil {
			t.Fatal(err)
		}
		if err := s.Set(ctx, alice, alice, "!v12roomid", "m.tag", true, json.RawMessage(`{"tags":{}}`)); err != nil {
			t.Fatal(err)
		}
		if got, err := s.Get(ctx, alice, alice, "", "m.direct", false); err != nil || string(got) != `{"a":1}` {
			t.Fatalf("global: %s %v", got, err)
		}
		if got, err := s.Get(ctx, alice, alice, "!v12roomid", "m.tag", true); err != nil || string(got) != `{"tags":{}}` {
			t.Fatalf("per room: %s %v", got, err)
		}
		if _, err := s.Get(ctx, alice, alice, "!v12roomid", "m.direct", true); func() bool { st, _ := status(err); return st != http.StatusNotFound }() {
			t.Fatalf("global type read per room: %v", err)
		}
		if len(*changes) != 2 || (*changes)[0].Pos == 0 || (*changes)[1].Pos <= (*changes)[0].Pos {
			t.Fatalf("changes %+v", *changes)
		}
	})
}

// Another user's data, server-managed types, bad room IDs and content
// that is not an object are refused and change nothing.
func TestRefused(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		s, changes := setup(t, db)
		for name, c := range map[string]struct {
			caller, room, typ string
			perRoom           bool
			content           string
			status            int
			code              string
		}{
			"other user":  {"@bob:local.test", "", "m.x", false, `{}`, http.StatusForbidden, "M_FORBIDDEN"},
			"push rules":  {alice, "", "m.push_rules", false, `{}`, http.StatusMethodNotAllowed, "M_BAD_JSON"},
			"fully read":  {alice, "!r:local.test", "m.fully_read", true, `{}`, http.StatusMethodNotAllowed, "M_BAD_JSON"},
			"bad room":    {alice, "room", "m.x", true, `{}`, http.StatusBadRequest, "M_INVALID_PARAM"},
			"array":       {alice, "", "m.x", false, `[]`, http.StatusBadRequest, "M_BAD_JSON"},
			"broken JSON": {alice, "", "m.x", false, `{"a":`, http.StatusBadRequest, "M_NOT_JSON"},
			"empty type":  {alice, "", "", false, `{}`, http.StatusBadRequest, "M_INVALID_PARAM"},
		} {
			err := s.Set(ctx, c.caller, alice, c.room, c.typ, c.perRoom, json.RawMessage(c.content))
			if st, code := status(err); st != c.status || code != c.code {
				t.Fatalf("%s: %v, want %d %s", name, err, c.status, c.code)
			}
		}
		if len(*changes) != 0 {
			t.Fatalf("refused writes changed something: %+v", *changes)
		}
		if _, err := s.Get(ctx, "@bob:local.test", alice, "", "m.x", false); func() bool { _, c := status(err); return c != "M_FORBIDDEN" }() {
			t.Fatalf("read of another user's data: %v", err)
		}
	})
}
