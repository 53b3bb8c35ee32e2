package fedrouter_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/keyserver/keyserver/fedrouter"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// domains records what the router hands each domain, in order.
type domains struct {
	mu      sync.Mutex
	calls   []string
	resyncs []map[string]bool
}

func (d *domains) add(s string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, s)
}

func (d *domains) DeviceListUpdate(_ context.Context, origin string, content json.RawMessage) (string, error) {
	var c struct {
		UserID string `json:"user_id"`
	}
	_ = json.Unmarshal(content, &c)
	d.add("device_list_update " + origin + " " + c.UserID)
	return c.UserID, nil
}

func (d *domains) SigningKeyUpdate(_ context.Context, origin string, _ json.RawMessage) error {
	d.add("signing_key_update " + origin)
	return nil
}

func (d *domains) ResyncWithin(_ context.Context, origin string, users map[string]bool) {
	d.add("resync " + origin)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.resyncs = append(d.resyncs, users)
}

func (d *domains) ReceiveDirectToDevice(_ context.Context, origin string, _ json.RawMessage) error {
	d.add("direct_to_device " + origin)
	return nil
}

func (d *domains) ReceivePDUs(_ context.Context, origin string, pdus []json.RawMessage) map[string]string {
	d.add("pdus " + origin)
	out := map[string]string{}
	for i := range pdus {
		if i == 0 {
			out["$ok"] = ""
		} else {
			out["$bad"] = "refused"
		}
	}
	return out
}

func newRouter(t *testing.T, db testdb.Database, d *domains) *fedrouter.Router {
	t.Helper()
	store, err := sqlstore.Open(context.Background(), db.URI, "local.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return fedrouter.New(store, fedrouter.Options{DeviceLists: d, DirectToDevice: d, PDUs: d})
}

const txn = `{"origin":"remote.test","pdus":[{"type":"m.room.message"},{"type":"m.room.message"}],"edus":[
	{"edu_type":"m.device_list_update","content":{"user_id":"@a:remote.test"}},
	{"edu_type":"m.typing","content":{}},
	{"edu_type":"m.direct_to_device","content":{}},
	{"edu_type":"m.signing_key_update","content":{}},
	{"edu_type":"m.device_list_update","content":{"user_id":"@b:remote.test"}}]}`

// PDUs go to the rooms first, then each EDU to its domain in order (other
// types are dropped), then the users to resync; the answer carries each
// PDU's result. Sent again, the transaction gets the stored answer and
// reaches no domain.
func TestTransactionIsRoutedOnce(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		d := &domains{}
		r := newRouter(t, db, d)
		answer, err := r.HandleTransaction(ctx, "remote.test", "t1", []byte(txn))
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"pdus remote.test", "device_list_update remote.test @a:remote.test", "direct_to_device remote.test",
			"signing_key_update remote.test", "device_list_update remote.test @b:remote.test", "resync remote.test"}
		if strings.Join(d.calls, "\n") != strings.Join(want, "\n") {
			t.Fatalf("calls:\n%s\nwant:\n%s", strings.Join(d.calls, "\n"), strings.Join(want, "\n"))
		}
		if len(d.resyncs) != 1 || !d.resyncs[0]["@a:remote.test"] || !d.resyncs[0]["@b:remote.test"] {
			t.Fatalf("resyncs: %v", d.resyncs)
		}
		var got struct {
			PDUs map[string]map[string]string `json:"pdus"`
		}
		if err := json.Unmarshal(answer, &got); err != nil {
			t.Fatal(err)
		}
		if _, ok := got.PDUs["$ok"]; !ok || got.PDUs["$ok"]["error"] != "" || got.PDUs["$bad"]["error"] != "refused" {
			t.Fatalf("answer: %s", answer)
		}
		again, err := r.HandleTransaction(ctx, "remote.test", "t1", []byte(`{"pdus":[],"edus":[]}`))
		if err != nil || string(again) != string(answer) {
			t.Fatalf("replayed: %s %v, want %s", again, err, answer)
		}
		if len(d.calls) != len(want) {
			t.Fatalf("a replayed transaction reached the domains: %v", d.calls[len(want):])
		}
		// The same ID from another server is another transaction.
		if _, err := r.HandleTransaction(ctx, "other.test", "t1", []byte(`{"edus":[{"edu_type":"m.signing_key_update","content":{}}]}`)); err != nil {
			t.Fatal(err)
		}
		if last := d.calls[len(d.calls)-1]; last != "signing_key_update other.test" {
			t.Fatalf("other server's transaction: %v", d.calls)
		}
	})
}

// A transaction of the wrong shape or over the limits is refused with
// M_BAD_JSON, reaches no domain and is not stored: sent again correctly,
// it is processed.
func TestBadTransactionIsRefused(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		d := &domains{}
		r := newRouter(t, db, d)
		tooMany := `{"edus":[` + strings.TrimSuffix(strings.Repeat(`{"edu_type":"m.typing","content":{}},`, 101), ",") + `]}`
		for _, body := range []string{`{"pdus":{}}`, `[]`, tooMany} {
			_, err := r.HandleTransaction(ctx, "remote.test", "t2", []byte(body))
			var me *mxerr.Error
			if !errors.As(err, &me) || me.Code != "M_BAD_JSON" {
				t.Fatalf("%.40s: %v", body, err)
			}
		}
		if len(d.calls) != 0 {
			t.Fatalf("a refused transaction reached the domains: %v", d.calls)
		}
		if _, err := r.HandleTransaction(ctx, "remote.test", "t2", []byte(txn)); err != nil || len(d.calls) == 0 {
			t.Fatalf("the corrected transaction: %v %v", err, d.calls)
		}
	})
}

// Without rooms, PDUs are answered as not processed, by event ID.
func TestPDUsWithoutRooms(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		store, err := sqlstore.Open(context.Background(), db.URI, "local.test")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		r := fedrouter.New(store, fedrouter.Options{})
		answer, err := r.HandleTransaction(context.Background(), "remote.test", "t3", []byte(`{"pdus":[{"event_id":"$x","type":"m.room.message"}]}`))
		if err != nil || !strings.Contains(string(answer), `"$x":{"error":"this server does not process room events"}`) {
			t.Fatalf("%s %v", answer, err)
		}
	})
}
