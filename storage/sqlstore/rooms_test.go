package sqlstore_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
)

func roomEvent(id, evType string, stateKey *string, membership string, depth int64) storage.RoomEvent {
	return storage.RoomEvent{EventID: id, RoomID: "!r:x", Type: evType, StateKey: stateKey, Sender: "@a:x",
		Depth: depth, RoomVersion: "10", JSON: []byte(`{"event":"` + id + `"}`), Membership: membership}
}

func eventIDs(evs []storage.RoomEvent) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.EventID)
	}
	return out
}

// Room writes keep a state snapshot before each event, the current state
// and the extremities; a write built on extremities the room no longer
// has changes nothing; membership events change memberships for device
// lists in the same transaction.
func TestRoomWrites(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		for _, u := range []string{"@a:x", "@b:x"} {
			if _, err := s.CreateAccount(ctx, u, "x", nil); err != nil {
				t.Fatal(err)
			}
		}
		empty, a, b, remote := "", "@a:x", "@b:x", "@r:remote"
		res, err := s.WriteRoomEvents(ctx, storage.RoomWrite{
			Create: &storage.Room{RoomID: "!r:x", RoomVersion: "10", Creator: a}, RoomID: "!r:x", Alias: "#r:x",
			Events: []storage.RoomEvent{
				roomEvent("$create", "m.room.create", &empty, "", 1),
				roomEvent("$join", "m.room.member", &a, "join", 2),
				roomEvent("$msg", "m.room.message", nil, "", 3),
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(res.Users, []string{a}) {
			t.Fatalf("the creation concerns %v", res.Users)
		}
		room, err := s.Room(ctx, "!r:x")
		if err != nil || room.Depth != 3 || !slices.Equal(room.Extremities, []string{"$msg"}) || room.RoomVersion != "10" {
			t.Fatalf("room %+v %v", room, err)
		}
		state := func(what string, evs []storage.RoomEvent, err error, want ...string) {
			t.Helper()
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if got := eventIDs(evs); !slices.Equal(got, want) {
				t.Fatalf("%s: %v, want %v", what, got, want)
			}
		}
		evs, err := s.RoomStateBefore(ctx, "$create")
		state("state before the create", evs, err)
		evs, err = s.RoomStateBefore(ctx, "$join")
		state("state before the join", evs, err, "$create")
		evs, err = s.RoomStateBefore(ctx, "$msg")
		state("state before the message", evs, err, "$create", "$join")
		evs, err = s.RoomCurrentState(ctx, "!r:x")
		state("current state", evs, err, "$create", "$join")

		// The same room ID again is refused.
		if _, err := s.WriteRoomEvents(ctx, storage.RoomWrite{Create: &storage.Room{RoomID: "!r:x", RoomVersion: "10", Creator: a},
			RoomID: "!r:x", Events: []storage.RoomEvent{roomEvent("$create2", "m.room.create", &empty, "", 1)}}); !errors.Is(err, storage.ErrExists) {
			t.Fatalf("a second creation: %v", err)
		}

		// Built on stale extremities: refused, nothing written.
		pos, _ := s.CurrentPos(ctx)
		_, err = s.WriteRoomEvents(ctx, storage.RoomWrite{RoomID: "!r:x", Extremities: []string{"$join"},
			Events: []storage.RoomEvent{roomEvent("$stale", "m.room.member", &b, "join", 3)}})
		if !errors.Is(err, storage.ErrRoomMoved) {
			t.Fatalf("a write on stale extremities: %v", err)
		}
		if now, _ := s.CurrentPos(ctx); now != pos {
			t.Fatalf("a refused write moved the stream %d -> %d", pos, now)
		}
		if _, err := s.RoomEvent(ctx, "$stale"); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("a refused event was stored: %v", err)
		}
		if _, err := s.WriteRoomEvents(ctx, storage.RoomWrite{RoomID: "!nowhere:x", Events: []storage.RoomEvent{roomEvent("$x", "m.room.message", nil, "", 1)}}); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("a write to an unknown room: %v", err)
		}

		// An invite of a remote user shares the room: a device-list change
		// for a, tracking of r starts (nothing fetched: no list of theirs
		// is cached), and a is concerned.
		res, err = s.WriteRoomEvents(ctx, storage.RoomWrite{RoomID: "!r:x", Extremities: []string{"$msg"},
			Events: []storage.RoomEvent{roomEvent("$invite", "m.room.member", &remote, "invite", 4)}})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(res.Users, []string{a}) || len(res.NewlyStale) != 0 {
			t.Fatalf("the invite: users %v, newly stale %v", res.Users, res.NewlyStale)
		}
		lists, err := s.DeviceListChanges(ctx, a, pos, res.Pos)
		if err != nil || !slices.Equal(lists.Changed, []string{remote}) {
			t.Fatalf("a's changes after the invite: %+v %v", lists, err)
		}
		// A ban ends the sharing: r is in a's left.
		after := res.Pos
		res, err = s.WriteRoomEvents(ctx, storage.RoomWrite{RoomID: "!r:x", Extremities: []string{"$invite"},
			Events: []storage.RoomEvent{roomEvent("$ban", "m.room.member", &remote, "ban", 5)}})
		if err != nil {
			t.Fatal(err)
		}
		lists, err = s.DeviceListChanges(ctx, a, after, res.Pos)
		if err != nil || !slices.Equal(lists.Left, []string{remote}) {
			t.Fatalf("a's changes after the ban: %+v %v", lists, err)
		}
		if m, err := s.RoomMembership(ctx, "!r:x", remote); err != nil || m != "ban" {
			t.Fatalf("r's membership %q %v", m, err)
		}
		// The timeline in stream order, limited.
		tl, limited, err := s.RoomTimeline(ctx, "!r:x", 0, res.Pos, 2)
		if err != nil || !limited || !slices.Equal(eventIDs(tl), []string{"$invite", "$ban"}) {
			t.Fatalf("timeline %v limited %v %v", eventIDs(tl), limited, err)
		}
		if a, err := s.RoomAlias(ctx, "#r:x"); err != nil || a.RoomID != "!r:x" || a.Creator != "@a:x" {
			t.Fatalf("alias %+v %v", a, err)
		}
	})
}

// A room's history here starts at its first placed event: outliers
// (the state and auth chain of a join) and rejected events are not part
// of it.
func TestRoomMinDepth(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		if d, err := s.RoomMinDepth(ctx, "!r:x"); err != nil || d != 0 {
			t.Fatalf("unknown room: %d %v", d, err)
		}
		empty, a := "", "@a:x"
		create := roomEvent("$create", "m.room.create", &empty, "", 1)
		member := roomEvent("$member", "m.room.member", &a, "join", 2)
		join := roomEvent("$join", "m.room.member", &a, "join", 5)
		if _, err := s.IngestRoomEvents(ctx, storage.RoomIngest{RoomID: "!r:x", Create: &storage.Room{RoomVersion: "10", Creator: a},
			Outliers: []storage.RoomEvent{create, member}, Event: &join, StateBefore: []string{"$create", "$member"},
			Extremities: []string{}, NewExtremities: []string{"$join"}, CurrentAfterEvent: true}); err != nil {
			t.Fatal(err)
		}
		rejected := roomEvent("$rejected", "m.room.message", nil, "", 3)
		rejected.Rejected = true
		if _, err := s.IngestRoomEvents(ctx, storage.RoomIngest{RoomID: "!r:x", Event: &rejected}); err != nil {
			t.Fatal(err)
		}
		if d, err := s.RoomMinDepth(ctx, "!r:x"); err != nil || d != 5 {
			t.Fatalf("min depth %d %v, want 5", d, err)
		}
		msg := roomEvent("$msg", "m.room.message", nil, "", 4)
		if _, err := s.IngestRoomEvents(ctx, storage.RoomIngest{RoomID: "!r:x", Event: &msg, StateAfter: "$member"}); err == nil {
			t.Fatal("placed on an outlier's state")
		}
		if _, err := s.IngestRoomEvents(ctx, storage.RoomIngest{RoomID: "!r:x", Event: &msg, StateBefore: []string{"$create", "$member"}}); err != nil {
			t.Fatal(err)
		}
		if d, err := s.RoomMinDepth(ctx, "!r:x"); err != nil || d != 4 {
			t.Fatalf("min depth %d %v, want 4", d, err)
		}
	})
}

// A write concerns the room's local joined and invited members as its
// own transaction leaves them, whether the member list was read again or
// kept from an earlier write on the same state: a join, a leave and a
// refused write (whose snapshot number SQLite may hand out again) in
// between messages.
func TestRoomWritesConcernTheMembersOfTheirState(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		empty, a, b, c := "", "@a:x", "@b:x", "@c:x"
		ext := "$join-a"
		if _, err := s.WriteRoomEvents(ctx, storage.RoomWrite{
			Create: &storage.Room{RoomID: "!r:x", RoomVersion: "10", Creator: a}, RoomID: "!r:x",
			Events: []storage.RoomEvent{roomEvent("$create", "m.room.create", &empty, "", 1), roomEvent(ext, "m.room.member", &a, "join", 2)},
		}); err != nil {
			t.Fatal(err)
		}
		depth := int64(2)
		txn := &storage.RoomTxn{UserID: a, DeviceID: "D", Path: "p"}
		write := func(ev storage.RoomEvent) []string {
			t.Helper()
			depth++
			ev.Depth = depth
			w := storage.RoomWrite{RoomID: "!r:x", Extremities: []string{ext}, Events: []storage.RoomEvent{ev}}
			if ev.EventID == "$m3" {
				w.Txn = txn
			}
			res, err := s.WriteRoomEvents(ctx, w)
			if err != nil {
				t.Fatal(err)
			}
			ext = ev.EventID
			users := slices.Clone(res.Users)
			slices.Sort(users)
			return users
		}
		expect := func(what string, got []string, want ...string) {
			t.Helper()
			if !slices.Equal(got, want) {
				t.Fatalf("%s concerns %v, want %v", what, got, want)
			}
		}
		expect("a message", write(roomEvent("$m1", "m.room.message", nil, "", 0)), a)
		expect("the second message", write(roomEvent("$m2", "m.room.message", nil, "", 0)), a)
		expect("b's join", write(roomEvent("$join-b", "m.room.member", &b, "join", 0)), a, b)
		expect("a message after b's join", write(roomEvent("$m3", "m.room.message", nil, "", 0)), a, b)
		// A state write repeating a transaction (a retried request) fails
		// and leaves nothing behind, its snapshot's members included.
		if _, err := s.WriteRoomEvents(ctx, storage.RoomWrite{RoomID: "!r:x", Extremities: []string{ext}, Txn: txn,
			Events: []storage.RoomEvent{roomEvent("$invite-c", "m.room.member", &c, "invite", depth+1)}}); !errors.Is(err, storage.ErrTxnDone) {
			t.Fatalf("a write repeating a transaction: %v", err)
		}
		if _, err := s.RoomEvent(ctx, "$invite-c"); !errors.Is(err, storage.ErrNotFound) {
			t.Fatalf("the repeated transaction's event was stored: %v", err)
		}
		expect("b's leave", write(roomEvent("$leave-b", "m.room.member", &b, "leave", 0)), a, b)
		expect("a message after b's leave", write(roomEvent("$m4", "m.room.message", nil, "", 0)), a)
		// b, a past member, hears of the new member's device list.
		expect("c's invite", write(roomEvent("$invite-c2", "m.room.member", &c, "invite", 0)), a, b, c)
		expect("a message after c's invite", write(roomEvent("$m5", "m.room.message", nil, "", 0)), a, c)
	})
}

// Migration 15 gives every stored event the state after it: in a room
// written as one chain (all there was before it), the state before the
// next event, or the room's state after the last.
func TestStateAfterFilledByMigration15(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		empty, a := "", "@a:x"
		chain := []storage.RoomEvent{
			roomEvent("$create", "m.room.create", &empty, "", 1), roomEvent("$join", "m.room.member", &a, "join", 2),
			roomEvent("$m1", "m.room.message", nil, "", 3), roomEvent("$topic", "m.room.topic", &empty, "", 4),
			roomEvent("$m2", "m.room.message", nil, "", 5), roomEvent("$m3", "m.room.message", nil, "", 6),
			roomEvent("$name", "m.room.name", &empty, "", 7),
		}
		if _, err := s.WriteRoomEvents(ctx, storage.RoomWrite{Create: &storage.Room{RoomID: "!r:x", RoomVersion: "10", Creator: a},
			RoomID: "!r:x", Events: chain[:4]}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.WriteRoomEvents(ctx, storage.RoomWrite{RoomID: "!r:x", Extremities: []string{"$topic"}, Events: chain[4:]}); err != nil {
			t.Fatal(err)
		}
		afters := func() map[string]int64 {
			t.Helper()
			rows, err := s.DB().Query(`SELECT event_id, COALESCE(state_after, -1) FROM room_events`)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			out := map[string]int64{}
			for rows.Next() {
				var id string
				var after int64
				if err := rows.Scan(&id, &after); err != nil {
					t.Fatal(err)
				}
				out[id] = after
			}
			return out
		}
		written := afters()
		if _, err := s.DB().Exec(`UPDATE room_events SET state_after = NULL`); err != nil {
			t.Fatal(err)
		}
		ran := 0
		for _, stmt := range s.MigrationStatements(15) {
			if strings.Contains(stmt, "ALTER TABLE") {
				continue // the column is there
			}
			if _, err := s.DB().Exec(stmt); err != nil {
				t.Fatalf("%v in %s", err, stmt)
			}
			ran++
		}
		if ran != 2 {
			t.Fatalf("ran %d of migration 15's updates, want 2", ran)
		}
		if got := afters(); !maps.Equal(got, written) {
			t.Fatalf("state after each event as migration 15 fills it: %v, as written: %v", got, written)
		}
		for _, id := range []string{"$topic", "$m3", "$name"} {
			if written[id] <= 0 {
				t.Fatalf("%s was written without the state after it: %v", id, written)
			}
		}
	})
}

// The servers of a room are those with a user joined in its current
// state: not those only invited, nor those whose users left; each once,
// sorted.
func TestRoomJoinedServers(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		empty, a, b, c, d, e := "", "@a:x", "@b:z.example", "@c:z.example", "@d:y.example", "@e:w.example"
		events := []storage.RoomEvent{
			roomEvent("$create", "m.room.create", &empty, "", 1),
			roomEvent("$a", "m.room.member", &a, "join", 2),
			roomEvent("$b", "m.room.member", &b, "join", 3),
			roomEvent("$c", "m.room.member", &c, "join", 4),
			roomEvent("$d", "m.room.member", &d, "invite", 5),
			roomEvent("$e", "m.room.member", &e, "join", 6),
			roomEvent("$e2", "m.room.member", &e, "leave", 7),
		}
		if _, err := s.WriteRoomEvents(ctx, storage.RoomWrite{Create: &storage.Room{RoomID: "!r:x", RoomVersion: "10", Creator: a},
			RoomID: "!r:x", Events: events}); err != nil {
			t.Fatal(err)
		}
		got, err := s.RoomJoinedServers(ctx, "!r:x")
		if want := []string{"x", "z.example"}; err != nil || !slices.Equal(got, want) {
			t.Fatalf("joined servers %v (%v), want %v", got, err, want)
		}
		// a leaves: x is no longer in the room.
		if _, err := s.WriteRoomEvents(ctx, storage.RoomWrite{RoomID: "!r:x", Extremities: []string{"$e2"},
			Events: []storage.RoomEvent{roomEvent("$a2", "m.room.member", &a, "leave", 8)}}); err != nil {
			t.Fatal(err)
		}
		got, err = s.RoomJoinedServers(ctx, "!r:x")
		if want := []string{"z.example"}; err != nil || !slices.Equal(got, want) {
			t.Fatalf("after the leave: %v (%v), want %v", got, err, want)
		}
		if got, err := s.RoomJoinedServers(ctx, "!unknown:x"); err != nil || len(got) != 0 {
			t.Fatalf("an unknown room: %v (%v)", got, err)
		}
	})
}
