package keyserver

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/keyserver/keyserver/storage"
)

// countingDB counts the database calls a request makes.
type countingDB struct {
	storage.Database
	calls atomic.Int32
}

func (c *countingDB) DevicesWithKeys(ctx context.Context, userIDs []string) ([]storage.Device, error) {
	c.calls.Add(1)
	return c.Database.DevicesWithKeys(ctx, userIDs)
}

// A local /keys/query costs one database query however many users and
// devices it names.
func TestLocalQueryIsOneRoundTrip(t *testing.T) {
	ctx := context.Background()
	store := openStore(t, "local.test")
	db := &countingDB{Database: store}
	svc := New(db, Options{ServerName: "local.test", BcryptCost: 4, Logger: quiet()})
	users := map[string][]string{}
	for i := 0; i < 40; i++ {
		u := fmt.Sprintf("@u%d:local.test", i)
		if _, err := store.CreateAccount(ctx, u, "x", nil); err != nil {
			t.Fatal(err)
		}
		for d := 0; d < 3; d++ {
			dev := fmt.Sprintf("D%d", d)
			if _, err := store.Login(ctx, storage.NewLogin{UserID: u, DeviceID: dev, TokenHash: u + dev}); err != nil {
				t.Fatal(err)
			}
			if _, err := store.UploadKeys(ctx, u, dev, nil, func(storage.KeyState) (storage.KeyWrite, error) {
				return storage.KeyWrite{DeviceKeys: []byte(`{"device_id":"` + dev + `"}`)}, nil
			}); err != nil {
				t.Fatal(err)
			}
		}
		users[u] = nil
	}
	for _, n := range []int{1, 40} {
		req := map[string][]string{}
		for u := range users {
			if len(req) < n {
				req[u] = []string{}
			}
		}
		db.calls.Store(0)
		res, err := svc.QueryKeys(ctx, Caller{UserID: "@u0:local.test"}, QueryRequest{DeviceKeys: req})
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for _, devs := range res.DeviceKeys {
			got += len(devs)
		}
		if got != 3*n {
			raw, _ := json.Marshal(res)
			t.Fatalf("%d users: %d devices in %s", n, got, raw)
		}
		if c := db.calls.Load(); c != 1 {
			t.Fatalf("%d users: %d database queries, want 1", n, c)
		}
	}
}

// The hand-written encoding of a query answer means the same as json.Marshal's.
func TestQueryResponseAppendJSON(t *testing.T) {
	r := QueryResponse{
		DeviceKeys: map[string]map[string]json.RawMessage{
			"@a:x":    {"D1": json.RawMessage(`{"device_id":"D1","keys":{"ed25519:D1":"é\"<>"}}`), "D2": json.RawMessage(`{}`)},
			"@b\"q:x": {},
		},
		Failures:        map[string]any{"y": map[string]any{"status": 503, "message": "down"}},
		MasterKeys:      map[string]json.RawMessage{},
		SelfSigningKeys: map[string]json.RawMessage{},
		UserSigningKeys: map[string]json.RawMessage{},
	}
	fast, err := r.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	slow, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var a, b any
	if err := json.Unmarshal(fast, &a); err != nil {
		t.Fatalf("not JSON: %s", fast)
	}
	_ = json.Unmarshal(slow, &b)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("differs:\n%s\n%s", fast, slow)
	}
}
