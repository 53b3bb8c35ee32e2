package presence_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/presence"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

const (
	alice = "@alice:local.test"
	bob   = "@bob:local.test"
	carol = "@carol:local.test"
	zed   = "@zed:remote.test"
	room  = "!room:local.test"
)

type fixture struct {
	s       *presence.Service
	store   *sqlstore.Store
	now     time.Time
	changes []storage.Change
	queued  int
}

// setup makes a service on db with alice, bob and carol; alice, bob and
// zed (of remote.test) are joined to one room, carol to none.
func setup(t *testing.T, db testdb.Database, enabled bool) *fixture {
	t.Helper()
	ctx := context.Background()
	store, err := sqlstore.Open(ctx, db.URI, "local.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	for _, u := range []string{alice, bob, carol} {
		if _, err := store.CreateAccount(ctx, u, "x", nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, u := range []string{alice, bob, zed} {
		if _, err := store.SetMembership(ctx, room, u, storage.MembershipJoin, 0); err != nil {
			t.Fatal(err)
		}
	}
	f := &fixture{store: store, now: time.UnixMilli(1_700_000_000_000)}
	f.s = presence.New(store, presence.Options{ServerName: "local.test", Enabled: enabled,
		Changed: func(ch storage.Change) {
			if ch.Pos > 0 {
				f.changes = append(f.changes, ch)
			}
		},
		Queued: func() { f.queued++ },
		Now:    func() time.Time { return f.now }})
	return f
}

func caller(u string) matrixid.Caller { return matrixid.Caller{UserID: u, DeviceID: "DEV"} }

func errStatus(err error) (int, string) {
	var me *mxerr.Error
	if errors.As(err, &me) {
		return me.Status, me.Code
	}
	return 0, ""
}

func str(s string) *string { return &s }

// state reads a user's presence as the user sees it.
func (f *fixture) state(t *testing.T, u string) presence.Status {
	t.Helper()
	st, err := f.s.Status(context.Background(), caller(u), u)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// section reads the presence part of a /sync of u for (from, now].
func (f *fixture) section(t *testing.T, u string, from storage.StreamPos) ([]presence.SyncEvent, storage.StreamPos) {
	t.Helper()
	ctx := context.Background()
	pos, err := f.store.CurrentPos(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sec, news, err := f.s.SyncSection(ctx, u, from, pos)
	if err != nil {
		t.Fatal(err)
	}
	evs := sec.(*presence.SyncSection).Events
	if news != (len(evs) > 0) {
		t.Fatalf("news %v with %d events", news, len(evs))
	}
	return evs, pos
}

func senders(evs []presence.SyncEvent) []string {
	var out []string
	for _, e := range evs {
		if e.Type != "m.presence" {
			panic(e.Type)
		}
		out = append(out, e.Sender)
	}
	slices.Sort(out)
	return out
}

func TestSetAndStatus(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		f := setup(t, db, true)
		if st := f.state(t, alice); st.Presence != presence.Offline || st.LastActiveAgo != nil || st.CurrentlyActive != nil {
			t.Fatalf("never seen: %+v", st)
		}
		if err := f.s.SetStatus(ctx, caller(alice), alice, presence.SetRequest{Presence: "online", StatusMsg: str("lunch")}); err != nil {
			t.Fatal(err)
		}
		// The change concerns alice and bob (sharing a room), not carol.
		if len(f.changes) != 1 || !slices.Equal(f.changes[0].Users, []string{alice, bob}) {
			t.Fatalf("changes %+v", f.changes)
		}
		f.now = f.now.Add(2 * time.Second)
		for _, viewer := range []string{alice, bob} {
			st, err := f.s.Status(ctx, caller(viewer), alice)
			if err != nil || st.Presence != "online" || st.StatusMsg != "lunch" || st.LastActiveAgo == nil || *st.LastActiveAgo != 2000 ||
				st.CurrentlyActive == nil || !*st.CurrentlyActive {
				t.Fatalf("%s sees %+v (%v)", viewer, st, err)
			}
		}
		// zed's server shares the room: the change is queued for it.
		queued, err := f.store.PendingPresence(ctx, "remote.test", 10)
		if err != nil || len(queued) != 1 || f.queued != 1 {
			t.Fatalf("queued %v (%v), told %d", queued, err, f.queued)
		}
		var entry map[string]any
		if err := json.Unmarshal(queued[0].Content, &entry); err != nil || entry["user_id"] != alice || entry["presence"] != "online" ||
			entry["status_msg"] != "lunch" || entry["currently_active"] != true {
			t.Fatalf("queued entry %s", queued[0].Content)
		}

		for _, c := range []struct {
			what       string
			viewer, of string
			status     int
			code       string
		}{
			{"no shared room", carol, alice, 403, "M_FORBIDDEN"},
			{"an unknown local user", alice, "@nobody:local.test", 404, "M_NOT_FOUND"},
			{"a remote user sharing no room", alice, "@who:elsewhere.test", 403, "M_FORBIDDEN"},
			{"not a user ID", alice, "alice", 400, "M_INVALID_PARAM"},
		} {
			_, err := f.s.Status(ctx, caller(c.viewer), c.of)
			if st, code := errStatus(err); st != c.status || code != c.code {
				t.Fatalf("%s: %v, want %d %s", c.what, err, c.status, c.code)
			}
		}
		// A remote user in a shared room may be read (offline until heard of).
		if st, err := f.s.Status(ctx, caller(alice), zed); err != nil || st.Presence != "offline" {
			t.Fatalf("zed: %+v %v", st, err)
		}

		// Mistakes change nothing.
		for _, c := range []struct {
			what   string
			as, of string
			req    presence.SetRequest
			status int
			code   string
		}{
			{"someone else's", bob, alice, presence.SetRequest{Presence: "offline"}, 403, "M_FORBIDDEN"},
			{"an unknown state", alice, alice, presence.SetRequest{Presence: "busy"}, 400, "M_INVALID_PARAM"},
			{"no state", alice, alice, presence.SetRequest{}, 400, "M_INVALID_PARAM"},
			{"not a user ID", alice, "alice", presence.SetRequest{Presence: "offline"}, 400, "M_INVALID_PARAM"},
		} {
			err := f.s.SetStatus(ctx, caller(c.as), c.of, c.req)
			if st, code := errStatus(err); st != c.status || code != c.code {
				t.Fatalf("%s: %v, want %d %s", c.what, err, c.status, c.code)
			}
		}
		if st := f.state(t, alice); st.Presence != "online" || st.StatusMsg != "lunch" || len(f.changes) != 1 {
			t.Fatalf("after mistakes: %+v, %d changes", st, len(f.changes))
		}

		// Without status_msg the message goes; unavailable is not
		// currently active.
		if err := f.s.SetStatus(ctx, caller(alice), alice, presence.SetRequest{Presence: "unavailable"}); err != nil {
			t.Fatal(err)
		}
		if st := f.state(t, alice); st.Presence != "unavailable" || st.StatusMsg != "" || st.CurrentlyActive != nil || len(f.changes) != 2 {
			t.Fatalf("unavailable: %+v, %d changes", st, len(f.changes))
		}
		// The same state again is no news.
		if err := f.s.SetStatus(ctx, caller(alice), alice, presence.SetRequest{Presence: "unavailable"}); err != nil || len(f.changes) != 2 {
			t.Fatalf("the same again: %v, %d changes", err, len(f.changes))
		}
	})
}

// /sync's section: an initial sync has the current presence of the user
// and of those sharing a room, offline ones left out; an incremental one
// the changes of its range.
func TestSyncSection(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		f := setup(t, db, true)
		for _, u := range []string{alice, carol} {
			if err := f.s.SetStatus(ctx, caller(u), u, presence.SetRequest{Presence: "online"}); err != nil {
				t.Fatal(err)
			}
		}
		if err := f.s.SetStatus(ctx, caller(bob), bob, presence.SetRequest{Presence: "offline", StatusMsg: str("away")}); err != nil {
			t.Fatal(err)
		}
		evs, pos := f.section(t, bob, 0)
		if got := senders(evs); !slices.Equal(got, []string{alice}) {
			t.Fatalf("bob's initial sync: %v", got)
		}
		if evs, _ := f.section(t, carol, 0); !slices.Equal(senders(evs), []string{carol}) {
			t.Fatalf("carol's initial sync: %v", senders(evs))
		}
		if evs, _ := f.section(t, bob, pos); len(evs) != 0 {
			t.Fatalf("nothing new: %v", senders(evs))
		}
		if err := f.s.SetStatus(ctx, caller(alice), alice, presence.SetRequest{Presence: "unavailable", StatusMsg: str("brb")}); err != nil {
			t.Fatal(err)
		}
		evs, _ = f.section(t, bob, pos)
		if len(evs) != 1 || evs[0].Sender != alice || evs[0].Content.Presence != "unavailable" || evs[0].Content.StatusMsg != "brb" {
			t.Fatalf("bob's incremental sync: %+v", evs)
		}
		if evs, _ := f.section(t, carol, pos); len(evs) != 0 {
			t.Fatalf("carol sees %v", senders(evs))
		}
	})
}

// Syncing marks the user online as Synapse does; the timeouts make an
// idle user unavailable, one who stopped syncing offline, and send local
// presence again to other servers every FederationPingInterval.
func TestSyncingAndTimeouts(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		f := setup(t, db, true)
		start := f.now
		timeouts := func() {
			t.Helper()
			if err := f.s.HandleTimeouts(ctx); err != nil {
				t.Fatal(err)
			}
		}
		// set_presence offline leaves presence alone.
		if err := f.s.Syncing(ctx, caller(alice), "offline", 30*time.Second); err != nil || len(f.changes) != 0 || f.state(t, alice).Presence != "offline" {
			t.Fatalf("set_presence offline: %v, %d changes", err, len(f.changes))
		}
		if err := f.s.Syncing(ctx, caller(alice), "", 30*time.Second); err != nil {
			t.Fatal(err)
		}
		if st := f.state(t, alice); st.Presence != "online" || !*st.CurrentlyActive || len(f.changes) != 1 {
			t.Fatalf("after a /sync: %+v, %d changes", st, len(f.changes))
		}
		// Syncing on is no news.
		f.now = f.now.Add(5 * time.Second)
		if err := f.s.Syncing(ctx, caller(alice), "online", 30*time.Second); err != nil || len(f.changes) != 1 {
			t.Fatalf("syncing on: %v, %d changes", err, len(f.changes))
		}
		// set_presence unavailable.
		if err := f.s.Syncing(ctx, caller(alice), "unavailable", 30*time.Second); err != nil || f.state(t, alice).Presence != "unavailable" || len(f.changes) != 2 {
			t.Fatalf("set_presence unavailable: %v, %+v", err, f.state(t, alice))
		}
		if err := f.s.Syncing(ctx, caller(alice), "online", 30*time.Second); err != nil || f.state(t, alice).Presence != "online" {
			t.Fatalf("online again: %v, %+v", err, f.state(t, alice))
		}
		n := len(f.changes)
		// While the last /sync may still run (30 s from start+5s) and for
		// SyncOnlineTimeout after, alice stays online; a minute after
		// her last activity she is no longer currently active.
		f.now = start.Add(5*time.Second + presence.LastActiveGranularity + time.Second)
		timeouts()
		if st := f.state(t, alice); st.Presence != "online" || *st.CurrentlyActive || len(f.changes) != n+1 {
			t.Fatalf("a minute on: %+v, %d changes", st, len(f.changes)-n)
		}
		timeouts() // nothing more is due
		if len(f.changes) != n+1 {
			t.Fatalf("a second pass changed %d", len(f.changes)-n-1)
		}
		// Gone: offline once the /sync's end (plus slack) and
		// SyncOnlineTimeout have passed.
		f.now = start.Add(5*time.Second + 30*time.Second + 10*time.Second + presence.SyncOnlineTimeout + time.Second)
		timeouts()
		if st := f.state(t, alice); st.Presence != "offline" || len(f.changes) != n+2 {
			t.Fatalf("stopped syncing: %+v", st)
		}

		// A long poll without activity: idle (unavailable) after
		// IdleTimer, though still syncing.
		start = f.now
		if err := f.s.Syncing(ctx, caller(bob), "online", time.Hour); err != nil {
			t.Fatal(err)
		}
		f.now = start.Add(presence.IdleTimer - time.Second)
		timeouts()
		if st := f.state(t, bob); st.Presence != "online" {
			t.Fatalf("bob before IdleTimer: %+v", st)
		}
		f.now = start.Add(presence.IdleTimer + time.Second)
		timeouts()
		if st := f.state(t, bob); st.Presence != "unavailable" {
			t.Fatalf("bob after IdleTimer: %+v", st)
		}
		// Still syncing: bob's presence is sent again to remote.test when
		// the ping is due, though nothing changed.
		queued, err := f.store.PendingPresence(ctx, "remote.test", 10)
		if err != nil || len(queued) == 0 {
			t.Fatalf("queued %v %v", queued, err)
		}
		if err := f.store.MarkPresenceSent(ctx, "remote.test", queued); err != nil {
			t.Fatal(err)
		}
		n = len(f.changes)
		f.now = start.Add(presence.IdleTimer + time.Second + presence.FederationPingInterval + time.Second)
		timeouts()
		queued, err = f.store.PendingPresence(ctx, "remote.test", 10)
		if err != nil || len(queued) != 1 || len(f.changes) != n {
			t.Fatalf("the ping: %v %v, %d changes", queued, err, len(f.changes)-n)
		}
		var entry map[string]any
		if err := json.Unmarshal(queued[0].Content, &entry); err != nil || entry["user_id"] != bob || entry["presence"] != "unavailable" {
			t.Fatalf("the ping's entry: %s", queued[0].Content)
		}

		// A status set without syncing lasts SyncOnlineTimeout.
		start = f.now
		if err := f.s.SetStatus(ctx, caller(carol), carol, presence.SetRequest{Presence: "unavailable", StatusMsg: str("away")}); err != nil {
			t.Fatal(err)
		}
		f.now = start.Add(presence.SyncOnlineTimeout - time.Second)
		timeouts()
		if st := f.state(t, carol); st.Presence != "unavailable" {
			t.Fatalf("carol before SyncOnlineTimeout: %+v", st)
		}
		f.now = start.Add(presence.SyncOnlineTimeout + time.Second)
		timeouts()
		if st := f.state(t, carol); st.Presence != "offline" || st.StatusMsg != "away" {
			t.Fatalf("carol after SyncOnlineTimeout: %+v", st)
		}
	})
}

// Other servers' presence: only about their own users, in a known state;
// it times out after FederationTimeout without news.
func TestReceivePresence(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		f := setup(t, db, true)
		edu := `{"push":[
			{"user_id":"@zed:remote.test","presence":"online","last_active_ago":5000,"status_msg":"hi","currently_active":true},
			{"user_id":"@alice:local.test","presence":"online"},
			{"user_id":"@yan:other.test","presence":"online"},
			{"user_id":"@xi:remote.test","presence":"online"},
			{"user_id":"@zed:remote.test","presence":"dancing"},
			{"user_id":42},
			"not an object"
		]}`
		if err := f.s.ReceivePresence(ctx, "remote.test", json.RawMessage(edu)); err != nil {
			t.Fatal(err)
		}
		stored, err := f.store.Presence(ctx, []string{zed, alice, "@yan:other.test", "@xi:remote.test"})
		if err != nil {
			t.Fatal(err)
		}
		// xi shares no room yet: kept, seen by nobody.
		if len(stored) != 2 || stored[zed].State != "online" || stored["@xi:remote.test"].State != "online" {
			t.Fatalf("stored %+v", stored)
		}
		if _, err := f.s.Status(ctx, caller(alice), "@xi:remote.test"); func() bool { s, _ := errStatus(err); return s != 403 }() {
			t.Fatalf("alice reads xi: %v", err)
		}
		st, err := f.s.Status(ctx, caller(alice), zed)
		if err != nil || st.Presence != "online" || st.StatusMsg != "hi" || *st.LastActiveAgo != 5000 || !*st.CurrentlyActive {
			t.Fatalf("zed: %+v %v", st, err)
		}
		if len(f.changes) != 2 || !slices.Equal(f.changes[0].Users, []string{alice, bob}) || len(f.changes[1].Users) != 0 || f.queued != 0 {
			t.Fatalf("changes %+v, queued %d", f.changes, f.queued)
		}
		evs, _ := f.section(t, bob, 0)
		if !slices.Equal(senders(evs), []string{zed}) {
			t.Fatalf("bob's sync: %v", senders(evs))
		}
		// Malformed EDUs are dropped without failing the transaction.
		for _, bad := range []string{`[]`, `{"push":{}}`, `"x"`} {
			if err := f.s.ReceivePresence(ctx, "remote.test", json.RawMessage(bad)); err != nil {
				t.Fatalf("%s: %v", bad, err)
			}
		}
		f.now = f.now.Add(presence.FederationTimeout - time.Second)
		if err := f.s.HandleTimeouts(ctx); err != nil {
			t.Fatal(err)
		}
		if st, _ := f.s.Status(ctx, caller(alice), zed); st.Presence != "online" {
			t.Fatalf("zed before FederationTimeout: %+v", st)
		}
		f.now = f.now.Add(2 * time.Second)
		if err := f.s.HandleTimeouts(ctx); err != nil {
			t.Fatal(err)
		}
		if st, _ := f.s.Status(ctx, caller(alice), zed); st.Presence != "offline" {
			t.Fatalf("zed after FederationTimeout: %+v", st)
		}
	})
}

// Off: nothing is stored or queued, EDUs are ignored, everyone reads as
// offline.
func TestDisabled(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		f := setup(t, db, false)
		if err := f.s.SetStatus(ctx, caller(alice), alice, presence.SetRequest{Presence: "online", StatusMsg: str("x")}); err != nil {
			t.Fatal(err)
		}
		if err := f.s.Syncing(ctx, caller(alice), "", 30*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := f.s.ReceivePresence(ctx, "remote.test", json.RawMessage(`{"push":[{"user_id":"@zed:remote.test","presence":"online"}]}`)); err != nil {
			t.Fatal(err)
		}
		stored, err := f.store.Presence(ctx, []string{alice, zed})
		if err != nil || len(stored) != 0 || len(f.changes) != 0 || f.queued != 0 {
			t.Fatalf("stored %+v (%v), %d changes, queued %d", stored, err, len(f.changes), f.queued)
		}
		if dests, err := f.store.PresenceDestinations(ctx); err != nil || len(dests) != 0 {
			t.Fatalf("queued for %v (%v)", dests, err)
		}
		// Anyone's presence reads offline, as in Synapse.
		if st, err := f.s.Status(ctx, caller(carol), alice); err != nil || st.Presence != "offline" || st.LastActiveAgo != nil {
			t.Fatalf("carol reads alice: %+v %v", st, err)
		}
		// Someone else's is still refused.
		if err := f.s.SetStatus(ctx, caller(bob), alice, presence.SetRequest{Presence: "online"}); func() bool { s, _ := errStatus(err); return s != 403 }() {
			t.Fatalf("setting alice's as bob: %v", err)
		}
	})
}
