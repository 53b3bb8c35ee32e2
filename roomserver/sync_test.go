package roomserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"testing"

	"github.com/keyserver/keyserver/internal/streamtoken"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

func syncRooms(t *testing.T, rooms *roomserver.Service, store *sqlstore.Store, userID string, from storage.StreamPos, filter roomserver.Filter) (*roomserver.SyncRooms, storage.StreamPos) {
	t.Helper()
	ctx := context.Background()
	to, err := store.CurrentPos(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := rooms.Sync(ctx, roomserver.SyncRequest{UserID: userID, From: from, To: to, Filter: filter, Token: streamtoken.Format})
	if err != nil {
		t.Fatal(err)
	}
	return res, to
}

func sortedKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func types(evs []roomserver.ClientEvent) map[string]bool {
	out := map[string]bool{}
	for _, ev := range evs {
		out[ev.Type] = true
	}
	return out
}

// The rooms part of /sync: an initial sync shows the joined rooms with
// their state, timeline and summary, the invites with stripped state,
// and left rooms only when the filter asks; an incremental one shows
// what happened since its token, a gap as a limited timeline with the
// state that changed in it, and a room left in the range under leave.
func TestSyncRooms(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		rooms, store := localRooms(t, db)
		name := "Bob's room"
		joined := createRoom(t, rooms, alice, roomserver.CreateRoomRequest{Preset: "public_chat"})
		mustJoin(t, rooms, bob, joined)
		send(t, rooms, bob, joined, "first")
		invited := createRoom(t, rooms, bob, roomserver.CreateRoomRequest{Name: &name, Invite: []string{alice}})
		left := createRoom(t, rooms, bob, roomserver.CreateRoomRequest{Preset: "public_chat"})
		mustJoin(t, rooms, alice, left)
		if err := rooms.Leave(ctx, alice, left, ""); err != nil {
			t.Fatal(err)
		}
		createRoom(t, rooms, bob, roomserver.CreateRoomRequest{}) // not alice's
		later := createRoom(t, rooms, bob, roomserver.CreateRoomRequest{Preset: "public_chat"})

		res, next := syncRooms(t, rooms, store, alice, 0, roomserver.Filter{})
		if got := sortedKeys(res.Join); !slices.Equal(got, []string{joined}) || !slices.Equal(sortedKeys(res.Invite), []string{invited}) || len(res.Leave) != 0 {
			t.Fatalf("initial sync: join %v invite %v leave %v", got, sortedKeys(res.Invite), sortedKeys(res.Leave))
		}
		j := res.Join[joined]
		all := append(slices.Clone(j.State.Events), j.Timeline.Events...)
		if tys := types(all); !tys["m.room.create"] || !tys["m.room.power_levels"] || !tys["m.room.message"] {
			t.Fatalf("initial sync of the joined room: %v", tys)
		}
		if j.Summary == nil || j.Summary.JoinedCount != 2 || !slices.Equal(j.Summary.Heroes, []string{bob}) {
			t.Fatalf("summary %+v", j.Summary)
		}
		if j.Timeline.PrevBatch == "" {
			t.Fatal("no prev_batch")
		}
		var stripped []string
		for _, st := range res.Invite[invited].InviteState.Events {
			stripped = append(stripped, st.Type())
		}
		if !slices.Contains(stripped, "m.room.create") || !slices.Contains(stripped, "m.room.name") || !slices.Contains(stripped, "m.room.member") ||
			slices.Contains(stripped, "m.room.power_levels") {
			t.Fatalf("invite state %v", stripped)
		}
		withLeave := roomserver.Filter{}
		withLeave.Room.IncludeLeave = true
		if res, _ := syncRooms(t, rooms, store, alice, 0, withLeave); !slices.Equal(sortedKeys(res.Leave), []string{left}) {
			t.Fatalf("include_leave: %v", sortedKeys(res.Leave))
		}

		// Nothing happened: nothing to show.
		if res, _ := syncRooms(t, rooms, store, alice, next, roomserver.Filter{}); !res.Empty() {
			t.Fatalf("an empty range shows %v %v %v", sortedKeys(res.Join), sortedKeys(res.Invite), sortedKeys(res.Leave))
		}

		// A room joined in the range comes whole.
		mustJoin(t, rooms, alice, later)
		res, next = syncRooms(t, rooms, store, alice, next, roomserver.Filter{})
		if l := res.Join[later]; len(res.Join) != 1 || l == nil || !types(append(l.State.Events, l.Timeline.Events...))["m.room.create"] || l.Summary == nil {
			t.Fatalf("a room joined in the range: %v", sortedKeys(res.Join))
		}

		// Two messages: the timeline has them, no state, not limited.
		send(t, rooms, bob, joined, "a")
		send(t, rooms, bob, joined, "b")
		res, next = syncRooms(t, rooms, store, alice, next, roomserver.Filter{})
		j = res.Join[joined]
		if got := bodies(j.Timeline.Events); !slices.Equal(got, []string{"a", "b"}) || j.Timeline.Limited || len(j.State.Events) != 0 || len(res.Invite) != 0 {
			t.Fatalf("incremental: %q limited %v state %d invites %d", got, j.Timeline.Limited, len(j.State.Events), len(res.Invite))
		}
		if j.Summary != nil {
			t.Fatal("a summary though no member, name or alias changed")
		}

		// A gap: a topic set, then more messages than the timeline holds.
		setState(t, rooms, alice, joined, "m.room.topic", `{"topic":"in the gap"}`)
		for i := 0; i < roomserver.DefaultTimelineLimit+2; i++ {
			send(t, rooms, bob, joined, "g"+strconv.Itoa(i))
		}
		res, next = syncRooms(t, rooms, store, alice, next, roomserver.Filter{})
		j = res.Join[joined]
		if len(j.Timeline.Events) != roomserver.DefaultTimelineLimit || !j.Timeline.Limited {
			t.Fatalf("a gap: %d events, limited %v", len(j.Timeline.Events), j.Timeline.Limited)
		}
		if len(j.State.Events) != 1 || j.State.Events[0].Type != "m.room.topic" {
			t.Fatalf("the state changed in the gap: %v", types(j.State.Events))
		}
		// prev_batch pages back into the gap.
		back, err := rooms.Messages(ctx, roomserver.MessagesRequest{UserID: alice, RoomID: joined, From: j.Timeline.PrevBatch, Dir: "b", Limit: "2"})
		if err != nil || !slices.Equal(bodies(back.Chunk), []string{"g1", "g0"}) {
			t.Fatalf("back from prev_batch: %q %v", bodies(back.Chunk), err)
		}
		// A filter's limit.
		short := roomserver.Filter{}
		two := 2
		short.Room.Timeline.Limit = &two
		if res, _ := syncRooms(t, rooms, store, alice, 0, short); len(res.Join[joined].Timeline.Events) != 2 {
			t.Fatalf("a timeline limit of 2: %d events", len(res.Join[joined].Timeline.Events))
		}

		// Alice leaves: the room moves to leave, up to her leave.
		mustJoin(t, rooms, carl, joined)
		if err := rooms.Leave(ctx, alice, joined, "bye"); err != nil {
			t.Fatal(err)
		}
		send(t, rooms, carl, joined, "after alice")
		res, _ = syncRooms(t, rooms, store, alice, next, roomserver.Filter{})
		l, ok := res.Leave[joined]
		if !ok || res.Join[joined] != nil {
			t.Fatalf("after leaving: join %v leave %v", sortedKeys(res.Join), sortedKeys(res.Leave))
		}
		last := l.Timeline.Events[len(l.Timeline.Events)-1]
		if last.Type != "m.room.member" || *last.StateKey != alice || slices.Contains(bodies(l.Timeline.Events), "after alice") {
			t.Fatalf("the left room's timeline ends with %s %v: %q", last.Type, last.StateKey, bodies(l.Timeline.Events))
		}

		// A filter leaving a room out.
		notJoined := roomserver.Filter{}
		notJoined.Room.NotRooms = []string{invited}
		if res, _ := syncRooms(t, rooms, store, alice, 0, notJoined); len(res.Invite) != 0 {
			t.Fatalf("not_rooms: %v", sortedKeys(res.Invite))
		}
	})
}

// Filters are stored per user, and /sync's filter parameter is one of
// them or inline JSON.
func TestSyncFilters(t *testing.T) {
	forEachDatabase(t, func(t *testing.T, rooms *roomserver.Service) {
		ctx := context.Background()
		id, err := rooms.PutFilter(ctx, alice, alice, json.RawMessage(`{"room":{"timeline":{"limit":3}}}`))
		if err != nil {
			t.Fatal(err)
		}
		f, err := rooms.ResolveFilter(ctx, alice, id)
		if err != nil || f.Room.Timeline.Limit == nil || *f.Room.Timeline.Limit != 3 {
			t.Fatalf("stored filter %+v %v", f, err)
		}
		if raw, err := rooms.GetFilter(ctx, alice, alice, id); err != nil || len(raw) == 0 {
			t.Fatalf("get filter %s %v", raw, err)
		}
		_, err = rooms.PutFilter(ctx, alice, bob, json.RawMessage(`{}`))
		wantStatus(t, err, http.StatusForbidden)
		_, err = rooms.GetFilter(ctx, bob, alice, id)
		wantStatus(t, err, http.StatusForbidden)
		_, err = rooms.ResolveFilter(ctx, bob, id) // another user's
		wantErr(t, err, http.StatusBadRequest, "M_BAD_JSON")
		if f, err := rooms.ResolveFilter(ctx, alice, `{"room":{"include_leave":true}}`); err != nil || !f.Room.IncludeLeave {
			t.Fatalf("inline filter %+v %v", f, err)
		}
		_, err = rooms.ResolveFilter(ctx, alice, `{"room":`)
		wantStatus(t, err, http.StatusBadRequest)
	})
}

// Aliases: created for a known room, unique, deleted by their creator
// only; listed to members.
func TestAliases(t *testing.T) {
	forEachDatabase(t, func(t *testing.T, rooms *roomserver.Service) {
		ctx := context.Background()
		r := createRoom(t, rooms, alice, roomserver.CreateRoomRequest{Preset: "public_chat"})
		if err := rooms.PutAlias(ctx, alice, "#one:local.test", r); err != nil {
			t.Fatal(err)
		}
		mustJoin(t, rooms, bob, r)
		if err := rooms.PutAlias(ctx, bob, "#two:local.test", r); err != nil {
			t.Fatal(err)
		}
		wantErr(t, rooms.PutAlias(ctx, bob, "#one:local.test", r), http.StatusConflict, "M_UNKNOWN")
		wantErr(t, rooms.PutAlias(ctx, alice, "#x:other.test", r), http.StatusBadRequest, "M_INVALID_PARAM")
		wantErr(t, rooms.PutAlias(ctx, alice, "nohash:local.test", r), http.StatusBadRequest, "M_INVALID_PARAM")
		wantErr(t, rooms.PutAlias(ctx, alice, "#x:local.test", "!nowhere:local.test"), http.StatusNotFound, "M_NOT_FOUND")

		got, err := rooms.Aliases(ctx, bob, r)
		slices.Sort(got)
		if err != nil || !slices.Equal(got, []string{"#one:local.test", "#two:local.test"}) {
			t.Fatalf("aliases %v %v", got, err)
		}
		_, err = rooms.Aliases(ctx, carl, r)
		wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN")
		if res, err := rooms.ResolveAlias(ctx, "#two:local.test"); err != nil || res.RoomID != r || len(res.Servers) == 0 || res.Servers[0] != local {
			t.Fatalf("resolve %+v %v", res, err)
		}
		if res, err := rooms.FederationQueryAlias(ctx, "#two:local.test"); err != nil || res.RoomID != r {
			t.Fatalf("federation query %+v %v", res, err)
		}
		_, err = rooms.FederationQueryAlias(ctx, "#two:other.test")
		wantErr(t, err, http.StatusNotFound, "M_NOT_FOUND")

		wantErr(t, rooms.DeleteAlias(ctx, alice, "#two:local.test"), http.StatusForbidden, "M_FORBIDDEN")
		if err := rooms.DeleteAlias(ctx, bob, "#two:local.test"); err != nil {
			t.Fatal(err)
		}
		wantErr(t, rooms.DeleteAlias(ctx, bob, "#two:local.test"), http.StatusNotFound, "M_NOT_FOUND")
		_, err = rooms.ResolveAlias(ctx, "#two:local.test")
		wantErr(t, err, http.StatusNotFound, "M_NOT_FOUND")
		// Joining by alias.
		if id, err := rooms.Join(ctx, carl, "#one:local.test", nil, nil); err != nil || id != r {
			t.Fatalf("join by alias %s %v", id, err)
		}
	})
}
