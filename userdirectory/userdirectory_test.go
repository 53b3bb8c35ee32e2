package userdirectory_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/storage/sqlstore"
	"github.com/keyserver/keyserver/userdirectory"
)

const local = "local.test"

// fixture: alice shares a private room with bob, and is not in carol's
// private room with dave; erin is in a public (listed) room; frank is
// only invited to alice's room; grace has an account and no room.
type fixture struct {
	store *sqlstore.Store
	rooms *roomserver.Service
}

const (
	alice = "@alice:local.test"
	bob   = "@bob:local.test"
	carol = "@carol:local.test"
	dave  = "@dave:local.test"
	erin  = "@erin:local.test"
	frank = "@frank:local.test"
	grace = "@grace:local.test"
)

func newFixture(t *testing.T, db testdb.Database) fixture {
	t.Helper()
	ctx := context.Background()
	store, err := sqlstore.Open(ctx, db.URI, local)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	for _, u := range []string{alice, bob, carol, dave, erin, frank, grace} {
		if _, err := store.CreateAccount(ctx, u, "x", nil); err != nil {
			t.Fatal(err)
		}
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	rooms := roomserver.New(store, roomserver.Options{ServerName: local, KeyID: "ed25519:k", PrivateKey: key, Logger: log})
	f := fixture{store: store, rooms: rooms}

	shared := f.create(t, alice, roomserver.CreateRoomRequest{Preset: "private_chat", Invite: []string{bob, frank}})
	f.join(t, bob, shared, "Bobby Tables")
	other := f.create(t, carol, roomserver.CreateRoomRequest{Preset: "private_chat", Invite: []string{dave}})
	f.join(t, dave, other, "Dave")
	f.create(t, erin, roomserver.CreateRoomRequest{Visibility: "public"})
	return f
}

func (f fixture) create(t *testing.T, creator string, req roomserver.CreateRoomRequest) string {
	t.Helper()
	id, err := f.rooms.CreateRoom(context.Background(), creator, req)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// join joins with a display name of the room's (the member event's).
func (f fixture) join(t *testing.T, userID, roomID, name string) {
	t.Helper()
	extra := map[string]json.RawMessage{}
	if name != "" {
		raw, _ := json.Marshal(name)
		extra["displayname"] = raw
	}
	if _, err := f.rooms.Join(context.Background(), userID, roomID, extra, nil); err != nil {
		t.Fatal(err)
	}
}

func search(t *testing.T, d *userdirectory.Service, searcher, term string, limit int) userdirectory.Response {
	t.Helper()
	res, err := d.Search(context.Background(), searcher, term, limit)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func users(res userdirectory.Response) []string {
	out := []string{}
	for _, r := range res.Results {
		out = append(out, r.UserID)
	}
	return out
}

// A searcher finds the users joined to a room they are joined to or to a
// listed room, by user ID or display name without regard to case; not
// those of others' private rooms, nor the only invited.
func TestSearchVisibility(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		f := newFixture(t, db)
		d := userdirectory.New(f.store, false)
		if got := users(search(t, d, alice, "local.test", 0)); !slices.Equal(got, []string{alice, bob, erin}) {
			t.Fatalf("alice finds %v", got)
		}
		res := search(t, d, alice, "TABLES", 0)
		if len(res.Results) != 1 || res.Results[0] != (userdirectory.Result{UserID: bob, DisplayName: "Bobby Tables"}) {
			t.Fatalf("by display name: %+v", res.Results)
		}
		for _, hidden := range []string{"carol", "dave", "frank", "grace"} {
			if got := users(search(t, d, alice, hidden, 0)); len(got) != 0 {
				t.Fatalf("alice finds %s: %v", hidden, got)
			}
		}
		// Dave finds carol and himself, and erin of the listed room.
		if got := users(search(t, d, dave, ":local", 0)); !slices.Equal(got, []string{carol, dave, erin}) {
			t.Fatalf("dave finds %v", got)
		}
		// Grace, in no room, finds those of the listed room only.
		if got := users(search(t, d, grace, "@", 0)); !slices.Equal(got, []string{erin}) {
			t.Fatalf("grace finds %v", got)
		}

		// Bob leaves: alice no longer finds him; frank joins: she does.
		ctx := context.Background()
		rooms, _ := f.rooms.JoinedRooms(ctx, bob)
		if err := f.rooms.Leave(ctx, bob, rooms[0], ""); err != nil {
			t.Fatal(err)
		}
		f.join(t, frank, rooms[0], "")
		if got := users(search(t, d, alice, "local.test", 0)); !slices.Equal(got, []string{alice, erin, frank}) {
			t.Fatalf("after bob left and frank joined alice finds %v", got)
		}
	})
}

// With search_all_users every local user with an active account is
// found too, by their profile.
func TestSearchAllUsers(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		f := newFixture(t, db)
		if _, err := f.store.SetProfileField(ctx, grace, "displayname", "Amazing Grace"); err != nil {
			t.Fatal(err)
		}
		d := userdirectory.New(f.store, true)
		if got := users(search(t, d, alice, "local.test", 0)); !slices.Equal(got, []string{alice, bob, carol, dave, erin, frank, grace}) {
			t.Fatalf("every user: %v", got)
		}
		if res := search(t, d, alice, "amazing", 0); len(res.Results) != 1 || res.Results[0].DisplayName != "Amazing Grace" {
			t.Fatalf("by profile name: %+v", res.Results)
		}
		// A term with LIKE's wildcards matches them literally.
		if got := users(search(t, d, alice, "%", 0)); len(got) != 0 {
			t.Fatalf("%% finds %v", got)
		}
		if got := users(search(t, d, alice, "_", 0)); len(got) != 0 {
			t.Fatalf("_ finds %v", got)
		}
		if _, err := f.store.DeactivateAccount(ctx, grace, 1); err != nil {
			t.Fatal(err)
		}
		if got := users(search(t, d, alice, "grace", 0)); len(got) != 0 {
			t.Fatalf("a deactivated user is found: %v", got)
		}
	})
}

// Users whose ID or name starts with the term come first, each group by
// user ID; more than limit is limited; a term is required.
func TestSearchOrderAndLimit(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		f := newFixture(t, db)
		d := userdirectory.New(f.store, true)
		// Every ID contains "e" (local.test); only erin's starts with it.
		res := search(t, d, alice, "e", 0)
		want := []string{erin, alice, bob, carol, dave, frank, grace} // erin starts with e
		if got := users(res); !slices.Equal(got, want) || res.Limited {
			t.Fatalf("order %v limited %v, want %v", got, res.Limited, want)
		}
		res = search(t, d, alice, "e", 3)
		if got := users(res); !slices.Equal(got, want[:3]) || !res.Limited {
			t.Fatalf("limit 3: %v limited %v", got, res.Limited)
		}
		// "a": alice's ID (her name is Zed) and grace's name start with it.
		for u, name := range map[string]string{alice: "Zed", grace: "Amazing Grace"} {
			if _, err := f.store.SetProfileField(context.Background(), u, "displayname", name); err != nil {
				t.Fatal(err)
			}
		}
		if got := users(search(t, d, alice, "a", 0)); !slices.Equal(got, []string{alice, grace, bob, carol, dave, erin, frank}) {
			t.Fatalf("order for a: %v", got)
		}
		if res := search(t, d, alice, "Bobby", 1); users(res)[0] != bob || res.Limited {
			t.Fatalf("a name's prefix: %+v", res)
		}
		for _, c := range []struct {
			term  string
			limit int
			code  string
		}{{"", 0, "M_MISSING_PARAM"}, {"   ", 0, "M_MISSING_PARAM"}, {"a", -1, "M_INVALID_PARAM"}} {
			_, err := d.Search(context.Background(), alice, c.term, c.limit)
			var me *mxerr.Error
			if !errors.As(err, &me) || me.Status != http.StatusBadRequest || me.Code != c.code {
				t.Fatalf("term %q limit %d: %v, want 400 %s", c.term, c.limit, err, c.code)
			}
		}
	})
}
