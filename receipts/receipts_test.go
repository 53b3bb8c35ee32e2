package receipts_test

import (
	"context"
	"encoding/json"
	"net/url"
	"slices"
	"sync"
	"testing"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/receipts"
	"github.com/keyserver/keyserver/storage"
)

// markRead records the unread counts reset.
type markRead struct {
	mu    sync.Mutex
	calls []string
}

func (m *markRead) MarkRead(_ context.Context, userID, roomID string, pos storage.StreamPos) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, userID)
	return nil
}

type fixture struct {
	srv        *testutil.Server
	svc        *receipts.Service
	unread     *markRead
	alice, bob *testutil.User
	roomID     string
	changes    []storage.Change
}

// setup makes a room of alice's that bob joined, and a receipts service
// on the server's database.
func setup(t *testing.T, db testutil.Database) *fixture {
	f := &fixture{unread: &markRead{}}
	f.srv = testutil.NewServer(t, db, testutil.ServerOptions{})
	f.alice, f.bob = f.srv.Register(t, "alice", ""), f.srv.Register(t, "bob", "")
	f.roomID = f.srv.Must(t, "POST", "/_matrix/client/v3/createRoom", f.alice.Token, map[string]any{"preset": "public_chat"})["room_id"].(string)
	f.srv.Must(t, "POST", "/_matrix/client/v3/rooms/"+url.PathEscape(f.roomID)+"/join", f.bob.Token, map[string]any{})
	f.svc = receipts.New(f.srv.Store, receipts.Options{ServerName: f.srv.ServerName, Unread: f.unread,
		Changed: func(ch storage.Change) { f.changes = append(f.changes, ch) }})
	return f
}

func (f *fixture) send(t *testing.T, txn string, content map[string]any) string {
	t.Helper()
	return f.srv.Must(t, "PUT", "/_matrix/client/v3/rooms/"+url.PathEscape(f.roomID)+"/send/m.room.message/"+txn, f.alice.Token, content)["event_id"].(string)
}

func (f *fixture) post(u *testutil.User, typ, eventID, body string) error {
	var m map[string]json.RawMessage
	if body != "" {
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			return err
		}
	}
	return f.svc.Post(context.Background(), matrixid.Caller{UserID: u.UserID, DeviceID: u.DeviceID}, f.roomID, typ, eventID, m)
}

func (f *fixture) stored(t *testing.T) []string {
	t.Helper()
	list, err := f.srv.Store.RoomReceipts(context.Background(), f.roomID)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range list {
		out = append(out, r.UserID+"|"+r.Type+"|"+r.ThreadID+"|"+r.EventID)
	}
	return out
}

func errcode(err error) string {
	if mx, ok := err.(*mxerr.Error); ok {
		return mx.Code
	}
	return ""
}

// Public receipts concern the room's local members, private ones their
// owner; receipts of the main timeline (or none) reset the unread counts,
// those in a thread do not; a receipt never goes back.
func TestReceiptsStored(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		f := setup(t, db)
		m1 := f.send(t, "1", map[string]any{"msgtype": "m.text", "body": "one"})
		m2 := f.send(t, "2", map[string]any{"msgtype": "m.text", "body": "two"})
		reply := f.send(t, "3", map[string]any{"msgtype": "m.text", "body": "reply",
			"m.relates_to": map[string]any{"rel_type": "m.thread", "event_id": m2}})

		if err := f.post(f.bob, receipts.Read, m2, ""); err != nil {
			t.Fatal(err)
		}
		if err := f.post(f.bob, receipts.ReadPrivate, m2, "{}"); err != nil {
			t.Fatal(err)
		}
		if len(f.changes) != 2 || !slices.Equal(f.changes[0].Users, []string{f.alice.UserID, f.bob.UserID}) ||
			!slices.Equal(f.changes[1].Users, []string{f.bob.UserID}) {
			t.Fatalf("changes %+v, want alice and bob's, then bob's", f.changes)
		}
		if err := f.post(f.bob, receipts.Read, reply, `{"thread_id": "`+m2+`"}`); err != nil {
			t.Fatal(err)
		}
		if err := f.post(f.bob, receipts.Read, m1, `{"thread_id": "main"}`); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(f.unread.calls, []string{f.bob.UserID, f.bob.UserID, f.bob.UserID}) {
			t.Fatalf("unread counts reset by %v, want the unthreaded, private and main receipts'", f.unread.calls)
		}
		// Back to m1: nothing changes.
		f.changes = nil
		if err := f.post(f.bob, receipts.Read, m1, ""); err != nil {
			t.Fatal(err)
		}
		if len(f.changes) != 1 || f.changes[0].Pos != 0 {
			t.Fatalf("a receipt going back changed the stream: %+v", f.changes)
		}
		want := []string{
			f.bob.UserID + "|m.read||" + m2,
			f.bob.UserID + "|m.read|" + m2 + "|" + reply,
			f.bob.UserID + "|m.read|main|" + m1,
			f.bob.UserID + "|m.read.private||" + m2,
		}
		if got := f.stored(t); !slices.Equal(got, want) {
			t.Fatalf("stored %q\nwant %q", got, want)
		}
		// Refusals.
		for _, c := range []struct {
			typ, event, body, code string
		}{
			{"m.read", reply, `{"thread_id": "main"}`, "M_INVALID_PARAM"},
			{"m.read", m1, `{"thread_id": "` + m2 + `"}`, "M_INVALID_PARAM"},
			{"m.fully_read", m1, `{"thread_id": "main"}`, "M_INVALID_PARAM"},
			{"m.read", "$nope", "", "M_NOT_FOUND"},
			{"m.reed", m1, "", "M_INVALID_PARAM"},
		} {
			if err := f.post(f.bob, c.typ, c.event, c.body); errcode(err) != c.code {
				t.Errorf("%s %s %s: %v, want %s", c.typ, c.event, c.body, err, c.code)
			}
		}
		if got := f.stored(t); !slices.Equal(got, want) {
			t.Fatalf("refusals changed the receipts: %q", got)
		}
	})
}

// Other servers' receipts: m.read of their own users joined to the room.
// (The joined member here is bob, the EDU's origin his server: what counts
// is that the user is of the origin and joined.)
func TestReceiveReceipt(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		f := setup(t, db)
		ctx := context.Background()
		m1 := f.send(t, "1", map[string]any{"msgtype": "m.text", "body": "one"})
		edu := func(typ, user string, ids []string, data map[string]any) json.RawMessage {
			c, _ := json.Marshal(map[string]any{f.roomID: map[string]any{typ: map[string]any{user: map[string]any{"event_ids": ids, "data": data}}}})
			return c
		}
		for _, c := range []struct {
			origin  string
			content json.RawMessage
		}{
			{"other.example", edu("m.read", f.bob.UserID, []string{m1}, nil)},
			{f.srv.ServerName, edu("m.read", "@zoe:"+f.srv.ServerName, []string{m1}, nil)},
			{f.srv.ServerName, edu("m.read.private", f.bob.UserID, []string{m1}, nil)},
			{f.srv.ServerName, edu("m.read", f.bob.UserID, []string{"no"}, nil)},
			{f.srv.ServerName, json.RawMessage(`[1]`)},
		} {
			if err := f.svc.ReceiveReceipt(ctx, c.origin, c.content); err != nil {
				t.Fatal(err)
			}
		}
		if got := f.stored(t); len(got) != 0 {
			t.Fatalf("receipts taken from refused EDUs: %q", got)
		}
		// An event not known yet is kept as it is; a thread ID that is not
		// one counts as none.
		if err := f.svc.ReceiveReceipt(ctx, f.srv.ServerName, edu("m.read", f.bob.UserID, []string{"$later"}, map[string]any{"ts": 5, "thread_id": 7})); err != nil {
			t.Fatal(err)
		}
		if got := f.stored(t); !slices.Equal(got, []string{f.bob.UserID + "|m.read||$later"}) {
			t.Fatalf("stored %q", got)
		}
		if len(f.unread.calls) != 0 {
			t.Fatalf("a received receipt reset unread counts: %v", f.unread.calls)
		}
	})
}

// /sync's m.receipt: the spec's shape, private receipts only the owner's.
func TestSyncEphemeral(t *testing.T) {
	svc := receipts.New(nil, receipts.Options{ServerName: "s"})
	d := &storage.SyncData{Receipts: []storage.Receipt{
		{RoomID: "!r", Type: "m.read", UserID: "@a:s", EventID: "$1", TS: 10},
		{RoomID: "!r", Type: "m.read", UserID: "@b:s", EventID: "$1", ThreadID: "main", TS: 11},
		{RoomID: "!r", Type: "m.read.private", UserID: "@b:s", EventID: "$2", TS: 12},
	}}
	got := svc.SyncEphemeral("@a:s", d)
	want := `{"content":{"$1":{"m.read":{"@a:s":{"ts":10},"@b:s":{"thread_id":"main","ts":11}}}},"type":"m.receipt"}`
	if len(got["!r"]) != 1 || string(got["!r"][0]) != want {
		t.Fatalf("for @a:s: %s\nwant %s", got["!r"], want)
	}
	got = svc.SyncEphemeral("@b:s", d)
	want = `{"content":{"$1":{"m.read":{"@a:s":{"ts":10},"@b:s":{"thread_id":"main","ts":11}}},"$2":{"m.read.private":{"@b:s":{"ts":12}}}},"type":"m.receipt"}`
	if len(got["!r"]) != 1 || string(got["!r"][0]) != want {
		t.Fatalf("for @b:s: %s\nwant %s", got["!r"], want)
	}
}
