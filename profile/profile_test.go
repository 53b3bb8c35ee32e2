package profile_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/profile"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

const (
	server = "local.test"
	alice  = "@alice:local.test"
	bob    = "@bob:local.test"
)

func quietLog() *logrus.Logger {
	log := logrus.New()
	log.SetOutput(io.Discard)
	return log
}

func openStore(t *testing.T, db testdb.Database, users ...string) *sqlstore.Store {
	t.Helper()
	store, err := sqlstore.Open(context.Background(), db.URI, server)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	for _, u := range users {
		if _, err := store.CreateAccount(context.Background(), u, "x", nil); err != nil {
			t.Fatal(err)
		}
	}
	return store
}

func wantCode(t *testing.T, err error, status int, code string) {
	t.Helper()
	var me *mxerr.Error
	if !errors.As(err, &me) || me.Status != status || me.Code != code {
		t.Fatalf("got %v, want %d %s", err, status, code)
	}
}

func str(s string) *string { return &s }

// A local user's profile starts as their localpart; each field is set and
// removed on its own; the limits are in characters; only the user may
// change it; a user without an account has none.
func TestLocalProfile(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		svc := profile.New(openStore(t, db, alice, bob), server, nil, nil, quietLog())

		if p, err := svc.Get(ctx, alice); err != nil || p != (storage.Profile{DisplayName: "alice"}) {
			t.Fatalf("a new user's profile %+v %v", p, err)
		}
		if err := svc.Set(ctx, alice, alice, profile.AvatarURL, str("mxc://local.test/a")); err != nil {
			t.Fatal(err)
		}
		if p, _ := svc.Get(ctx, alice); p != (storage.Profile{DisplayName: "alice", AvatarURL: "mxc://local.test/a"}) {
			t.Fatalf("after setting the avatar: %+v", p)
		}
		name := strings.Repeat("é", profile.MaxDisplayName) // 512 bytes, 256 characters
		if err := svc.Set(ctx, alice, alice, profile.DisplayName, &name); err != nil {
			t.Fatalf("a name of %d characters: %v", profile.MaxDisplayName, err)
		}
		if p, _ := svc.Local(ctx, alice); p.DisplayName != name || p.AvatarURL != "mxc://local.test/a" {
			t.Fatalf("after setting the name: %+v", p)
		}
		if err := svc.Set(ctx, alice, alice, profile.DisplayName, nil); err != nil {
			t.Fatal(err)
		}
		if p, _ := svc.Local(ctx, alice); p != (storage.Profile{AvatarURL: "mxc://local.test/a"}) {
			t.Fatalf("after removing the name: %+v", p)
		}

		// Refusals change nothing.
		wantCode(t, svc.Set(ctx, bob, alice, profile.DisplayName, str("mallory")), http.StatusForbidden, "M_FORBIDDEN")
		wantCode(t, svc.Set(ctx, alice, alice, profile.DisplayName, str(name+"x")), http.StatusBadRequest, "M_INVALID_PARAM")
		wantCode(t, svc.Set(ctx, alice, alice, profile.AvatarURL, str(strings.Repeat("a", profile.MaxAvatarURL+1))), http.StatusBadRequest, "M_INVALID_PARAM")
		wantCode(t, svc.Set(ctx, alice, alice, "bio", str("x")), http.StatusBadRequest, "M_INVALID_PARAM")
		if p, _ := svc.Local(ctx, alice); p != (storage.Profile{AvatarURL: "mxc://local.test/a"}) {
			t.Fatalf("after refused changes: %+v", p)
		}
		if p, _ := svc.Local(ctx, bob); p.DisplayName != "bob" {
			t.Fatalf("bob's profile %+v", p)
		}

		const ghost = "@ghost:local.test"
		_, err := svc.Get(ctx, ghost)
		wantCode(t, err, http.StatusNotFound, "M_NOT_FOUND")
		wantCode(t, svc.Set(ctx, ghost, ghost, profile.DisplayName, str("boo")), http.StatusNotFound, "M_NOT_FOUND")
		for _, bad := range []string{"alice", "@alice", "@alice:bad server", ""} {
			_, err := svc.Get(ctx, bad)
			wantCode(t, err, http.StatusBadRequest, "M_INVALID_PARAM")
		}
		// Local answers for this server's users only.
		_, err = svc.Local(ctx, "@carol:remote.test")
		wantCode(t, err, http.StatusNotFound, "M_NOT_FOUND")
		wantCode(t, svc.Set(ctx, "@carol:remote.test", "@carol:remote.test", profile.DisplayName, str("c")), http.StatusNotFound, "M_NOT_FOUND")
	})
}

// statusError is an error answer of another server.
type statusError struct{ status int }

func (e statusError) Error() string      { return fmt.Sprintf("status %d", e.status) }
func (e statusError) StatusCode() int    { return e.status }
func (e statusError) ErrCode() string    { return "M_UNKNOWN" }
func (e statusError) ErrMessage() string { return "" }

// remote answers profile queries as another server would.
type remote struct {
	dest, userID string
	deadline     bool
	p            storage.Profile
	err          error
}

func (r *remote) QueryProfile(ctx context.Context, dest, userID string) (storage.Profile, error) {
	r.dest, r.userID = dest, userID
	_, r.deadline = ctx.Deadline()
	return r.p, r.err
}

// A user of another server's profile is asked of their server, with a
// deadline; its failures are the client's 404, 502 or 504; without a way
// to ask, there is no profile.
func TestRemoteProfile(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		store := openStore(t, db)
		const carol = "@carol:remote.test:8448"

		_, err := profile.New(store, server, nil, nil, quietLog()).Get(ctx, carol)
		wantCode(t, err, http.StatusNotFound, "M_NOT_FOUND")

		r := &remote{p: storage.Profile{DisplayName: "Carol"}}
		svc := profile.New(store, server, r, nil, quietLog())
		p, err := svc.Get(ctx, carol)
		if err != nil || p.DisplayName != "Carol" {
			t.Fatalf("remote profile %+v %v", p, err)
		}
		if r.dest != "remote.test:8448" || r.userID != carol || !r.deadline {
			t.Fatalf("asked %q for %q (deadline %v)", r.dest, r.userID, r.deadline)
		}
		for _, c := range []struct {
			err    error
			status int
			code   string
		}{
			{statusError{404}, http.StatusNotFound, "M_NOT_FOUND"},
			{fmt.Errorf("wrapped: %w", statusError{404}), http.StatusNotFound, "M_NOT_FOUND"},
			{statusError{500}, http.StatusBadGateway, "M_UNKNOWN"},
			{errors.New("connection refused"), http.StatusBadGateway, "M_UNKNOWN"},
			{context.DeadlineExceeded, http.StatusGatewayTimeout, "M_UNKNOWN"},
		} {
			r.err = c.err
			_, err := svc.Get(ctx, carol)
			wantCode(t, err, c.status, c.code)
		}
		// A local user is never asked of another server.
		r.dest = ""
		if _, err := svc.Get(ctx, alice); err == nil || r.dest != "" {
			t.Fatalf("a local user without an account: %v (asked %q)", err, r.dest)
		}
	})
}

// A changed profile is written into the member event of every room the
// user is joined to, and a join carries the profile.
func TestProfileChangeReachesRooms(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		store := openStore(t, db, alice, bob)
		_, key, _ := ed25519.GenerateKey(rand.Reader)
		rooms := roomserver.New(store, roomserver.Options{ServerName: server, KeyID: "ed25519:k", PrivateKey: key,
			Profiles: profile.NewLocal(store, server),
			Logger:   quietLog(), Now: func() time.Time { return time.UnixMilli(1_700_000_000_000) }})
		svc := profile.New(store, server, nil, rooms, quietLog())

		if err := svc.Set(ctx, alice, alice, profile.DisplayName, str("Alice")); err != nil {
			t.Fatal(err)
		}
		r1, err := rooms.CreateRoom(ctx, alice, roomserver.CreateRoomRequest{Preset: "public_chat"})
		if err != nil {
			t.Fatal(err)
		}
		r2, err := rooms.CreateRoom(ctx, bob, roomserver.CreateRoomRequest{Preset: "public_chat"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rooms.Join(ctx, alice, r2, nil, nil); err != nil {
			t.Fatal(err)
		}
		member := func(roomID string) map[string]any {
			ev, err := rooms.StateEvent(ctx, alice, roomID, "m.room.member", alice)
			if err != nil {
				t.Fatal(err)
			}
			var c map[string]any
			_ = json.Unmarshal(ev.Content, &c)
			return c
		}
		for _, r := range []string{r1, r2} {
			if c := member(r); c["displayname"] != "Alice" {
				t.Fatalf("join in %s carries %v", r, c)
			}
		}
		if err := svc.Set(ctx, alice, alice, profile.AvatarURL, str("mxc://local.test/pic")); err != nil {
			t.Fatal(err)
		}
		for _, r := range []string{r1, r2} {
			if c := member(r); c["displayname"] != "Alice" || c["avatar_url"] != "mxc://local.test/pic" || c["membership"] != "join" {
				t.Fatalf("member event in %s after the change: %v", r, c)
			}
		}

	})
}

// failingRooms refuses every member event.
type failingRooms struct{ calls int }

func (f *failingRooms) ProfileChanged(context.Context, string, storage.Profile) error {
	f.calls++
	return errors.New("refused")
}

// Rooms that refuse the new member events leave the change itself in
// place, and the caller is not failed for them.
func TestProfileChangeStandsWhenRoomsRefuse(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		rooms := &failingRooms{}
		svc := profile.New(openStore(t, db, alice), server, nil, rooms, quietLog())
		if err := svc.Set(ctx, alice, alice, profile.DisplayName, str("Alice")); err != nil {
			t.Fatalf("refusing rooms failed the change: %v", err)
		}
		if p, _ := svc.Local(ctx, alice); p.DisplayName != "Alice" || rooms.calls != 1 {
			t.Fatalf("profile %+v, rooms told %d times", p, rooms.calls)
		}
		// A refused change of the profile does not reach the rooms.
		_ = svc.Set(ctx, alice, alice, profile.DisplayName, str(strings.Repeat("x", profile.MaxDisplayName+1)))
		if rooms.calls != 1 {
			t.Fatalf("rooms told of a refused change")
		}
	})
}
