package clientapi_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

func accountDataPath(userID, roomID, dataType string) string {
	p := "/_matrix/client/v3/user/" + url.PathEscape(userID)
	if roomID != "" {
		p += "/rooms/" + url.PathEscape(roomID)
	}
	return p + "/account_data/" + url.PathEscape(dataType)
}

// accountDataEvents returns a /sync answer's account_data events as
// canonical JSON.
func accountDataEvents(t *testing.T, sync map[string]any) string {
	t.Helper()
	section, ok := sync["account_data"].(map[string]any)
	if !ok {
		t.Fatalf("no account_data in /sync: %v", sync)
	}
	return testutil.Canonical(t, section["events"])
}

func accountDataSync(t *testing.T, srv *testutil.Server, u *testutil.User, since string) map[string]any {
	t.Helper()
	q := "?timeout=0"
	if since != "" {
		q += "&since=" + since
	}
	return srv.Must(t, "GET", "/_matrix/client/v3/sync"+q, u.Token, nil)
}

func TestAccountData(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		const room, otherRoom, typ = "!room:test.local", "!roomWithoutServerName", "m.secret_storage.default_key"
		global := accountDataPath(alice.UserID, "", typ)
		perRoom := accountDataPath(alice.UserID, room, typ)
		expect := func(what, path string, want string) {
			t.Helper()
			if got := testutil.Canonical(t, srv.Must(t, "GET", path, alice.Token, nil)); got != want {
				t.Fatalf("%s: %s, want %s", what, got, want)
			}
		}
		fails := func(method, path, token string, body any, status int, errcode string) {
			t.Helper()
			r := srv.Do(t, method, path, token, body)
			if r.Status != status || r.Errcode() != errcode {
				t.Fatalf("%s %s %v: %d %s, want %d %s", method, path, body, r.Status, r.Raw, status, errcode)
			}
		}

		fails("GET", global, alice.Token, nil, http.StatusNotFound, "M_NOT_FOUND")
		if r := srv.Must(t, "PUT", global, alice.Token, map[string]any{"key": "abc", "n": 1}); len(r) != 0 {
			t.Fatalf("PUT answered %v", r)
		}
		expect("global", global, `{"key":"abc","n":1}`)
		srv.Must(t, "PUT", global, alice.Token, map[string]any{"key": "def"})
		expect("global replaced", global, `{"key":"def"}`)
		srv.Must(t, "PUT", global, alice.Token, map[string]any{})
		expect("set to {}", global, `{}`)
		srv.Must(t, "PUT", global, alice.Token, map[string]any{"key": "def"})

		// Per room: its own namespace, per room.
		fails("GET", perRoom, alice.Token, nil, http.StatusNotFound, "M_NOT_FOUND")
		srv.Must(t, "PUT", perRoom, alice.Token, map[string]any{"tags": map[string]any{"u.work": map[string]any{}}})
		expect("per room", perRoom, `{"tags":{"u.work":{}}}`)
		expect("global after a room's", global, `{"key":"def"}`)
		fails("GET", accountDataPath(alice.UserID, otherRoom, typ), alice.Token, nil, http.StatusNotFound, "M_NOT_FOUND")
		srv.Must(t, "PUT", accountDataPath(alice.UserID, otherRoom, typ), alice.Token, map[string]any{"x": true})
		expect("a room ID without a server name", accountDataPath(alice.UserID, otherRoom, typ), `{"x":true}`)

		// Only the owner reads or writes them.
		for _, path := range []string{global, perRoom} {
			fails("GET", path, bob.Token, nil, http.StatusForbidden, "M_FORBIDDEN")
			fails("PUT", path, bob.Token, map[string]any{"key": "bob's"}, http.StatusForbidden, "M_FORBIDDEN")
			fails("GET", path, "", nil, http.StatusUnauthorized, "M_MISSING_TOKEN")
			fails("PUT", path, "", map[string]any{}, http.StatusUnauthorized, "M_MISSING_TOKEN")
		}
		fails("GET", accountDataPath(bob.UserID, "", typ), bob.Token, nil, http.StatusNotFound, "M_NOT_FOUND")

		// Bad requests change nothing.
		since := syncToken(t, srv, alice)
		for _, c := range []struct {
			path    string
			body    any
			status  int
			errcode string
		}{
			{global, "{", 400, "M_NOT_JSON"},
			{global, "", 400, "M_NOT_JSON"},
			{global, "[1]", 400, "M_BAD_JSON"},
			{global, `"text"`, 400, "M_BAD_JSON"},
			{global, "null", 400, "M_BAD_JSON"},
			{global, `{"a":"\u0000"}`, 400, "M_BAD_JSON"},
			{perRoom, "[]", 400, "M_BAD_JSON"},
			{accountDataPath(alice.UserID, "room", typ), map[string]any{}, 400, "M_INVALID_PARAM"},
			{accountDataPath(alice.UserID, "!", typ), map[string]any{}, 400, "M_INVALID_PARAM"},
			{accountDataPath(alice.UserID, "", strings.Repeat("t", 256)), map[string]any{}, 400, "M_INVALID_PARAM"},
			{accountDataPath(alice.UserID, "", "bad\x01type"), map[string]any{}, 400, "M_INVALID_PARAM"},
			{accountDataPath(alice.UserID, "", "m.push_rules"), map[string]any{}, 405, "M_BAD_JSON"},
			{accountDataPath(alice.UserID, "", "m.fully_read"), map[string]any{}, 405, "M_BAD_JSON"},
			{accountDataPath(alice.UserID, room, "m.fully_read"), map[string]any{"event_id": "$e"}, 405, "M_BAD_JSON"},
		} {
			fails("PUT", c.path, alice.Token, c.body, c.status, c.errcode)
		}
		fails("GET", accountDataPath(alice.UserID, "room", typ), alice.Token, nil, 400, "M_INVALID_PARAM")
		expect("global after bad requests", global, `{"key":"def"}`)
		expect("per room after bad requests", perRoom, `{"tags":{"u.work":{}}}`)
		if ev := accountDataEvents(t, accountDataSync(t, srv, alice, since)); ev != `[]` {
			t.Fatalf("bad requests reached /sync: %s", ev)
		}
	})
}

// /sync hands out global account data: all of it on an initial sync, what
// changed since the token (newest content, once per type) on an
// incremental one; room account data stays out until /sync has rooms.
func TestAccountDataInSync(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		put := func(roomID, typ string, content map[string]any) {
			srv.Must(t, "PUT", accountDataPath(alice.UserID, roomID, typ), alice.Token, content)
		}
		events := func(since string) string {
			t.Helper()
			return accountDataEvents(t, accountDataSync(t, srv, alice, since))
		}
		if ev := events(""); ev != `[]` {
			t.Fatalf("initial sync without account data: %s", ev)
		}
		start := syncToken(t, srv, alice)
		put("", "a.type", map[string]any{"v": 1})
		put("", "b.type", map[string]any{"v": 1})
		put("!room:test.local", "a.type", map[string]any{"room": true})
		const both = `[{"content":{"v":1},"type":"a.type"},{"content":{"v":1},"type":"b.type"}]`
		if ev := events(""); ev != both {
			t.Fatalf("initial sync: %s", ev)
		}
		if ev := events(start); ev != both {
			t.Fatalf("since before both: %s", ev)
		}
		tok := syncToken(t, srv, alice)
		if ev := events(tok); ev != `[]` {
			t.Fatalf("since after both: %s", ev)
		}
		put("", "a.type", map[string]any{"v": 2})
		put("", "a.type", map[string]any{"v": 3})
		if ev := events(tok); ev != `[{"content":{"v":3},"type":"a.type"}]` {
			t.Fatalf("since a changed twice: %s", ev)
		}
		// The same token again gets the same answer: nothing is consumed.
		if ev := events(tok); ev != `[{"content":{"v":3},"type":"a.type"}]` {
			t.Fatalf("the same token again: %s", ev)
		}
		if ev := events(""); ev != `[{"content":{"v":1},"type":"b.type"},{"content":{"v":3},"type":"a.type"}]` {
			t.Fatalf("initial sync after changes: %s", ev)
		}
		// A room's account data is not global.
		tok = syncToken(t, srv, alice)
		put("!room:test.local", "b.type", map[string]any{"room": true})
		if ev := events(tok); ev != `[]` {
			t.Fatalf("after a room's change: %s", ev)
		}
		// Tokens of before account data existed (any stream position) work.
		if ev := events("s0"); ev != `[{"content":{"v":1},"type":"b.type"},{"content":{"v":3},"type":"a.type"}]` {
			t.Fatalf("since s0: %s", ev)
		}
		// Other users see none of it.
		if ev := accountDataEvents(t, accountDataSync(t, srv, bob, "")); ev != `[]` {
			t.Fatalf("bob's initial sync: %s", ev)
		}
		if ev := accountDataEvents(t, accountDataSync(t, srv, bob, start)); ev != `[]` {
			t.Fatalf("bob's incremental sync: %s", ev)
		}
	})
}

// A waiting /sync ends with a change of its user's global account data,
// not with one of a room's, nor with another user's.
func TestAccountDataWakesWaitingSync(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		since := syncToken(t, srv, alice)
		aliceSync := syncAsync(t, srv, alice, since, 1)
		// Bob's wait is short: it must end by its timeout, empty.
		bobSince := syncToken(t, srv, bob)
		bobSync := make(chan testutil.Response, 1)
		go func() {
			bobSync <- srv.Do(t, "GET", "/_matrix/client/v3/sync?timeout=1500&since="+bobSince, bob.Token, nil)
		}()
		waitFor(t, "both syncs to wait", func() bool { return srv.Parts.Sync.WaitingSyncs() == 2 })

		// Neither wakes for good on a room's change: if alice's did, its
		// answer would lack the global change that follows.
		srv.Must(t, "PUT", accountDataPath(alice.UserID, "!room:test.local", "m.tag"), alice.Token, map[string]any{"tags": map[string]any{}})
		srv.Must(t, "PUT", accountDataPath(alice.UserID, "", "m.direct"), alice.Token, map[string]any{"@bob:test.local": []string{"!dm:test.local"}})
		r := receive(t, aliceSync)
		if ev := accountDataEvents(t, r.Body); ev != `[{"content":{"@bob:test.local":["!dm:test.local"]},"type":"m.direct"}]` {
			t.Fatalf("the waiting sync answered %s", ev)
		}
		if ev := accountDataEvents(t, receive(t, bobSync).Body); ev != `[]` {
			t.Fatalf("bob's sync answered %s", ev)
		}
		// The next wait starts after it.
		next := r.Body["next_batch"].(string)
		if ev := accountDataEvents(t, accountDataSync(t, srv, alice, next)); ev != `[]` {
			t.Fatalf("since the answer: %s", ev)
		}
	})
}

// Daemons sharing a PostgreSQL database: a change made through one wakes
// a /sync waiting on the other.
func TestAccountDataWakesSyncOnAnotherDaemon(t *testing.T) {
	db := testutil.Postgres(t)
	a1 := testutil.StartNode(t, db, nil)
	a2 := testutil.StartNode(t, db, func(c *config.Config) { c.ServerName = a1.ServerName })
	alice := a1.Register(t, "alice", "")
	waiting := syncAsync(t, a2.Server, alice, syncToken(t, a2.Server, alice), 1)
	a1.Must(t, "PUT", accountDataPath(alice.UserID, "", "m.direct"), alice.Token, map[string]any{"k": "v"})
	if ev := accountDataEvents(t, receive(t, waiting).Body); ev != `[{"content":{"k":"v"},"type":"m.direct"}]` {
		t.Fatalf("the sync on the other daemon answered %s", ev)
	}
}

// Deactivating an account deletes its account data, and nobody else's.
func TestAccountDataGoesWithTheAccount(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		for _, u := range []*testutil.User{alice, bob} {
			srv.Must(t, "PUT", accountDataPath(u.UserID, "", "m.secret_storage.default_key"), u.Token, map[string]any{"key": "k"})
			srv.Must(t, "PUT", accountDataPath(u.UserID, "!room:x", "m.tag"), u.Token, map[string]any{"tags": map[string]any{}})
		}
		path := acctV3 + "/account/deactivate"
		session := acctExpectChallenge(t, srv.Do(t, "POST", path, alice.Token, map[string]any{}), "m.login.password")
		srv.Must(t, "POST", path, alice.Token, map[string]any{"auth": acctPasswordAuth("alice", alice.Password, session)})
		count := func(userID string) int {
			var n int
			if err := srv.Store.DB().QueryRow(`SELECT COUNT(*) FROM account_data WHERE user_id = $1`, userID).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		if a, b := count(alice.UserID), count(bob.UserID); a != 0 || b != 2 {
			t.Fatalf("after alice's deactivation: %d of her account data, %d of bob's (want 0 and 2)", a, b)
		}
	})
}
