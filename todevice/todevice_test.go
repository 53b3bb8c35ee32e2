package todevice_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
	"github.com/keyserver/keyserver/todevice"
)

const (
	alice = "@alice:local.test"
	bob   = "@bob:local.test"
)

type fixture struct {
	s       *todevice.Service
	store   *sqlstore.Store
	changes []storage.Change
	queued  int
}

func setup(t *testing.T, db testdb.Database, federated bool) *fixture {
	t.Helper()
	ctx := context.Background()
	store, err := sqlstore.Open(ctx, db.URI, "local.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	for _, u := range []string{alice, bob} {
		if _, err := store.CreateAccount(ctx, u, "x", &storage.NewLogin{UserID: u, DeviceID: "PHONE", TokenHash: u}); err != nil {
			t.Fatal(err)
		}
	}
	f := &fixture{store: store}
	f.s = todevice.New(store, todevice.Options{ServerName: "local.test", Federated: federated,
		Changed: func(ch storage.Change) { f.changes = append(f.changes, ch) }, Queued: func() { f.queued++ }})
	return f
}

func (f *fixture) inbox(t *testing.T, user string) []storage.ToDeviceMessage {
	t.Helper()
	ctx := context.Background()
	cur, err := f.store.CurrentPos(ctx)
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := f.store.ToDeviceMessages(ctx, user, "PHONE", 0, cur, 100)
	if err != nil {
		t.Fatal(err)
	}
	return msgs
}

func errcode(err error) string {
	var me *mxerr.Error
	if errors.As(err, &me) {
		return me.Code
	}
	if err != nil {
		return "not a Matrix error: " + err.Error()
	}
	return ""
}

func msgs(m map[string]map[string]string) todevice.SendRequest {
	r := todevice.SendRequest{Messages: map[string]map[string]json.RawMessage{}}
	for u, ds := range m {
		r.Messages[u] = map[string]json.RawMessage{}
		for d, c := range ds {
			r.Messages[u][d] = json.RawMessage(c)
		}
	}
	return r
}

// A send reaches the local device's inbox once, whatever the retries of
// its transaction; messages for another server are queued for it when
// federated and dropped otherwise.
func TestSend(t *testing.T) {
	for _, federated := range []bool{true, false} {
		t.Run(fmt.Sprintf("federated=%v", federated), func(t *testing.T) { testSend(t, federated) })
	}
}

func testSend(t *testing.T, federated bool) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		f := setup(t, db, federated)
		ctx := context.Background()
		req := msgs(map[string]map[string]string{bob: {"PHONE": `{"n": 1}`}, "@carol:remote.test": {"*": `{"n":2}`}})
		for range 2 {
			if err := f.s.Send(ctx, alice, "PHONE", "m.room_key_request", "txn1", req); err != nil {
				t.Fatal(err)
			}
		}
		got := f.inbox(t, bob)
		if len(got) != 1 || got[0].Sender != alice || got[0].Type != "m.room_key_request" || string(got[0].Content) != `{"n":1}` {
			t.Fatalf("federated=%v: bob's inbox %+v", federated, got)
		}
		if len(f.changes) != 1 || f.changes[0].Pos == 0 {
			t.Fatalf("federated=%v: changes %+v", federated, f.changes)
		}
		pending, err := f.store.PendingToDevice(ctx, "remote.test", 10)
		if err != nil {
			t.Fatal(err)
		}
		if federated && (len(pending) != 1 || f.queued != 1) {
			t.Fatalf("queued for remote.test: %+v (%d pokes)", pending, f.queued)
		}
		if !federated && (len(pending) != 0 || f.queued != 0) {
			t.Fatalf("queued without federation: %+v (%d pokes)", pending, f.queued)
		}
	})
}

// A send naming a bad user, device or content is refused and stores
// nothing.
func TestBadSendStoresNothing(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		f := setup(t, db, true)
		ctx := context.Background()
		for name, c := range map[string]struct {
			typ  string
			req  todevice.SendRequest
			code string
		}{
			"bad user":      {"m.x", msgs(map[string]map[string]string{"bob": {"PHONE": `{}`}, bob: {"PHONE": `{}`}}), "M_INVALID_PARAM"},
			"not an object": {"m.x", msgs(map[string]map[string]string{bob: {"PHONE": `[1]`}}), "M_BAD_JSON"},
			"no type":       {"", msgs(map[string]map[string]string{bob: {"PHONE": `{}`}}), "M_INVALID_PARAM"},
			"no messages":   {"m.x", todevice.SendRequest{}, "M_MISSING_PARAM"},
		} {
			if err := f.s.Send(ctx, alice, "PHONE", c.typ, "t-"+name, c.req); errcode(err) != c.code {
				t.Fatalf("%s: %v, want %s", name, err, c.code)
			}
		}
		if got := f.inbox(t, bob); len(got) != 0 || len(f.changes) != 0 || f.queued != 0 {
			t.Fatalf("refused sends stored %+v, changes %v", got, f.changes)
		}
	})
}

// Another server's m.direct_to_device reaches local devices once per
// message_id; one whose sender is not of its origin is dropped.
func TestReceive(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		f := setup(t, db, true)
		ctx := context.Background()
		edu := func(sender, id string) json.RawMessage {
			return json.RawMessage(`{"sender":"` + sender + `","type":"m.room.encrypted","message_id":"` + id + `",
				"messages":{"` + bob + `":{"*":{"ciphertext":"x"}},"@dan:elsewhere.test":{"D":{}}}}`)
		}
		if err := f.s.Receive(ctx, "remote.test", edu("@mallory:other.test", "m0")); err != nil {
			t.Fatal(err)
		}
		if got := f.inbox(t, bob); len(got) != 0 {
			t.Fatalf("a sender not of its origin was delivered: %+v", got)
		}
		for range 2 {
			if err := f.s.Receive(ctx, "remote.test", edu("@carol:remote.test", "m1")); err != nil {
				t.Fatal(err)
			}
		}
		got := f.inbox(t, bob)
		if len(got) != 1 || got[0].Sender != "@carol:remote.test" || string(got[0].Content) != `{"ciphertext":"x"}` {
			t.Fatalf("bob's inbox %+v", got)
		}
		if err := f.s.Receive(ctx, "remote.test", json.RawMessage(`"not an object"`)); err != nil {
			t.Fatalf("a malformed EDU fails the transaction: %v", err)
		}
	})
}
