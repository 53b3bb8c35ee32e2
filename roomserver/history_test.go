package roomserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"testing"

	"github.com/keyserver/keyserver/roomserver"
)

// bodies reads the message bodies of events, in order; other events are
// named by their type.
func bodies(evs []roomserver.ClientEvent) []string {
	out := []string{}
	for _, ev := range evs {
		var c struct {
			Body       string `json:"body"`
			Membership string `json:"membership"`
		}
		_ = json.Unmarshal(ev.Content, &c)
		switch {
		case ev.Type == "m.room.message":
			out = append(out, c.Body)
		case ev.Type == "m.room.member":
			out = append(out, c.Membership+":"+*ev.StateKey)
		default:
			out = append(out, ev.Type)
		}
	}
	return out
}

// history is every event of a room the user may read, oldest first, read
// back from now in pages of limit.
func history(t *testing.T, rooms *roomserver.Service, userID, roomID string, limit int, filter string) []roomserver.ClientEvent {
	t.Helper()
	var all []roomserver.ClientEvent
	from := ""
	for pages := 0; ; pages++ {
		if pages > 100 {
			t.Fatal("paging does not end")
		}
		res, err := rooms.Messages(context.Background(), roomserver.MessagesRequest{UserID: userID, RoomID: roomID,
			From: from, Dir: "b", Limit: strconv.Itoa(limit), Filter: filter})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Chunk) > limit {
			t.Fatalf("a page of %d events with limit %d", len(res.Chunk), limit)
		}
		all = append(all, res.Chunk...)
		if res.End == "" {
			break
		}
		from = res.End
	}
	slices.Reverse(all)
	return all
}

// What a member sees of a room's history follows the room's history
// visibility and their membership at each event: "joined" from their
// join, "invited" from their invite, "shared" everything once joined,
// "world_readable" anything to anyone; one who left up to their leave.
func TestHistoryVisibility(t *testing.T) {
	forEachDatabase(t, func(t *testing.T, rooms *roomserver.Service) {
		ctx := context.Background()
		for _, c := range []struct {
			setting string
			want    []string // what bob, invited after m1 and joined after m2, sees
			left    []string // the messages he sees once he left, m4 sent after
		}{
			{"joined", []string{"join:" + bob, "m3"}, []string{"m3"}},
			{"invited", []string{"invite:" + bob, "m2", "join:" + bob, "m3"}, []string{"m2", "m3"}},
			// Shared: the whole history while joined; once he left, what
			// was sent while he was joined.
			{"shared", []string{"m1", "invite:" + bob, "m2", "join:" + bob, "m3"}, []string{"m3"}},
			// World readable: anything, up to his leave (as Synapse clamps
			// the history of one who left).
			{"world_readable", []string{"m1", "invite:" + bob, "m2", "join:" + bob, "m3"}, []string{"m1", "m2", "m3"}},
		} {
			r := createRoom(t, rooms, alice, roomserver.CreateRoomRequest{Preset: "private_chat"})
			setState(t, rooms, alice, r, "m.room.history_visibility", `{"history_visibility":"`+c.setting+`"}`)
			send(t, rooms, alice, r, "m1")
			if err := rooms.Invite(ctx, alice, r, bob, ""); err != nil {
				t.Fatal(err)
			}
			m2 := send(t, rooms, alice, r, "m2")
			mustJoin(t, rooms, bob, r)
			send(t, rooms, alice, r, "m3")

			got := bodies(history(t, rooms, bob, r, 3, `{"types":["m.room.message","m.room.member"],"not_senders":[]}`))
			// Alice's own join is part of the room's start; only what
			// follows the setting is compared.
			if i := slices.Index(got, "join:"+alice); i >= 0 {
				got = got[i+1:]
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("%s: bob sees %q, want %q", c.setting, got, c.want)
			}
			_, err := rooms.Event(ctx, bob, r, m2)
			if visible := slices.Contains(c.want, "m2"); visible != (err == nil) {
				t.Fatalf("%s: /event of m2: %v", c.setting, err)
			}

			// A non-member reads only a world-readable room.
			_, err = rooms.Messages(ctx, roomserver.MessagesRequest{UserID: carl, RoomID: r, Dir: "b"})
			if c.setting == "world_readable" {
				if err != nil {
					t.Fatalf("world_readable: a non-member: %v", err)
				}
			} else {
				wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN")
			}

			// Bob leaves: what follows is hidden from him, what he saw stays.
			if err := rooms.Leave(ctx, bob, r, ""); err != nil {
				t.Fatal(err)
			}
			m4 := send(t, rooms, alice, r, "m4")
			got = bodies(history(t, rooms, bob, r, 10, `{"types":["m.room.message"]}`))
			if !slices.Equal(got, c.left) {
				t.Fatalf("%s: after leaving bob sees %q, want %q", c.setting, got, c.left)
			}
			if c.setting != "world_readable" {
				_, err = rooms.Event(ctx, bob, r, m4)
				wantErr(t, err, http.StatusNotFound, "M_NOT_FOUND")
			}
		}
	})
}

// /messages pages back and forth through a room without a gap or a
// repeat, each page at most limit events; a token fixes where a page
// starts, so events sent since do not shift it; filters apply.
func TestMessagesPagination(t *testing.T) {
	forEachDatabase(t, func(t *testing.T, rooms *roomserver.Service) {
		ctx := context.Background()
		r := createRoom(t, rooms, alice, roomserver.CreateRoomRequest{Preset: "public_chat"})
		mustJoin(t, rooms, bob, r)
		var want []string
		for i := 0; i < 23; i++ {
			sender := alice
			if i%3 == 0 {
				sender = bob
			}
			b := "m" + strconv.Itoa(i)
			send(t, rooms, sender, r, b)
			want = append(want, b)
		}
		onlyMessages := `{"types":["m.room.message"]}`
		if got := bodies(history(t, rooms, bob, r, 5, onlyMessages)); !slices.Equal(got, want) {
			t.Fatalf("paged back in fives: %q", got)
		}
		all := history(t, rooms, bob, r, 4, "")
		if all[0].Type != "m.room.create" || len(all) != len(want)+7 {
			t.Fatalf("the whole room paged back in fours: %q", bodies(all))
		}

		// Forward from the start, in pages of 7.
		var fwd []roomserver.ClientEvent
		from := ""
		for {
			res, err := rooms.Messages(ctx, roomserver.MessagesRequest{UserID: bob, RoomID: r, From: from, Dir: "f", Limit: "7"})
			if err != nil {
				t.Fatal(err)
			}
			fwd = append(fwd, res.Chunk...)
			if res.End == "" {
				break
			}
			from = res.End
		}
		if !slices.EqualFunc(fwd, all, func(a, b roomserver.ClientEvent) bool { return a.EventID == b.EventID }) {
			t.Fatalf("forward %q, backward %q", bodies(fwd), bodies(all))
		}

		// A page from a token; a message sent later is not on the next.
		page, err := rooms.Messages(ctx, roomserver.MessagesRequest{UserID: bob, RoomID: r, Dir: "b", Limit: "3", Filter: onlyMessages})
		if err != nil || !slices.Equal(bodies(page.Chunk), []string{"m22", "m21", "m20"}) {
			t.Fatalf("first page %q %v", bodies(page.Chunk), err)
		}
		send(t, rooms, alice, r, "late")
		next, err := rooms.Messages(ctx, roomserver.MessagesRequest{UserID: bob, RoomID: r, From: page.End, Dir: "b", Limit: "3", Filter: onlyMessages})
		if err != nil || !slices.Equal(bodies(next.Chunk), []string{"m19", "m18", "m17"}) {
			t.Fatalf("second page %q %v", bodies(next.Chunk), err)
		}
		// from and to bound a range.
		bounded, err := rooms.Messages(ctx, roomserver.MessagesRequest{UserID: bob, RoomID: r, From: next.End, To: page.End, Dir: "f", Limit: "10"})
		if err != nil || !slices.Equal(bodies(bounded.Chunk), []string{"m17", "m18", "m19"}) {
			t.Fatalf("from the second page's end to the first's: %q %v", bodies(bounded.Chunk), err)
		}

		// Senders and not_senders.
		bobs, err := rooms.Messages(ctx, roomserver.MessagesRequest{UserID: bob, RoomID: r, Dir: "b", Limit: "100",
			Filter: `{"types":["m.room.*"],"not_types":["m.room.member"],"senders":["` + bob + `"]}`})
		if err != nil || !slices.Equal(bodies(bobs.Chunk), []string{"m21", "m18", "m15", "m12", "m9", "m6", "m3", "m0"}) {
			t.Fatalf("bob's messages %q %v", bodies(bobs.Chunk), err)
		}

		for _, bad := range []roomserver.MessagesRequest{
			{Dir: ""}, {Dir: "x"}, {Dir: "b", Limit: "-1"}, {Dir: "b", Limit: "ten"},
			{Dir: "b", From: "nonsense"}, {Dir: "b", Filter: "{"},
		} {
			bad.UserID, bad.RoomID = bob, r
			_, err := rooms.Messages(ctx, bad)
			if err == nil {
				t.Fatalf("%+v accepted", bad)
			}
			wantStatus(t, err, http.StatusBadRequest)
		}
	})
}

// /context gives an event with those around it, limited, and the state
// after the last one.
func TestContext(t *testing.T) {
	forEachDatabase(t, func(t *testing.T, rooms *roomserver.Service) {
		ctx := context.Background()
		r := createRoom(t, rooms, alice, roomserver.CreateRoomRequest{Preset: "public_chat"})
		var ids []string
		for i := 0; i < 9; i++ {
			ids = append(ids, send(t, rooms, alice, r, "m"+strconv.Itoa(i)))
		}
		res, err := rooms.Context(ctx, roomserver.ContextRequest{UserID: alice, RoomID: r, EventID: ids[4], Limit: "4"})
		if err != nil {
			t.Fatal(err)
		}
		if res.Event.EventID != ids[4] || !slices.Equal(bodies(res.EventsBefore), []string{"m3", "m2"}) ||
			!slices.Equal(bodies(res.EventsAfter), []string{"m5", "m6"}) {
			t.Fatalf("context before %q after %q", bodies(res.EventsBefore), bodies(res.EventsAfter))
		}
		if len(res.State) == 0 {
			t.Fatal("no state")
		}
		// The end token pages on from the last event after.
		more, err := rooms.Messages(ctx, roomserver.MessagesRequest{UserID: alice, RoomID: r, From: res.End, Dir: "f", Limit: "10"})
		if err != nil || !slices.Equal(bodies(more.Chunk), []string{"m7", "m8"}) {
			t.Fatalf("after the context %q %v", bodies(more.Chunk), err)
		}
		_, err = rooms.Context(ctx, roomserver.ContextRequest{UserID: alice, RoomID: r, EventID: "$nothing"})
		wantErr(t, err, http.StatusNotFound, "M_NOT_FOUND")
		_, err = rooms.Context(ctx, roomserver.ContextRequest{UserID: carl, RoomID: r, EventID: ids[0]})
		wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN")
	})
}
