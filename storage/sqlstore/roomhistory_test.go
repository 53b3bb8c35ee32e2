package sqlstore_test

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
)

// History fetched from other servers (RoomIngest.HistoryPos) is placed
// below the room's timeline, at the positions given, with the state
// before it; an outlier among it is placed. The room's head, extremities
// and current state stay, and a read from position 0 (/sync's) never
// sees it.
func TestRoomHistoryPlacedBelowTheTimeline(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		empty, a := "", "@a:x"
		create := roomEvent("$create", "m.room.create", &empty, "", 1)
		member := roomEvent("$member", "m.room.member", &a, "join", 2)
		join := roomEvent("$join", "m.room.member", &a, "join", 5)
		if _, err := s.IngestRoomEvents(ctx, storage.RoomIngest{RoomID: "!r:x", Create: &storage.Room{RoomVersion: "10", Creator: a},
			Outliers: []storage.RoomEvent{create, member}, Event: &join, StateBefore: []string{"$create", "$member"},
			Extremities: []string{}, NewExtremities: []string{"$join"}, CurrentAfterEvent: true}); err != nil {
			t.Fatal(err)
		}
		if p, err := s.RoomLowestPos(ctx, "!r:x"); err != nil || p != 0 {
			t.Fatalf("lowest %d %v, want 0", p, err)
		}
		before, err := s.Room(ctx, "!r:x")
		if err != nil {
			t.Fatal(err)
		}
		old := roomEvent("$old", "m.room.message", nil, "", 3)
		for _, in := range []storage.RoomIngest{
			{RoomID: "!r:x", Event: &old, StateBefore: []string{"$create", "$member"}, HistoryPos: -2},
			{RoomID: "!r:x", Event: &member, StateBefore: []string{"$create"}, HistoryPos: -3},
		} {
			if _, err := s.IngestRoomEvents(ctx, in); err != nil {
				t.Fatal(err)
			}
		}
		bad := roomEvent("$bad", "m.room.message", nil, "", 3)
		if _, err := s.IngestRoomEvents(ctx, storage.RoomIngest{RoomID: "!r:x", Event: &bad, StateBefore: []string{}, HistoryPos: 4}); err == nil {
			t.Fatal("history placed above the stream's start")
		}
		if p, err := s.RoomLowestPos(ctx, "!r:x"); err != nil || p != -3 {
			t.Fatalf("lowest %d %v, want -3", p, err)
		}
		after, err := s.Room(ctx, "!r:x")
		if err != nil {
			t.Fatal(err)
		}
		if after.Head != before.Head || after.StateSnapshot != before.StateSnapshot || !slices.Equal(after.Extremities, before.Extremities) {
			t.Fatalf("the room moved: %+v, was %+v", after, before)
		}
		all, err := s.RoomMessages(ctx, "!r:x", math.MinInt64, math.MaxInt64, 10, false)
		if err != nil || !slices.Equal(eventIDs(all), []string{"$join", "$old", "$member"}) {
			t.Fatalf("all %v %v", eventIDs(all), err)
		}
		if all[1].Pos != -2 || all[2].Pos != -3 || all[2].Outlier {
			t.Fatalf("positions %d %d, outlier %v", all[1].Pos, all[2].Pos, all[2].Outlier)
		}
		if timeline, err := s.RoomMessages(ctx, "!r:x", 0, math.MaxInt64, 10, false); err != nil || !slices.Equal(eventIDs(timeline), []string{"$join"}) {
			t.Fatalf("from 0: %v %v", eventIDs(timeline), err)
		}
		if st, err := s.RoomStateBefore(ctx, "$old"); err != nil || !slices.Equal(sortedIDs(st), []string{"$create", "$member"}) {
			t.Fatalf("state before $old %v %v", eventIDs(st), err)
		}
	})
}

func sortedIDs(evs []storage.RoomEvent) []string {
	ids := eventIDs(evs)
	slices.Sort(ids)
	return ids
}
