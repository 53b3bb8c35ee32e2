package dehydrated_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/keyserver/keyserver/dehydrated"
	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// keys stands in for the keys domain: it refuses device keys that say so,
// and records what it stored.
type keys struct{ stored []string }

func (k *keys) CheckNewDeviceKeys(_ context.Context, c matrixid.Caller, ks dehydrated.Keys) error {
	if string(ks.DeviceKeys) == `"bad"` {
		return mxerr.InvalidParam("bad device keys")
	}
	return nil
}

func (k *keys) UploadDeviceKeys(_ context.Context, c matrixid.Caller, _ dehydrated.Keys) error {
	k.stored = append(k.stored, c.UserID+" "+c.DeviceID)
	return nil
}

func setup(t *testing.T, db testdb.Database) (*dehydrated.Service, *sqlstore.Store, *keys, *[]storage.Change) {
	t.Helper()
	ctx := context.Background()
	store, err := sqlstore.Open(ctx, db.URI, "local.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if _, err := store.CreateAccount(ctx, "@alice:local.test", "x", nil); err != nil {
		t.Fatal(err)
	}
	k := &keys{}
	var changes []storage.Change
	return dehydrated.New(store, k, func(ch storage.Change) { changes = append(changes, ch) }, nil), store, k, &changes
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

const alice = "@alice:local.test"

// A user's dehydrated device is made with its keys, read back, replaced
// by the next one and deleted; each step is a device-list change.
func TestPutGetReplaceDelete(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		s, _, k, changes := setup(t, db)
		if _, err := s.Get(ctx, alice); errcode(err) != "M_NOT_FOUND" {
			t.Fatalf("before any: %v", err)
		}
		put := func(id string) error {
			_, err := s.Put(ctx, alice, dehydrated.PutRequest{DeviceID: id, DeviceData: json.RawMessage(`{"algorithm":"m.dehydration.v1"}`),
				DeviceKeys: json.RawMessage(`{}`)})
			return err
		}
		if err := put("DEHYD1"); err != nil {
			t.Fatal(err)
		}
		got, err := s.Get(ctx, alice)
		if err != nil || got.DeviceID != "DEHYD1" || string(got.DeviceData) != `{"algorithm":"m.dehydration.v1"}` {
			t.Fatalf("get: %+v %v", got, err)
		}
		if len(k.stored) != 1 || k.stored[0] != alice+" DEHYD1" || len(*changes) == 0 {
			t.Fatalf("keys stored %v, changes %v", k.stored, *changes)
		}
		if err := put("DEHYD2"); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Get(ctx, alice); got.DeviceID != "DEHYD2" {
			t.Fatalf("replaced by %q", got.DeviceID)
		}
		n := len(*changes)
		if a, err := s.Delete(ctx, alice); err != nil || a.DeviceID != "DEHYD2" {
			t.Fatalf("delete: %+v %v", a, err)
		}
		if len(*changes) != n+1 {
			t.Fatalf("the deletion was not reported")
		}
		if _, err := s.Delete(ctx, alice); errcode(err) != "M_NOT_FOUND" {
			t.Fatalf("deleted twice: %v", err)
		}
	})
}

// Refused keys or device data change nothing: no device is made and none
// replaced, nothing is reported.
func TestRefusedPutChangesNothing(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		s, _, k, changes := setup(t, db)
		if _, err := s.Put(ctx, alice, dehydrated.PutRequest{DeviceID: "KEEP", DeviceData: json.RawMessage(`{"algorithm":"a"}`)}); err != nil {
			t.Fatal(err)
		}
		n := len(*changes)
		for name, r := range map[string]dehydrated.PutRequest{
			"bad keys":    {DeviceID: "NEW", DeviceData: json.RawMessage(`{"algorithm":"a"}`), DeviceKeys: json.RawMessage(`"bad"`)},
			"no data":     {DeviceID: "NEW"},
			"no algorith": {DeviceID: "NEW", DeviceData: json.RawMessage(`{}`)},
			"no device":   {DeviceData: json.RawMessage(`{"algorithm":"a"}`)},
		} {
			if _, err := s.Put(ctx, alice, r); err == nil {
				t.Fatalf("%s: accepted", name)
			}
		}
		if got, err := s.Get(ctx, alice); err != nil || got.DeviceID != "KEEP" {
			t.Fatalf("after refused puts: %+v %v", got, err)
		}
		if len(*changes) != n || len(k.stored) != 1 {
			t.Fatalf("refused puts changed something: %d changes, keys %v", len(*changes)-n, k.stored)
		}
	})
}

// The dehydrated device reads its to-device messages in batches; a
// next_batch deletes what came before it; another device is refused.
func TestEvents(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		s, store, _, _ := setup(t, db)
		if _, err := s.Put(ctx, alice, dehydrated.PutRequest{DeviceID: "DEHYD", DeviceData: json.RawMessage(`{"algorithm":"a"}`)}); err != nil {
			t.Fatal(err)
		}
		for _, txn := range []string{"1", "2"} {
			if _, _, err := store.StoreToDevice(ctx, storage.ToDeviceSend{Origin: "@bob:local.test", DeviceID: "B", TxnID: txn,
				Sender: "@bob:local.test", Type: "m.room.encrypted",
				Local: map[string]map[string]json.RawMessage{alice: {"DEHYD": json.RawMessage(`{"n":` + txn + `}`)}}, Now: 1}); err != nil {
				t.Fatal(err)
			}
		}
		first, err := s.Events(ctx, alice, "DEHYD", "")
		if err != nil || len(first.Events) != 2 || first.Events[0].Sender != "@bob:local.test" || first.NextBatch == "" {
			t.Fatalf("events: %+v %v", first, err)
		}
		next, err := s.Events(ctx, alice, "DEHYD", first.NextBatch)
		if err != nil || len(next.Events) != 0 || next.NextBatch != "" {
			t.Fatalf("after next_batch: %+v %v", next, err)
		}
		if _, err := s.Events(ctx, alice, "OTHER", ""); errcode(err) != "M_FORBIDDEN" {
			t.Fatalf("another device: %v", err)
		}
		if _, err := s.Events(ctx, alice, "DEHYD", "not-a-token"); errcode(err) != "M_INVALID_PARAM" {
			t.Fatalf("bad next_batch: %v", err)
		}
	})
}
