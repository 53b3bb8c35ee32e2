package clientapi_test

import (
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/testutil"
)

func syncToken(t *testing.T, srv *testutil.Server, u *testutil.User) string {
	t.Helper()
	return srv.Must(t, "GET", "/_matrix/client/v3/sync", u.Token, nil)["next_batch"].(string)
}

// changesSince returns /keys/changes for u from a token to now.
func changesSince(t *testing.T, srv *testutil.Server, u *testutil.User, from string) (changed, left []string) {
	t.Helper()
	to := syncToken(t, srv, u)
	r := srv.Must(t, "GET", "/_matrix/client/v3/keys/changes?from="+from+"&to="+to, u.Token, nil)
	return strs(t, r["changed"]), strs(t, r["left"])
}

func strs(t *testing.T, v any) []string {
	t.Helper()
	list, ok := v.([]any)
	if !ok {
		t.Fatalf("not a list: %v", v)
	}
	out := make([]string, 0, len(list))
	for _, s := range list {
		out = append(out, s.(string))
	}
	slices.Sort(out)
	return out
}

func sorted(s ...string) []string { slices.Sort(s); return s }

func expectUsers(t *testing.T, what string, got, want []string) {
	t.Helper()
	if want == nil {
		want = []string{}
	}
	if !slices.Equal(got, sorted(want...)) {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
}

func TestKeyChangesFollowSharedRooms(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		const room, other = "!room:test.local", "!other:test.local"
		srv.Join(t, room, alice.UserID)
		srv.Join(t, room, bob.UserID)

		// Keys of a room member are a change; those of a stranger are not;
		// the caller's own are.
		from := syncToken(t, srv, alice)
		srv.Upload(t, bob, map[string]any{"device_keys": bob.DeviceKeys(t)})
		srv.Upload(t, carol, map[string]any{"device_keys": carol.DeviceKeys(t)})
		changed, left := changesSince(t, srv, alice, from)
		expectUsers(t, "changed after bob's upload", changed, []string{bob.UserID})
		expectUsers(t, "left", left, nil)
		srv.Login(t, alice, "")
		changed, _ = changesSince(t, srv, alice, from)
		expectUsers(t, "changed after alice's login", changed, []string{alice.UserID, bob.UserID})

		// Starting to share a room is a change: a remote user too.
		from = syncToken(t, srv, alice)
		srv.Join(t, room, carol.UserID)
		srv.Join(t, room, "@dave:remote.example")
		changed, _ = changesSince(t, srv, alice, from)
		expectUsers(t, "changed after joins", changed, []string{carol.UserID, "@dave:remote.example"})

		// Renaming, new devices, deleting devices and logging out are changes.
		for name, act := range map[string]func(){
			"rename": func() {
				srv.Must(t, "PUT", "/_matrix/client/v3/devices/"+bob.DeviceID, bob.Token, map[string]string{"display_name": "new name"})
			},
			"login": func() { srv.Login(t, bob, "") },
			"logout": func() {
				srv.Must(t, "POST", "/_matrix/client/v3/logout", srv.Login(t, bob, "").Token, map[string]any{})
			},
			"delete": func() {
				d := srv.Login(t, bob, "")
				srv.Must(t, "DELETE", "/_matrix/client/v3/devices/"+d.DeviceID, bob.Token, map[string]any{"auth": map[string]any{
					"type": "m.login.password", "identifier": map[string]string{"type": "m.id.user", "user": bob.UserID}, "password": bob.Password}})
			},
		} {
			from := syncToken(t, srv, alice)
			act()
			changed, _ := changesSince(t, srv, alice, from)
			expectUsers(t, name, changed, []string{bob.UserID})
		}
		// Renaming to the same name is no change.
		from = syncToken(t, srv, alice)
		srv.Must(t, "PUT", "/_matrix/client/v3/devices/"+bob.DeviceID, bob.Token, map[string]string{"display_name": "new name"})
		changed, _ = changesSince(t, srv, alice, from)
		expectUsers(t, "same name", changed, nil)

		// Leaving one of two shared rooms is not leaving; leaving the last is.
		srv.Join(t, other, alice.UserID)
		srv.Join(t, other, bob.UserID)
		from = syncToken(t, srv, alice)
		srv.Leave(t, room, bob.UserID)
		_, left = changesSince(t, srv, alice, from)
		expectUsers(t, "left while sharing another room", left, nil)
		srv.Leave(t, other, bob.UserID)
		srv.Upload(t, bob, map[string]any{"one_time_keys": bob.OneTimeKeys(t, "B", 1)})
		srv.Login(t, bob, "") // a change nobody shares a room to see
		changed, left = changesSince(t, srv, alice, from)
		expectUsers(t, "left", left, []string{bob.UserID})
		expectUsers(t, "changed", changed, []string{})

		// When alice leaves, the members of that room she shares nothing else
		// with have left her view.
		from = syncToken(t, srv, alice)
		srv.Leave(t, room, alice.UserID)
		changed, left = changesSince(t, srv, alice, from)
		expectUsers(t, "left after alice leaves", left, []string{carol.UserID, "@dave:remote.example"})
		expectUsers(t, "changed after alice leaves", changed, nil)

		// Leave, change devices, rejoin: a change.
		srv.Join(t, room, bob.UserID)
		srv.Join(t, room, alice.UserID)
		srv.Leave(t, room, bob.UserID)
		from = syncToken(t, srv, alice)
		srv.Login(t, bob, "")
		srv.Join(t, room, bob.UserID)
		changed, left = changesSince(t, srv, alice, from)
		expectUsers(t, "changed after leave-change-rejoin", changed, []string{bob.UserID})
		expectUsers(t, "left after rejoin", left, nil)
	})
}

func TestKeyChangesErrors(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		tok := syncToken(t, srv, alice)
		for _, tc := range []struct{ query, errcode string }{
			{"", "M_MISSING_PARAM"},
			{"?from=" + tok, "M_MISSING_PARAM"},
			{"?to=" + tok, "M_MISSING_PARAM"},
			{"?from=garbage&to=" + tok, "M_INVALID_PARAM"},
			{"?from=" + tok + "&to=s-4", "M_INVALID_PARAM"},
			{"?from=12&to=" + tok, "M_INVALID_PARAM"},
		} {
			r := srv.Do(t, "GET", "/_matrix/client/v3/keys/changes"+tc.query, alice.Token, nil)
			if r.Status != http.StatusBadRequest || r.Errcode() != tc.errcode {
				t.Errorf("%q: %d %s", tc.query, r.Status, r.Raw)
			}
		}
		// A range ending before it starts is empty, not an error.
		r := srv.Must(t, "GET", "/_matrix/client/v3/keys/changes?from="+tok+"&to=s0", alice.Token, nil)
		expectUsers(t, "backwards range", strs(t, r["changed"]), nil)
		for _, q := range []string{"?since=nope", "?since=" + tok + "&timeout=-1", "?timeout=soon"} {
			r := srv.Do(t, "GET", "/_matrix/client/v3/sync"+q, alice.Token, nil)
			if r.Status != http.StatusBadRequest || r.Errcode() != "M_INVALID_PARAM" {
				t.Errorf("sync%s: %d %s", q, r.Status, r.Raw)
			}
		}
	})
}

// syncAsync starts a long-polling /sync and returns its answer's channel,
// once the server holds the request waiting.
func syncAsync(t *testing.T, srv *testutil.Server, u *testutil.User, since string, waiting int) <-chan testutil.Response {
	t.Helper()
	ch := make(chan testutil.Response, 1)
	go func() {
		ch <- srv.Do(t, "GET", "/_matrix/client/v3/sync?timeout=30000&since="+since, u.Token, nil)
	}()
	waitFor(t, "the sync to wait", func() bool { return srv.Parts.Sync.WaitingSyncs() >= waiting })
	return ch
}

func waitFor(t *testing.T, what string, cond func() bool) { testutil.Eventually(t, what, cond) }

func receive(t *testing.T, ch <-chan testutil.Response) testutil.Response {
	t.Helper()
	select {
	case r := <-ch:
		if r.Status != 200 {
			t.Fatalf("sync: %d %s", r.Status, r.Raw)
		}
		return r
	case <-time.After(20 * time.Second):
		t.Fatal("sync did not return")
	}
	return testutil.Response{}
}

func TestSync(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "ALICEDEV")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		srv.Join(t, "!r:test.local", alice.UserID)
		srv.Join(t, "!r:test.local", bob.UserID)
		srv.Upload(t, alice, map[string]any{"device_keys": alice.DeviceKeys(t), "one_time_keys": alice.OneTimeKeys(t, "A", 4),
			"fallback_keys": map[string]any{"signed_curve25519:F": alice.SignedKey(t, true)}})

		initial := srv.Must(t, "GET", "/_matrix/client/v3/sync", alice.Token, nil)
		since := initial["next_batch"].(string)
		if c := initial["device_one_time_keys_count"].(map[string]any)["signed_curve25519"]; c != float64(4) {
			t.Fatalf("initial count %v", c)
		}
		expectUsers(t, "unused fallback", strs(t, initial["device_unused_fallback_key_types"]), []string{"signed_curve25519"})

		// Nothing new: a zero timeout answers at once with the same token.
		r := srv.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0&since="+since, alice.Token, nil)
		if r["next_batch"] != since || len(strs(t, r["device_lists"].(map[string]any)["changed"])) != 0 {
			t.Fatalf("idle sync: %v", r)
		}
		// A short timeout with nothing new ends with nothing.
		r = srv.Must(t, "GET", "/_matrix/client/v3/sync?timeout=50&since="+since, alice.Token, nil)
		if r["next_batch"] != since {
			t.Fatalf("timed-out sync: %v", r)
		}

		// A waiting sync ignores a stranger's change and wakes for a room member's.
		ch := syncAsync(t, srv, alice, since, 1)
		srv.Upload(t, carol, map[string]any{"device_keys": carol.DeviceKeys(t)})
		srv.Upload(t, bob, map[string]any{"device_keys": bob.DeviceKeys(t)})
		got := receive(t, ch)
		expectUsers(t, "woken sync", strs(t, got.Body["device_lists"].(map[string]any)["changed"]), []string{bob.UserID})
		since = got.Body["next_batch"].(string)

		// A waiting sync wakes when one of the caller's keys is claimed.
		ch = syncAsync(t, srv, alice, since, 1)
		claimOne(t, srv, bob, alice.UserID, "ALICEDEV")
		got = receive(t, ch)
		if c := got.Body["device_one_time_keys_count"].(map[string]any)["signed_curve25519"]; c != float64(3) {
			t.Fatalf("count after claim %v", c)
		}

		// Leaving shows in device_lists.left.
		ch = syncAsync(t, srv, alice, since, 1)
		srv.Leave(t, "!r:test.local", bob.UserID)
		got = receive(t, ch)
		expectUsers(t, "left", strs(t, got.Body["device_lists"].(map[string]any)["left"]), []string{bob.UserID})

		// next_batch tokens work for /keys/changes.
		r = srv.Must(t, "GET", "/_matrix/client/v3/keys/changes?from="+since+"&to="+got.Body["next_batch"].(string), alice.Token, nil)
		expectUsers(t, "keys/changes left", strs(t, r["left"]), []string{bob.UserID})

		// Shutting down releases waiting syncs.
		ch = syncAsync(t, srv, alice, got.Body["next_batch"].(string), 1)
		srv.Parts.ReleaseWaiting()
		receive(t, ch)
		if n := srv.Parts.Sync.WaitingSyncs(); n != 0 {
			t.Fatalf("%d syncs still waiting", n)
		}
	})
}

func TestAdminMembership(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		path := "/_keyserver/admin/v1/rooms/"
		for _, tc := range []struct {
			name, room, user, token string
			body                    any
			status                  int
			errcode                 string
		}{
			{"no token", "!r:x", alice.UserID, "", map[string]string{"membership": "join"}, 401, "M_MISSING_TOKEN"},
			{"a user's token", "!r:x", alice.UserID, alice.Token, map[string]string{"membership": "join"}, 401, "M_UNKNOWN_TOKEN"},
			{"bad membership", "!r:x", alice.UserID, testutil.AdminToken, map[string]string{"membership": "ban"}, 400, "M_INVALID_PARAM"},
			{"bad room", "room", alice.UserID, testutil.AdminToken, map[string]string{"membership": "join"}, 400, "M_INVALID_PARAM"},
			{"bad user", "!r:x", "alice", testutil.AdminToken, map[string]string{"membership": "join"}, 400, "M_INVALID_PARAM"},
			{"not JSON", "!r:x", alice.UserID, testutil.AdminToken, "nope", 400, "M_NOT_JSON"},
			{"join", "!r:x", alice.UserID, testutil.AdminToken, map[string]string{"membership": "join"}, 200, ""},
			{"remote user with a slash", "!r:x", "@bo/b:remote.example", testutil.AdminToken, map[string]string{"membership": "join"}, 200, ""},
			// A room ID of room version 12 has no ":server" part.
			{"room version 12 ID", "!Dwa4sLIGSfWO6VBsn3E0Yrw2fW3jNoHzETjmWpBEEqI", alice.UserID, testutil.AdminToken, map[string]string{"membership": "join"}, 200, ""},
			{"room ID with a control character", "!r\x01:x", alice.UserID, testutil.AdminToken, map[string]string{"membership": "join"}, 400, "M_INVALID_PARAM"},
		} {
			r := srv.Do(t, "PUT", path+escape(tc.room)+"/members/"+escape(tc.user), tc.token, tc.body)
			if r.Status != tc.status || r.Errcode() != tc.errcode {
				t.Errorf("%s: %d %s", tc.name, r.Status, r.Raw)
			}
		}
		// The joins above took effect: alice now shares a room with the remote user.
		changed, _ := changesSince(t, srv, alice, "s0")
		expectUsers(t, "changed", changed, []string{alice.UserID, "@bo/b:remote.example"})
	})
}

func escape(s string) string { return url.PathEscape(s) }
