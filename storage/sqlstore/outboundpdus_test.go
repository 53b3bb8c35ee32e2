package sqlstore_test

import (
	"context"
	"slices"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// pendingPDUs returns the IDs of the events waiting for dest, in queue
// order.
func pendingPDUs(t *testing.T, s *sqlstore.Store, dest string) []string {
	t.Helper()
	pdus, err := s.PendingPDUs(context.Background(), dest, 100)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, p := range pdus {
		if p.Destination != dest || string(p.JSON) != `{"event":"`+p.EventID+`"}` {
			t.Fatalf("pending PDU %+v for %s", p, dest)
		}
		ids = append(ids, p.EventID)
	}
	return ids
}

// A federated room write queues each event, in the write's transaction,
// for every other server with a joined member in the room after the write,
// and a membership event also for its target's server; never for this
// server. Unfederated writes queue nothing; the origin of an event
// received from elsewhere is skipped; delivered PDUs leave the queue.
func TestRoomWritesQueuePDUs(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		empty, a, local2 := "", "@a:x", "@l:x"
		b1, c2, e2, f4, d3 := "@b:one", "@c:two", "@e:two", "@f:four", "@d:three"
		last := ""
		write := func(federate bool, evs ...storage.RoomEvent) storage.RoomWriteResult {
			t.Helper()
			w := storage.RoomWrite{RoomID: "!r:x", Extremities: []string{last}, Events: evs, Federate: federate}
			if last == "" {
				w.Create, w.Extremities = &storage.Room{RoomID: "!r:x", RoomVersion: "10", Creator: a}, nil
			}
			var res storage.RoomWriteResult
			var err error
			if len(evs) == 1 && evs[0].StateKey == nil && last != "" {
				// A message, as sent (on PostgreSQL in a batch of
				// messages).
				room, rerr := s.Room(ctx, "!r:x")
				if rerr != nil {
					t.Fatal(rerr)
				}
				w.Head, w.StateSnapshot = room.Head, room.StateSnapshot
				res, err = s.StartRoomWrite(ctx, w)()
			} else {
				res, err = s.WriteRoomEvents(ctx, w)
			}
			if err != nil {
				t.Fatal(err)
			}
			last = evs[len(evs)-1].EventID
			return res
		}
		expect := func(when string, want map[string][]string) {
			t.Helper()
			dests, err := s.PDUDestinations(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var wantDests []string
			for d := range want {
				wantDests = append(wantDests, d)
			}
			slices.Sort(wantDests)
			if !slices.Equal(dests, wantDests) {
				t.Fatalf("%s: destinations %v, want %v", when, dests, wantDests)
			}
			for d, ids := range want {
				if got := pendingPDUs(t, s, d); !slices.Equal(got, ids) {
					t.Fatalf("%s: pending for %s %v, want %v", when, d, got, ids)
				}
			}
		}

		// Local members only: nothing to send, for the create nor a
		// local user's join.
		res := write(true, roomEvent("$create", "m.room.create", &empty, "", 1), roomEvent("$a", "m.room.member", &a, "join", 2),
			roomEvent("$l", "m.room.member", &local2, "join", 3))
		if res.PDUsQueued {
			t.Fatal("a room of local members queued PDUs")
		}
		expect("local members only", nil)

		// Remote members written without Federate (as events received
		// from their servers would be): nothing queued.
		if res := write(false, roomEvent("$b1", "m.room.member", &b1, "join", 4), roomEvent("$c2", "m.room.member", &c2, "join", 5),
			roomEvent("$e2", "m.room.member", &e2, "join", 6), roomEvent("$f4", "m.room.member", &f4, "join", 7)); res.PDUsQueued {
			t.Fatal("an unfederated write queued PDUs")
		}
		expect("unfederated joins", nil)

		// Our messages go to every server with a joined member, once per
		// server, in order.
		if res := write(true, roomEvent("$m1", "m.room.message", nil, "", 8), roomEvent("$m2", "m.room.message", nil, "", 9)); !res.PDUsQueued {
			t.Fatal("the messages' write does not say PDUs were queued")
		}
		expect("messages", map[string][]string{"one": {"$m1", "$m2"}, "two": {"$m1", "$m2"}, "four": {"$m1", "$m2"}})

		// b is kicked: one is no longer in the room but is sent the kick;
		// the next message goes to two and four only. An invite goes to
		// the room's servers, not the invitee's (which had it through
		// /invite).
		write(true, roomEvent("$kick", "m.room.member", &b1, "leave", 10))
		write(true, roomEvent("$m3", "m.room.message", nil, "", 11))
		write(true, roomEvent("$invite", "m.room.member", &d3, "invite", 12))
		if n, err := s.PDUQueueDepth(ctx); err != nil || n != 13 {
			t.Fatalf("queue depth %d %v, want 13", n, err)
		}
		expect("kick, message, invite", map[string][]string{
			"one":  {"$m1", "$m2", "$kick"},
			"two":  {"$m1", "$m2", "$kick", "$m3", "$invite"},
			"four": {"$m1", "$m2", "$kick", "$m3", "$invite"},
		})
		// $m3 went through PostgreSQL's message batches.
		if db.Name == "postgres" && s.MessageBatches() == 0 {
			t.Fatal("no message went through PostgreSQL's message batches")
		}

		// An event received from two is sent on to the others, not back
		// to two; queueing an event again changes nothing.
		write(false, roomEvent("$from2", "m.room.message", nil, "", 13))
		if queued, err := s.QueueRoomPDUs(ctx, "!r:x", []storage.RoomEvent{roomEvent("$from2", "m.room.message", nil, "", 13)}, []string{"two"}); err != nil || !queued {
			t.Fatalf("queueing a received event: %v %v", queued, err)
		}
		if _, err := s.QueueRoomPDUs(ctx, "!r:x", []storage.RoomEvent{roomEvent("$m3", "m.room.message", nil, "", 11)}, nil); err != nil {
			t.Fatal(err)
		}
		if queued, err := s.QueueRoomPDUs(ctx, "!r:x", []storage.RoomEvent{roomEvent("$from2", "m.room.message", nil, "", 13)},
			[]string{"two", "four"}); err != nil || queued {
			t.Fatalf("nobody to send to: %v %v", queued, err)
		}
		expect("a received event", map[string][]string{
			"one":  {"$m1", "$m2", "$kick"},
			"two":  {"$m1", "$m2", "$kick", "$m3", "$invite"},
			"four": {"$m1", "$m2", "$kick", "$m3", "$invite", "$from2"},
		})

		// Oldest first, limited; marking sent removes exactly those.
		first, err := s.PendingPDUs(ctx, "four", 2)
		if err != nil || len(first) != 2 || first[0].EventID != "$m1" || first[1].EventID != "$m2" || first[0].ID >= first[1].ID {
			t.Fatalf("the first two for four: %+v %v", first, err)
		}
		if err := s.MarkPDUsSent(ctx, "four", first); err != nil {
			t.Fatal(err)
		}
		// Marking another destination's IDs does nothing.
		if err := s.MarkPDUsSent(ctx, "one", first); err != nil {
			t.Fatal(err)
		}
		expect("after delivery", map[string][]string{
			"one":  {"$m1", "$m2", "$kick"},
			"two":  {"$m1", "$m2", "$kick", "$m3", "$invite"},
			"four": {"$kick", "$m3", "$invite", "$from2"},
		})

		// A write that fails queues nothing.
		if _, err := s.WriteRoomEvents(ctx, storage.RoomWrite{RoomID: "!r:x", Extremities: []string{"$m1"}, Federate: true,
			Events: []storage.RoomEvent{roomEvent("$stale", "m.room.message", nil, "", 14)}}); err == nil {
			t.Fatal("a write on stale extremities succeeded")
		}
		if got := pendingPDUs(t, s, "two"); len(got) != 5 {
			t.Fatalf("a failed write queued: %v", got)
		}
	})
}

// An event received from another server and placed with Federate (a join
// or leave this server was the resident for) is sent on to the room's
// other servers but those skipped, after the state it brings: the joined
// user's server is skipped as the origin, the others get it. A
// soft-failed one, or one placed without Federate, is not sent.
func TestIngestedEventsQueuePDUs(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		empty, a, b1, c2, d3 := "", "@a:x", "@b:one", "@c:two", "@d:three"
		if _, err := s.WriteRoomEvents(ctx, storage.RoomWrite{Create: &storage.Room{RoomID: "!r:x", RoomVersion: "10", Creator: a},
			RoomID: "!r:x", Events: []storage.RoomEvent{
				roomEvent("$create", "m.room.create", &empty, "", 1), roomEvent("$a", "m.room.member", &a, "join", 2),
				roomEvent("$b1", "m.room.member", &b1, "join", 3), roomEvent("$c2", "m.room.member", &c2, "join", 4),
			}}); err != nil {
			t.Fatal(err)
		}
		last := "$c2"
		ingest := func(ev storage.RoomEvent, federate bool, skip ...string) storage.RoomWriteResult {
			t.Helper()
			in := storage.RoomIngest{RoomID: "!r:x", Event: &ev, StateAfter: last, Federate: federate, SkipServers: skip}
			if !ev.SoftFailed { // a soft-failed event is not built upon
				in.Extremities, in.NewExtremities, in.CurrentAfterEvent = []string{last}, []string{ev.EventID}, true
			}
			res, err := s.IngestRoomEvents(ctx, in)
			if err != nil {
				t.Fatal(err)
			}
			if !ev.SoftFailed {
				last = ev.EventID
			}
			return res
		}
		join := roomEvent("$d3", "m.room.member", &d3, "join", 5)
		join.Sender = d3
		if res := ingest(join, true, "three"); !res.PDUsQueued {
			t.Fatal("the join sent on does not say PDUs were queued")
		}
		soft := roomEvent("$soft", "m.room.message", nil, "", 6)
		soft.SoftFailed = true
		if res := ingest(soft, true, "three"); res.PDUsQueued {
			t.Fatal("a soft-failed event was queued")
		}
		if res := ingest(roomEvent("$plain", "m.room.message", nil, "", 7), false); res.PDUsQueued {
			t.Fatal("an event placed without Federate was queued")
		}
		dests, err := s.PDUDestinations(ctx)
		if err != nil || !slices.Equal(dests, []string{"one", "two"}) {
			t.Fatalf("destinations %v %v, want one and two", dests, err)
		}
		for _, d := range dests {
			if got := pendingPDUs(t, s, d); !slices.Equal(got, []string{"$d3"}) {
				t.Fatalf("pending for %s: %v", d, got)
			}
		}
	})
}
