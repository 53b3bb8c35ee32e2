package clientapi_test

import (
	"context"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

func presencePath(userID string) string {
	return v3 + "/presence/" + url.PathEscape(userID) + "/status"
}

// presenceEvents returns the m.presence events of a /sync answer by
// sender; ok false when the answer has no presence section.
func presenceEvents(t *testing.T, sync map[string]any) (map[string]map[string]any, bool) {
	t.Helper()
	sec, ok := sync["presence"].(map[string]any)
	if !ok {
		return nil, false
	}
	out := map[string]map[string]any{}
	for _, e := range sec["events"].([]any) {
		ev := e.(map[string]any)
		if ev["type"] != "m.presence" {
			t.Fatalf("a %v event in presence", ev["type"])
		}
		out[ev["sender"].(string)] = ev["content"].(map[string]any)
	}
	return out, true
}

func senderNames(m map[string]map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// GET and PUT /presence/{userId}/status: one sets one's own, reads one's
// own and that of users one shares a room with; mistakes get Matrix
// errors and change nothing.
func TestPresenceStatus(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "public_chat"})
		srv.Must(t, "POST", roomPath(roomID, "/join"), bob.Token, map[string]any{})

		if got := srv.Must(t, "GET", presencePath(alice.UserID), alice.Token, nil); got["presence"] != "offline" || len(got) != 1 {
			t.Fatalf("never set: %v", got)
		}
		if got := srv.Must(t, "PUT", presencePath(alice.UserID), alice.Token, map[string]any{"presence": "online", "status_msg": "lunch"}); len(got) != 0 {
			t.Fatalf("PUT answered %v", got)
		}
		for _, viewer := range []*testutil.User{alice, bob} {
			got := srv.Must(t, "GET", presencePath(alice.UserID), viewer.Token, nil)
			if got["presence"] != "online" || got["status_msg"] != "lunch" || got["currently_active"] != true {
				t.Fatalf("%s reads %v", viewer.UserID, got)
			}
			if ago, ok := got["last_active_ago"].(float64); !ok || ago < 0 || ago > 60000 {
				t.Fatalf("last_active_ago %v", got["last_active_ago"])
			}
		}

		expectError(t, srv, "GET", presencePath(alice.UserID), carol.Token, nil, 403, "M_FORBIDDEN")
		expectError(t, srv, "GET", presencePath("@nobody:"+srv.ServerName), alice.Token, nil, 404, "M_NOT_FOUND")
		expectError(t, srv, "GET", presencePath("@who:elsewhere.example"), alice.Token, nil, 403, "M_FORBIDDEN")
		expectError(t, srv, "GET", presencePath("alice"), alice.Token, nil, 400, "M_INVALID_PARAM")
		expectError(t, srv, "GET", presencePath(alice.UserID), "", nil, 401, "M_MISSING_TOKEN")

		// Mistakes change nothing.
		expectError(t, srv, "PUT", presencePath(alice.UserID), bob.Token, map[string]any{"presence": "offline"}, 403, "M_FORBIDDEN")
		expectError(t, srv, "PUT", presencePath(alice.UserID), alice.Token, map[string]any{}, 400, "M_MISSING_PARAM")
		expectError(t, srv, "PUT", presencePath(alice.UserID), alice.Token, map[string]any{"presence": "busy"}, 400, "M_INVALID_PARAM")
		expectError(t, srv, "PUT", presencePath(alice.UserID), alice.Token, map[string]any{"presence": 1}, 400, "M_BAD_JSON")
		expectError(t, srv, "PUT", presencePath(alice.UserID), alice.Token, map[string]any{"presence": nil}, 400, "M_BAD_JSON")
		expectError(t, srv, "PUT", presencePath(alice.UserID), alice.Token, map[string]any{"presence": "offline", "status_msg": 5}, 400, "M_BAD_JSON")
		expectError(t, srv, "PUT", presencePath(alice.UserID), alice.Token, "not json", 400, "M_NOT_JSON")
		expectError(t, srv, "PUT", presencePath(alice.UserID), alice.Token, []string{"offline"}, 400, "M_BAD_JSON")
		if got := srv.Must(t, "GET", presencePath(alice.UserID), bob.Token, nil); got["presence"] != "online" || got["status_msg"] != "lunch" {
			t.Fatalf("after mistakes: %v", got)
		}

		// Without status_msg the message goes; only online users carry
		// currently_active.
		srv.Must(t, "PUT", presencePath(alice.UserID), alice.Token, map[string]any{"presence": "unavailable"})
		got := srv.Must(t, "GET", presencePath(alice.UserID), bob.Token, nil)
		if _, ok := got["status_msg"]; got["presence"] != "unavailable" || ok || got["currently_active"] != nil {
			t.Fatalf("unavailable: %v", got)
		}
	})
}

// /sync: set_presence marks the syncing user, presence.events carries
// the presence of the users sharing a room (and one's own), an initial
// sync the current ones, and a waiting /sync wakes for a change.
func TestPresenceInSync(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "public_chat"})
		srv.Must(t, "POST", roomPath(roomID, "/join"), bob.Token, map[string]any{})

		// set_presence=offline leaves presence alone; the default marks
		// the user online.
		roomSync(t, srv, alice, url.Values{"set_presence": {"offline"}})
		if got := srv.Must(t, "GET", presencePath(alice.UserID), bob.Token, nil); got["presence"] != "offline" {
			t.Fatalf("after set_presence=offline: %v", got)
		}
		roomSync(t, srv, alice, url.Values{"set_presence": {"unavailable"}})
		if got := srv.Must(t, "GET", presencePath(alice.UserID), bob.Token, nil); got["presence"] != "unavailable" {
			t.Fatalf("after set_presence=unavailable: %v", got)
		}
		roomSync(t, srv, alice, nil)
		if got := srv.Must(t, "GET", presencePath(alice.UserID), bob.Token, nil); got["presence"] != "online" || got["currently_active"] != true {
			t.Fatalf("after a /sync: %v", got)
		}
		expectError(t, srv, "GET", v3+"/sync?set_presence=busy", alice.Token, nil, 400, "M_INVALID_PARAM")

		// bob's initial sync: his own presence and alice's.
		first := roomSync(t, srv, bob, nil)
		evs, ok := presenceEvents(t, first)
		if !ok || !slices.Equal(senderNames(evs), []string{alice.UserID, bob.UserID}) || evs[alice.UserID]["presence"] != "online" {
			t.Fatalf("bob's initial sync: %v", first["presence"])
		}
		// carol shares no room: only her own.
		if evs, _ := presenceEvents(t, roomSync(t, srv, carol, nil)); !slices.Equal(senderNames(evs), []string{carol.UserID}) {
			t.Fatalf("carol's initial sync: %v", senderNames(evs))
		}
		since := first["next_batch"].(string)
		if evs, _ := presenceEvents(t, roomSync(t, srv, bob, url.Values{"since": {since}})); len(evs) != 0 {
			t.Fatalf("nothing new: %v", evs)
		}

		// A waiting /sync of bob's wakes when alice sets her status.
		done := make(chan testutil.Response, 1)
		go func() {
			done <- srv.Do(t, "GET", v3+"/sync?timeout=20000&since="+url.QueryEscape(since), bob.Token, nil)
		}()
		testutil.Eventually(t, "bob's /sync to wait", func() bool { return srv.Parts.Sync.WaitingSyncs() == 1 })
		srv.Must(t, "PUT", presencePath(alice.UserID), alice.Token, map[string]any{"presence": "unavailable", "status_msg": "brb"})
		var woken testutil.Response
		select {
		case woken = <-done:
		case <-time.After(15 * time.Second):
			t.Fatal("bob's /sync did not wake")
		}
		evs, _ = presenceEvents(t, woken.Body)
		if a := evs[alice.UserID]; woken.Status != 200 || a["presence"] != "unavailable" || a["status_msg"] != "brb" {
			t.Fatalf("bob's woken sync: %s", woken.Raw)
		}
		// carol does not see it.
		carolSince := roomSync(t, srv, carol, nil)["next_batch"].(string)
		if evs, _ := presenceEvents(t, roomSync(t, srv, carol, url.Values{"since": {since}})); evs[alice.UserID] != nil {
			t.Fatalf("carol sees alice: %v", evs)
		}

		// Once carol joins, her next sync has the presence of the room's
		// members, and bob's has hers, though neither changed since.
		bobSince := woken.Body["next_batch"].(string)
		srv.Must(t, "POST", roomPath(roomID, "/join"), carol.Token, map[string]any{})
		evs, _ = presenceEvents(t, roomSync(t, srv, carol, url.Values{"since": {carolSince}, "set_presence": {"offline"}}))
		if !slices.Equal(senderNames(evs), []string{alice.UserID, bob.UserID}) || evs[alice.UserID]["status_msg"] != "brb" {
			t.Fatalf("carol's sync after joining: %v", evs)
		}
		evs, _ = presenceEvents(t, roomSync(t, srv, bob, url.Values{"since": {bobSince}, "set_presence": {"offline"}}))
		if !slices.Equal(senderNames(evs), []string{carol.UserID}) || evs[carol.UserID]["presence"] != "online" {
			t.Fatalf("bob's sync after carol joined: %v", evs)
		}
	})
}

// presence.enabled false: the endpoints answer as Synapse's do with
// presence off, /sync has no presence section, nothing is stored.
func TestPresenceDisabled(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{PresenceDisabled: true})
		alice := srv.Register(t, "alice", "")
		carol := srv.Register(t, "carol", "")
		if got := srv.Must(t, "PUT", presencePath(alice.UserID), alice.Token, map[string]any{"presence": "online", "status_msg": "x"}); len(got) != 0 {
			t.Fatalf("PUT answered %v", got)
		}
		expectError(t, srv, "PUT", presencePath(alice.UserID), carol.Token, map[string]any{"presence": "online"}, 403, "M_FORBIDDEN")
		for _, viewer := range []*testutil.User{alice, carol} {
			if got := srv.Must(t, "GET", presencePath(alice.UserID), viewer.Token, nil); got["presence"] != "offline" || len(got) != 1 {
				t.Fatalf("%s reads %v", viewer.UserID, got)
			}
		}
		sync := roomSync(t, srv, alice, nil)
		if _, ok := sync["presence"]; ok {
			t.Fatalf("/sync has presence: %v", sync["presence"])
		}
		if stored, err := srv.Store.Presence(context.Background(), []string{alice.UserID}); err != nil || len(stored) != 0 {
			t.Fatalf("stored %v (%v)", stored, err)
		}
	})
}

// Two daemons on one PostgreSQL database share presence: a status set
// through one wakes the waiting /sync of a room member on the other, and
// each reads what the other wrote.
func TestPresenceAcrossDaemonsOfOneDatabase(t *testing.T) {
	db := testutil.Postgres(t)
	a1 := testutil.StartNode(t, db, nil)
	a2 := testutil.StartNode(t, db, func(c *config.Config) { c.ServerName = a1.ServerName })
	alice := a1.Register(t, "alice", "")
	bob := a1.Register(t, "bob", "")
	roomID := createRoom(t, a1.Server, alice, map[string]any{"preset": "public_chat"})
	a1.Must(t, "POST", v3+"/join/"+url.PathEscape(roomID), bob.Token, nil)
	since := a2.Must(t, "GET", v3+"/sync?timeout=0", bob.Token, nil)["next_batch"].(string)
	done := make(chan testutil.Response, 1)
	go func() {
		done <- a2.Do(t, "GET", v3+"/sync?timeout=20000&since="+url.QueryEscape(since), bob.Token, nil)
	}()
	testutil.Eventually(t, "bob's /sync to wait on a2", func() bool { return a2.Parts.Sync.WaitingSyncs() == 1 })
	// a2 may not listen to the database yet: statuses go until one is
	// heard.
	var woken testutil.Response
	for i := 0; woken.Status == 0; i++ {
		if i == 100 {
			t.Fatal("bob's /sync on a2 never woke")
		}
		state := []string{"online", "unavailable"}[i%2]
		a1.Must(t, "PUT", presencePath(alice.UserID), alice.Token, map[string]any{"presence": state, "status_msg": "via a1"})
		select {
		case woken = <-done:
		case <-time.After(200 * time.Millisecond):
		}
	}
	evs, _ := presenceEvents(t, woken.Body)
	if a := evs[alice.UserID]; a == nil || a["status_msg"] != "via a1" {
		t.Fatalf("bob's woken /sync on a2: %s", woken.Raw)
	}
	a2.Must(t, "PUT", presencePath(bob.UserID), bob.Token, map[string]any{"presence": "unavailable", "status_msg": "via a2"})
	if got := a1.Must(t, "GET", presencePath(bob.UserID), alice.Token, nil); got["presence"] != "unavailable" || got["status_msg"] != "via a2" {
		t.Fatalf("a1 reads bob: %v", got)
	}
}
