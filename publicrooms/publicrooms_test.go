package publicrooms_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/publicrooms"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

const (
	local = "local.test"
	alice = "@alice:local.test"
	bob   = "@bob:local.test"
)

// fixture is the directory of local.test over a real room server.
type fixture struct {
	dir   *publicrooms.Service
	rooms *roomserver.Service
}

func newFixture(t *testing.T, db testdb.Database, remote publicrooms.Remote) fixture {
	t.Helper()
	store, err := sqlstore.Open(context.Background(), db.URI, local)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	log := logrus.New()
	log.SetOutput(io.Discard)
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	rooms := roomserver.New(store, roomserver.Options{ServerName: local, KeyID: "ed25519:k", PrivateKey: key, Logger: log})
	return fixture{dir: publicrooms.New(store, rooms, remote, local, log), rooms: rooms}
}

func (f fixture) create(t *testing.T, creator string, req roomserver.CreateRoomRequest) string {
	t.Helper()
	id, err := f.rooms.CreateRoom(context.Background(), creator, req)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func (f fixture) list(t *testing.T, req publicrooms.Request) publicrooms.Response {
	t.Helper()
	res, err := f.dir.Local(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func wantErr(t *testing.T, err error, status int, code string) {
	t.Helper()
	var me *mxerr.Error
	if !errors.As(err, &me) || me.Status != status || me.Code != code {
		t.Fatalf("got %v, want %d %s", err, status, code)
	}
}

func roomIDs(cs []publicrooms.Chunk) []string {
	out := []string{}
	for _, c := range cs {
		out = append(out, c.RoomID)
	}
	return out
}

func str(s string) *string { return &s }

// A room created public is listed with what its current state says of
// it; a private one is not; a member with the power to set the canonical
// alias may list or unlist it, no one else.
func TestListingAndVisibility(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		f := newFixture(t, db, nil)
		pub := f.create(t, alice, roomserver.CreateRoomRequest{Visibility: "public", Name: str("Gardening"), Topic: str("Roses"),
			RoomAliasName: "garden", CreationContent: map[string]json.RawMessage{"type": json.RawMessage(`"m.space"`)},
			InitialState: []roomserver.StateEvent{
				{Type: "m.room.avatar", Content: json.RawMessage(`{"url":"mxc://local.test/pic"}`)},
				{Type: "m.room.history_visibility", Content: json.RawMessage(`{"history_visibility":"world_readable"}`)},
				{Type: "m.room.guest_access", Content: json.RawMessage(`{"guest_access":"can_join"}`)},
			}})
		priv := f.create(t, alice, roomserver.CreateRoomRequest{})
		if _, err := f.rooms.Join(ctx, bob, pub, nil, nil); err != nil {
			t.Fatal(err)
		}

		res := f.list(t, publicrooms.Request{})
		want := publicrooms.Chunk{RoomID: pub, Name: "Gardening", Topic: "Roses", CanonicalAlias: "#garden:local.test",
			AvatarURL: "mxc://local.test/pic", JoinRule: "public", RoomType: "m.space", NumJoinedMembers: 2,
			WorldReadable: true, GuestCanJoin: true}
		if len(res.Chunk) != 1 || res.Chunk[0] != want || res.TotalRoomCountEstimate != 1 || res.NextBatch != "" || res.PrevBatch != "" {
			t.Fatalf("directory %+v\nwant chunk %+v", res, want)
		}
		for id, v := range map[string]string{pub: "public", priv: "private"} {
			if got, err := f.dir.Visibility(ctx, id); err != nil || got != v {
				t.Fatalf("visibility of %s: %q %v", id, got, err)
			}
		}
		_, err := f.dir.Visibility(ctx, "!nowhere:local.test")
		wantErr(t, err, http.StatusNotFound, "M_NOT_FOUND")

		// The entry follows the room's current state.
		if _, err := f.rooms.SendState(ctx, alice, pub, "m.room.name", "", json.RawMessage(`{"name":"Allotment"}`)); err != nil {
			t.Fatal(err)
		}
		if err := f.rooms.Leave(ctx, bob, pub, ""); err != nil {
			t.Fatal(err)
		}
		if c := f.list(t, publicrooms.Request{}).Chunk; len(c) != 1 || c[0].Name != "Allotment" || c[0].NumJoinedMembers != 1 {
			t.Fatalf("after a rename and a leave: %+v", c)
		}

		// Bob (power 0) may not list alice's room, even joined; nor may
		// one not in it; alice may.
		wantErr(t, f.dir.SetVisibility(ctx, bob, priv, "public"), http.StatusForbidden, "M_FORBIDDEN")
		if _, err := f.rooms.Join(ctx, bob, pub, nil, nil); err != nil {
			t.Fatal(err)
		}
		wantErr(t, f.dir.SetVisibility(ctx, bob, pub, "private"), http.StatusForbidden, "M_FORBIDDEN")
		wantErr(t, f.dir.SetVisibility(ctx, alice, pub, "hidden"), http.StatusBadRequest, "M_INVALID_PARAM")
		wantErr(t, f.dir.SetVisibility(ctx, alice, "!nowhere:local.test", "public"), http.StatusNotFound, "M_NOT_FOUND")
		if got := roomIDs(f.list(t, publicrooms.Request{}).Chunk); !slices.Equal(got, []string{pub}) {
			t.Fatalf("refused changes changed the directory: %v", got)
		}
		if err := f.dir.SetVisibility(ctx, alice, priv, "public"); err != nil {
			t.Fatal(err)
		}
		if err := f.dir.SetVisibility(ctx, alice, pub, "private"); err != nil {
			t.Fatal(err)
		}
		if got := roomIDs(f.list(t, publicrooms.Request{}).Chunk); !slices.Equal(got, []string{priv}) {
			t.Fatalf("after alice's changes: %v", got)
		}

		// A listed room nobody is in any more has no entry, but counts.
		if err := f.rooms.Leave(ctx, alice, priv, ""); err != nil {
			t.Fatal(err)
		}
		if res := f.list(t, publicrooms.Request{}); len(res.Chunk) != 0 || res.TotalRoomCountEstimate != 1 {
			t.Fatalf("an empty listed room: %+v", res)
		}
	})
}

// Pages follow one order (most members first, then room ID) without a
// gap or a repeat; the filter matches name, topic or alias without
// regard to case, and room types (null: no type).
func TestPagesAndFilters(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		f := newFixture(t, db, nil)
		var all []string
		for i := 0; i < 5; i++ {
			id := f.create(t, alice, roomserver.CreateRoomRequest{Visibility: "public", Name: str(fmt.Sprintf("Room %d", i))})
			all = append(all, id)
		}
		space := f.create(t, alice, roomserver.CreateRoomRequest{Visibility: "public", Topic: str("the CHESS club"),
			CreationContent: map[string]json.RawMessage{"type": json.RawMessage(`"m.space"`)}})
		aliased := f.create(t, alice, roomserver.CreateRoomRequest{Visibility: "public", RoomAliasName: "chessboard"})
		// The busiest room first.
		if _, err := f.rooms.Join(ctx, bob, all[3], nil, nil); err != nil {
			t.Fatal(err)
		}
		rest := slices.DeleteFunc(append(slices.Clone(all), space, aliased), func(id string) bool { return id == all[3] })
		slices.Sort(rest)
		order := append([]string{all[3]}, rest...)

		var got []string
		since := ""
		for pages := 0; ; pages++ {
			res := f.list(t, publicrooms.Request{Limit: 3, Since: since})
			if len(res.Chunk) > 3 || res.TotalRoomCountEstimate != 7 {
				t.Fatalf("page %+v", res)
			}
			if (pages == 0) != (res.PrevBatch == "") {
				t.Fatalf("page %d prev_batch %q", pages, res.PrevBatch)
			}
			got = append(got, roomIDs(res.Chunk)...)
			if res.NextBatch == "" {
				break
			}
			since = res.NextBatch
		}
		if !slices.Equal(got, order) {
			t.Fatalf("paged %v, want %v", got, order)
		}
		// prev_batch leads back to the page before.
		second := f.list(t, publicrooms.Request{Limit: 3, Since: f.list(t, publicrooms.Request{Limit: 3}).NextBatch})
		if back := f.list(t, publicrooms.Request{Limit: 3, Since: second.PrevBatch}); !slices.Equal(roomIDs(back.Chunk), order[:3]) {
			t.Fatalf("back from the second page: %v", roomIDs(back.Chunk))
		}

		if got := roomIDs(f.list(t, publicrooms.Request{Filter: publicrooms.Filter{GenericSearchTerm: "Chess"}}).Chunk); !slices.Equal(got, sorted(space, aliased)) {
			t.Fatalf("chess: %v", got)
		}
		if got := roomIDs(f.list(t, publicrooms.Request{Filter: publicrooms.Filter{GenericSearchTerm: "room 4"}}).Chunk); !slices.Equal(got, []string{all[4]}) {
			t.Fatalf("room 4: %v", got)
		}
		if got := f.list(t, publicrooms.Request{Filter: publicrooms.Filter{GenericSearchTerm: "nothing like it"}}); len(got.Chunk) != 0 || got.TotalRoomCountEstimate != 7 {
			t.Fatalf("no match: %+v", got)
		}
		if got := roomIDs(f.list(t, publicrooms.Request{Filter: publicrooms.Filter{RoomTypes: []*string{str("m.space")}}}).Chunk); !slices.Equal(got, []string{space}) {
			t.Fatalf("spaces: %v", got)
		}
		if got := f.list(t, publicrooms.Request{Filter: publicrooms.Filter{RoomTypes: []*string{nil}}}).Chunk; len(got) != 6 || slices.Contains(roomIDs(got), space) {
			t.Fatalf("rooms without a type: %v", roomIDs(got))
		}

		for _, bad := range []string{"5", "o-1", "ox", "s5"} {
			_, err := f.dir.Local(ctx, publicrooms.Request{Since: bad})
			wantErr(t, err, http.StatusBadRequest, "M_INVALID_PARAM")
		}
		if _, err := publicrooms.RequestFromQuery(url.Values{"limit": {"-2"}}); err == nil {
			t.Fatal("a negative limit was accepted")
		}
		if req, err := publicrooms.RequestFromQuery(url.Values{"limit": {"2"}, "since": {"o2"}}); err != nil || req.Limit != 2 || req.Since != "o2" {
			t.Fatalf("query %+v %v", req, err)
		}
	})
}

func sorted(ids ...string) []string {
	slices.Sort(ids)
	return ids
}

// remoteDirectory answers as another server's directory.
type remoteDirectory struct {
	server string
	body   any
	query  url.Values
	answer json.RawMessage
	err    error
}

func (r *remoteDirectory) PublicRooms(_ context.Context, server string, body any, query url.Values) (json.RawMessage, error) {
	r.server, r.body, r.query = server, body, query
	return r.answer, r.err
}

type statusError struct{ status int }

func (e statusError) Error() string      { return fmt.Sprintf("status %d", e.status) }
func (e statusError) StatusCode() int    { return e.status }
func (e statusError) ErrCode() string    { return "M_UNKNOWN" }
func (e statusError) ErrMessage() string { return "" }

// Another server's directory is asked of it: a GET with the paging
// parameters, a POST when there is a filter; its answer is passed on
// when it is a directory, its failures are the client's 404, 502 or 504.
func TestRemoteDirectory(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		_, err := newFixture(t, db, nil).dir.List(ctx, "remote.test", publicrooms.Request{})
		wantErr(t, err, http.StatusNotFound, "M_NOT_FOUND")

		r := &remoteDirectory{answer: json.RawMessage(`{"chunk":[{"room_id":"!r:remote.test","num_joined_members":3}],"total_room_count_estimate":1}`)}
		f := newFixture(t, db, r)
		got, err := f.dir.List(ctx, "remote.test", publicrooms.Request{Limit: 5, Since: "tok", IncludeAllNetworks: true})
		if err != nil || string(got.(json.RawMessage)) != string(r.answer) {
			t.Fatalf("remote directory %s %v", got, err)
		}
		if r.server != "remote.test" || r.body != nil || r.query.Get("limit") != "5" || r.query.Get("since") != "tok" ||
			r.query.Get("include_all_networks") != "true" {
			t.Fatalf("asked %s body %v query %v", r.server, r.body, r.query)
		}
		if _, err := f.dir.List(ctx, "remote.test", publicrooms.Request{Filter: publicrooms.Filter{GenericSearchTerm: "x"}}); err != nil {
			t.Fatal(err)
		}
		if req, ok := r.body.(publicrooms.Request); !ok || req.Filter.GenericSearchTerm != "x" {
			t.Fatalf("a filtered request was sent as %#v", r.body)
		}
		// This server's own name is its own directory.
		f.create(t, alice, roomserver.CreateRoomRequest{Visibility: "public"})
		r.server = ""
		if res, err := f.dir.List(ctx, local, publicrooms.Request{}); err != nil || len(res.(publicrooms.Response).Chunk) != 1 || r.server != "" {
			t.Fatalf("the local directory by name: %v %v (asked %q)", res, err, r.server)
		}

		_, err = f.dir.List(ctx, "bad server!", publicrooms.Request{})
		wantErr(t, err, http.StatusBadRequest, "M_INVALID_PARAM")
		for _, c := range []struct {
			answer string
			err    error
			status int
			code   string
		}{
			{`{"rooms":[]}`, nil, http.StatusBadGateway, "M_UNKNOWN"},
			{`not json`, nil, http.StatusBadGateway, "M_UNKNOWN"},
			{"", statusError{404}, http.StatusNotFound, "M_NOT_FOUND"},
			{"", statusError{500}, http.StatusBadGateway, "M_UNKNOWN"},
			{"", context.DeadlineExceeded, http.StatusGatewayTimeout, "M_UNKNOWN"},
		} {
			r.answer, r.err = json.RawMessage(c.answer), c.err
			_, err := f.dir.List(ctx, "remote.test", publicrooms.Request{})
			wantErr(t, err, c.status, c.code)
		}
	})
}
