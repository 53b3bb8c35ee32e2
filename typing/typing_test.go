package typing_test

import (
	"context"
	"encoding/json"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/clock"
	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/typing"
)

type fixture struct {
	srv        *testutil.Server
	svc        *typing.Service
	clock      *clock.Fake
	alice, bob *testutil.User
	roomID     string
	mu         sync.Mutex
	changes    []storage.Change
}

// setup makes a room of alice's that bob joined, and a typing service on
// the server's database whose clock the test moves.
func setup(t *testing.T, db testutil.Database) *fixture {
	f := &fixture{clock: clock.NewFake()}
	f.srv = testutil.NewServer(t, db, testutil.ServerOptions{Now: f.clock.Now})
	f.alice, f.bob = f.srv.Register(t, "alice", ""), f.srv.Register(t, "bob", "")
	f.roomID = f.srv.Must(t, "POST", "/_matrix/client/v3/createRoom", f.alice.Token, map[string]any{"preset": "public_chat"})["room_id"].(string)
	f.srv.Must(t, "POST", "/_matrix/client/v3/rooms/"+url.PathEscape(f.roomID)+"/join", f.bob.Token, map[string]any{})
	f.svc = typing.New(f.srv.Store, typing.Options{ServerName: f.srv.ServerName, Clock: f.clock,
		Changed: func(ch storage.Change) { f.mu.Lock(); f.changes = append(f.changes, ch); f.mu.Unlock() }})
	return f
}

func (f *fixture) set(t *testing.T, u *testutil.User, body string) {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatal(err)
	}
	if err := f.svc.Set(context.Background(), matrixid.Caller{UserID: u.UserID, DeviceID: u.DeviceID}, f.roomID, u.UserID, m); err != nil {
		t.Fatalf("set typing %s: %v", body, err)
	}
}

func (f *fixture) typers(t *testing.T) []string {
	t.Helper()
	users, err := f.svc.RoomTyping(context.Background(), f.roomID)
	if err != nil {
		t.Fatal(err)
	}
	return users
}

// changed returns the changes passed on since the last call.
func (f *fixture) changed() []storage.Change {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.changes
	f.changes = nil
	return out
}

// A typing changes the stream once, for the room's local members; a
// typing started again changes nothing; Run ends it when its timeout runs
// out, which changes the stream again.
func TestTypingEndsWithItsTimeout(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		f := setup(t, db)
		ctx := context.Background()
		f.set(t, f.alice, `{"typing": true, "timeout": 5000}`)
		ch := f.changed()
		if len(ch) != 1 || ch[0].Pos == 0 || !slices.Equal(ch[0].Users, []string{f.alice.UserID, f.bob.UserID}) {
			t.Fatalf("changes %+v, want one for alice and bob", ch)
		}
		f.clock.Advance(time.Second)
		f.set(t, f.alice, `{"typing": true, "timeout": 5000}`) // now ends at +6 s
		if ch := f.changed(); len(ch) != 1 || ch[0].Pos != 0 {
			t.Fatalf("typing again: changes %+v, want none", ch)
		}
		if got := f.svc.EndDue(ctx); got != 5*time.Second {
			t.Fatalf("next end in %v, want 5s", got)
		}

		runCtx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { f.svc.Run(runCtx); close(done) }()
		defer func() { stop(); <-done }()
		end := f.clock.Now().Add(5 * time.Second)
		testutil.Eventually(t, "Run to wait for the typing's end", func() bool { return f.clock.WaitsUntil(end) })
		f.clock.Advance(4 * time.Second)
		if got := f.typers(t); !slices.Equal(got, []string{f.alice.UserID}) {
			t.Fatalf("typing %v before its end, want alice", got)
		}
		f.clock.Advance(time.Second)
		// The end is passed on after its write commits: wait for that.
		ch = nil
		testutil.Eventually(t, "the typing's end passed on", func() bool {
			ch = append(ch, f.changed()...)
			return len(ch) > 0
		})
		if due, err := f.srv.Store.ExpiredTyping(ctx, f.clock.Now().UnixMilli()); err != nil || len(due) != 0 {
			t.Fatalf("typings still due after the end: %v, %v", due, err)
		}
		if len(ch) != 1 || ch[0].Pos == 0 || !slices.Equal(ch[0].Users, []string{f.alice.UserID, f.bob.UserID}) {
			t.Fatalf("the end's changes %+v, want one for alice and bob", ch)
		}
		// /sync shows the room's typing changed, and no one typing.
		d, err := f.srv.Store.SyncData(ctx, storage.SyncQuery{UserID: f.bob.UserID, DeviceID: f.bob.DeviceID, Since: ch[0].Pos - 1})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(d.TypingRooms, []string{f.roomID}) {
			t.Fatalf("typing rooms %v, want the room", d.TypingRooms)
		}
		if ev := f.svc.SyncEphemeral(f.bob.UserID, &d)[f.roomID]; len(ev) != 1 || string(ev[0]) != `{"content":{"user_ids":[]},"type":"m.typing"}` {
			t.Fatalf("m.typing %s", ev)
		}
	})
}

// A typing that ended but was started again before it was ended stays.
func TestTypingStartedAgainAfterItsEnd(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		f := setup(t, db)
		f.set(t, f.bob, `{"typing": true, "timeout": 1000}`)
		f.clock.Advance(2 * time.Second)
		if got := f.typers(t); len(got) != 0 {
			t.Fatalf("typing %v after its end", got)
		}
		f.changed()
		f.set(t, f.bob, `{"typing": true, "timeout": 1000}`)
		if ch := f.changed(); len(ch) != 1 || ch[0].Pos == 0 {
			t.Fatalf("typing again after the end: changes %+v, want one", ch)
		}
		f.svc.EndDue(context.Background())
		if got := f.typers(t); !slices.Equal(got, []string{f.bob.UserID}) {
			t.Fatalf("typing %v, want bob", got)
		}
		// Stopping changes the stream; stopping again does not.
		f.set(t, f.bob, `{"typing": false}`)
		f.set(t, f.bob, `{"typing": false}`)
		if ch := f.changed(); len(ch) != 2 || ch[0].Pos == 0 || ch[1].Pos != 0 {
			t.Fatalf("stops: changes %+v, want one then none", ch)
		}
	})
}

// Other servers' typing: only their own users', in rooms they are joined
// to, for a minute after the EDU. (The room's joined member here is bob,
// the EDU's origin his server: what counts is that the user is of the
// origin and joined.)
func TestReceiveTyping(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		f := setup(t, db)
		ctx := context.Background()
		receive := func(origin, user string, on bool) {
			t.Helper()
			c, _ := json.Marshal(map[string]any{"room_id": f.roomID, "user_id": user, "typing": on})
			if err := f.svc.ReceiveTyping(ctx, origin, c); err != nil {
				t.Fatal(err)
			}
		}
		receive("remote.example", "@zoe:remote.example", true) // not in the room
		receive("other.example", f.bob.UserID, true)           // not of the origin
		if got := f.typers(t); len(got) != 0 {
			t.Fatalf("typing %v from refused EDUs", got)
		}
		if err := f.svc.ReceiveTyping(ctx, f.srv.ServerName, json.RawMessage(`{"room_id": 1}`)); err != nil {
			t.Fatalf("a malformed EDU failed: %v", err)
		}
		receive(f.srv.ServerName, f.bob.UserID, true)
		f.clock.Advance(59 * time.Second)
		if got := f.typers(t); !slices.Equal(got, []string{f.bob.UserID}) {
			t.Fatalf("typing %v, want bob", got)
		}
		f.clock.Advance(2 * time.Second)
		if got := f.typers(t); len(got) != 0 {
			t.Fatalf("a remote typing lasted beyond a minute: %v", got)
		}
		receive(f.srv.ServerName, f.bob.UserID, true)
		receive(f.srv.ServerName, f.bob.UserID, false)
		if got := f.typers(t); len(got) != 0 {
			t.Fatalf("typing %v after the stop", got)
		}
	})
}

// A local user's running typing is sent to other servers again every
// 40 s, by a start of the client's or by Run, until it ends.
func TestTypingSentAgain(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		f := setup(t, db)
		ctx := context.Background()
		f.svc = typing.New(f.srv.Store, typing.Options{ServerName: f.srv.ServerName, Federated: true, Clock: f.clock})
		toResend := func() []string {
			t.Helper()
			now := f.clock.Now()
			due, err := f.srv.Store.TypingToResend(ctx, now.Add(-typing.KeepAlive).UnixMilli(), now.UnixMilli())
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, d := range due {
				out = append(out, d.UserID)
			}
			return out
		}
		f.set(t, f.alice, `{"typing": true, "timeout": 100000}`)
		if got := f.svc.EndDue(ctx); got != typing.KeepAlive {
			t.Fatalf("next work in %v, want the keep-alive's 40s", got)
		}
		f.clock.Advance(39 * time.Second)
		if got := toResend(); len(got) != 0 {
			t.Fatalf("to send again after 39 s: %v", got)
		}
		f.clock.Advance(time.Second)
		if got := toResend(); !slices.Equal(got, []string{f.alice.UserID}) {
			t.Fatalf("to send again after 40 s: %v, want alice", got)
		}
		// Run's pass sends it; the next is due 40 s later.
		if got := f.svc.EndDue(ctx); got != typing.KeepAlive {
			t.Fatalf("next work in %v after the resend, want 40s", got)
		}
		if got := toResend(); len(got) != 0 {
			t.Fatalf("still to send again after Run's pass: %v", got)
		}
		// A start by the client 40 s later sends it too.
		f.clock.Advance(40 * time.Second)
		f.set(t, f.alice, `{"typing": true, "timeout": 30000}`)
		if got := toResend(); len(got) != 0 {
			t.Fatalf("still to send again after the client's start: %v", got)
		}
		if got := f.typers(t); !slices.Equal(got, []string{f.alice.UserID}) {
			t.Fatalf("typing %v, want alice", got)
		}
		// The end comes before the next resend: 30 s.
		if got := f.svc.EndDue(ctx); got != 30*time.Second {
			t.Fatalf("next work in %v, want the end in 30s", got)
		}
	})
}
