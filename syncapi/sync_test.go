package syncapi

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/streamtoken"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/todevice"
	"github.com/keyserver/keyserver/userapi"
)

func errcodeOf(err error) string {
	var me *mxerr.Error
	if errors.As(err, &me) {
		return me.Code
	}
	if err == nil {
		return ""
	}
	return "not a Matrix error: " + err.Error()
}

// login logs a new user in on a device of the given ID.
func (ts *testServer) login(t *testing.T, localpart, deviceID string) matrixid.Caller {
	t.Helper()
	ctx := context.Background()
	id, err := ts.users.CreateUser(ctx, localpart, "pw")
	if err != nil {
		t.Fatal(err)
	}
	pw := "pw"
	res, err := ts.users.Login(ctx, userapi.LoginRequest{Type: "m.login.password", User: id, Password: &pw, DeviceID: &deviceID})
	if err != nil {
		t.Fatal(err)
	}
	return matrixid.Caller{UserID: id, DeviceID: res.DeviceID}
}

// toDeviceEvents are the to-device messages of an answer.
func toDeviceEvents(t *testing.T, res SyncResponse) []todevice.SyncEvent {
	t.Helper()
	sec, ok := res.ToDevice.(*todevice.SyncSection)
	if !ok {
		t.Fatalf("to_device section %#v", res.ToDevice)
	}
	return sec.Events
}

// A to-device message is delivered until a /sync token says the device
// got it: an answer without since gives it again, the next /sync with
// the answer's token deletes it.
func TestToDeviceDeliveredUntilAcknowledged(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, tdb testdb.Database) {
		ctx := context.Background()
		ts := newTestServer(t, openTestDB(t, tdb), true)
		alice, bob := ts.login(t, "alice", "LAPTOP"), ts.login(t, "bob", "PHONE")
		msg := todevice.SendRequest{Messages: map[string]map[string]json.RawMessage{bob.UserID: {bob.DeviceID: json.RawMessage(`{"n":1}`)}}}
		if err := ts.toDevice.Send(ctx, alice.UserID, alice.DeviceID, "m.test", "txn1", msg); err != nil {
			t.Fatal(err)
		}
		var tok string
		for range 2 {
			res, err := ts.sync.Sync(ctx, bob, "", 0, SyncOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if ev := toDeviceEvents(t, res); len(ev) != 1 || ev[0].Sender != alice.UserID || ev[0].Type != "m.test" || string(ev[0].Content) != `{"n":1}` {
				t.Fatalf("initial sync's to-device messages: %+v", ev)
			}
			if !strings.Contains(res.NextBatch, "_d") {
				t.Fatalf("next_batch %q has no to-device part", res.NextBatch)
			}
			tok = res.NextBatch
		}
		res, err := ts.sync.Sync(ctx, bob, tok, 0, SyncOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if ev := toDeviceEvents(t, res); len(ev) != 0 {
			t.Fatalf("acknowledged messages delivered again: %+v", ev)
		}
		// They are gone from the inbox, not only from the answer.
		left, err := ts.store.ToDeviceMessages(ctx, bob.UserID, bob.DeviceID, 0, 1<<40, 10)
		if err != nil || len(left) != 0 {
			t.Fatalf("inbox after acknowledgement: %+v %v", left, err)
		}
		if _, err := ts.sync.Sync(ctx, bob, "s1_dx", 0, SyncOptions{}); errcodeOf(err) != "M_INVALID_PARAM" {
			t.Fatalf("bad to-device part: %v", err)
		}
	})
}

// /keys/changes checks its tokens and answers whose device lists changed
// between them; "to" beyond the stream is only a bound.
func TestKeyChanges(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, tdb testdb.Database) {
		ctx := context.Background()
		ts := newTestServer(t, openTestDB(t, tdb), false)
		alice, bob := ts.login(t, "alice", "LAPTOP"), ts.login(t, "bob", "PHONE")
		for _, u := range []string{alice.UserID, bob.UserID} {
			if err := ts.keys.SetMembership(ctx, "!shared:local.test", u, storage.MembershipJoin); err != nil {
				t.Fatal(err)
			}
		}
		for _, tc := range []struct{ from, to, code string }{
			{"", "s1", "M_MISSING_PARAM"},
			{"s1", "", "M_MISSING_PARAM"},
			{"x1", "s1", "M_INVALID_PARAM"},
			{"s1", "s-1", "M_INVALID_PARAM"},
		} {
			if _, err := ts.sync.KeyChanges(ctx, alice, tc.from, tc.to); errcodeOf(err) != tc.code {
				t.Errorf("from %q to %q: %v, want %s", tc.from, tc.to, err, tc.code)
			}
		}
		from, err := ts.store.CurrentPos(ctx)
		if err != nil {
			t.Fatal(err)
		}
		name := "renamed"
		if err := ts.users.RenameDevice(ctx, bob, bob.DeviceID, &name); err != nil {
			t.Fatal(err)
		}
		res, err := ts.sync.KeyChanges(ctx, alice, streamtoken.Format(from), "s999999999")
		if err != nil || len(res.Changed) != 1 || res.Changed[0] != bob.UserID {
			t.Fatalf("changes after the rename: %+v %v", res, err)
		}
		res, err = ts.sync.KeyChanges(ctx, alice, streamtoken.Format(from), streamtoken.Format(from))
		if err != nil || len(res.Changed)+len(res.Left) != 0 {
			t.Fatalf("changes in an empty range: %+v %v", res, err)
		}
	})
}

// At shutdown the notifier is closed: a waiting /sync answers at once,
// with what the stream holds.
func TestWaitingSyncAnswersAtShutdown(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, tdb testdb.Database) {
		ctx := context.Background()
		ts := newTestServer(t, openTestDB(t, tdb), true)
		bob := ts.login(t, "bob", "PHONE")
		since, err := ts.store.CurrentPos(ctx)
		if err != nil {
			t.Fatal(err)
		}
		type answer struct {
			res SyncResponse
			err error
		}
		done := make(chan answer, 1)
		go func() {
			res, err := ts.sync.Sync(ctx, bob, streamtoken.Format(since), time.Hour, SyncOptions{})
			done <- answer{res, err}
		}()
		waitFor(t, "the sync to wait", func() bool { return ts.sync.WaitingSyncs() == 1 })
		ts.notifier.Close()
		select {
		case a := <-done:
			if a.err != nil || a.res.NextBatch == "" {
				t.Fatalf("released sync: %+v %v", a.res, a.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the waiting sync did not answer at shutdown")
		}
	})
}
