package relations_test

import (
	"context"
	"encoding/json"
	"math"
	"slices"
	"testing"

	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/relations"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

const (
	room  = "!r:x"
	alice = "@alice:x"
	bob   = "@bob:y"
)

// fixture writes events into one room as the room server's writes and
// other servers' events would be stored: a local chain, a plain message
// (PostgreSQL's batched path), and an ingested event.
type fixture struct {
	t     *testing.T
	store *sqlstore.Store
	last  string
	depth int64
}

func setup(t *testing.T, db testdb.Database) (*fixture, *relations.Service) {
	t.Helper()
	store, err := sqlstore.Open(context.Background(), db.URI, "x")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	f := &fixture{t: t, store: store}
	empty := ""
	f.write(storage.RoomWrite{Create: &storage.Room{RoomID: room, RoomVersion: "10", Creator: alice}, RoomID: room},
		f.event("$create", alice, "m.room.create", &empty, `{}`, 1))
	return f, relations.New(store)
}

// event is an event of the room with that content; ts is its
// origin_server_ts.
func (f *fixture) event(id, sender, evType string, stateKey *string, content string, ts int64) storage.RoomEvent {
	f.depth++
	ev := map[string]any{"event_id": id, "room_id": room, "sender": sender, "type": evType, "origin_server_ts": ts,
		"content": json.RawMessage(content), "depth": f.depth}
	if stateKey != nil {
		ev["state_key"] = *stateKey
	}
	js, _ := json.Marshal(ev)
	return storage.RoomEvent{EventID: id, RoomID: room, Type: evType, StateKey: stateKey, Sender: sender, Depth: f.depth,
		RoomVersion: "10", JSON: js}
}

func (f *fixture) write(w storage.RoomWrite, evs ...storage.RoomEvent) {
	f.t.Helper()
	if w.Create == nil {
		w.RoomID, w.Extremities = room, []string{f.last}
	}
	w.Events = evs
	if _, err := f.store.WriteRoomEvents(context.Background(), w); err != nil {
		f.t.Fatal(err)
	}
	f.last = evs[len(evs)-1].EventID
}

// send writes a message as the room server sends one: started on the
// room's head (a plain message may go PostgreSQL's batched way).
func (f *fixture) send(id, sender, content string, ts int64) {
	f.t.Helper()
	ctx := context.Background()
	r, err := f.store.Room(ctx, room)
	if err != nil {
		f.t.Fatal(err)
	}
	ev := f.event(id, sender, "m.room.message", nil, content, ts)
	wait := f.store.StartRoomWrite(ctx, storage.RoomWrite{RoomID: room, Extremities: r.Extremities, Head: r.Head,
		StateSnapshot: r.StateSnapshot, NewHead: storage.NewRoomHead(), Events: []storage.RoomEvent{ev}})
	if _, err := wait(); err != nil {
		f.t.Fatal(err)
	}
	f.last = id
}

// ingest stores an event of another server, placed after the last.
func (f *fixture) ingest(ev storage.RoomEvent) {
	f.t.Helper()
	r, err := f.store.Room(context.Background(), room)
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.store.IngestRoomEvents(context.Background(), storage.RoomIngest{RoomID: room, Event: &ev, StateAfter: f.last,
		Extremities: r.Extremities, NewExtremities: []string{ev.EventID}, CurrentAfterEvent: true}); err != nil {
		f.t.Fatal(err)
	}
	f.last = ev.EventID
}

func rel(relType, parent string) string {
	return `{"body":"x","m.relates_to":{"rel_type":"` + relType + `","event_id":"` + parent + `"}}`
}

func ids(evs []storage.RoomEvent) []string {
	out := []string{}
	for _, ev := range evs {
		out = append(out, ev.EventID)
	}
	return out
}

func all(parent string) storage.RelationsQuery {
	return storage.RelationsQuery{RoomID: room, ParentID: parent, After: math.MinInt64, UpTo: math.MaxInt64, Limit: 100, Depth: 1}
}

// Relations are recorded from every way an event is stored (a local
// chain, a plain message, another server's event, an encrypted event),
// read by parent, type and event type, page by page in both directions
// and down to a depth; a redacted relation and a rejected event do not
// count, and a relation declared badly is none.
func TestRelatedEvents(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		f, s := setup(t, db)
		f.write(storage.RoomWrite{}, f.event("$root", alice, "m.room.message", nil, `{"body":"root"}`, 10))
		f.send("$r1", alice, rel("m.thread", "$root"), 11)
		f.write(storage.RoomWrite{}, f.event("$r2", alice, "m.room.message", nil, rel("m.thread", "$root"), 12))
		f.ingest(f.event("$r3", bob, "m.room.encrypted", nil,
			`{"algorithm":"m.megolm.v1.aes-sha2","ciphertext":"AwgA","m.relates_to":{"rel_type":"m.thread","event_id":"$root"}}`, 13))
		f.send("$react", bob, `{"m.relates_to":{"rel_type":"m.annotation","event_id":"$r1","key":"+1"}}`, 14)
		f.send("$bad1", alice, `{"m.relates_to":{"rel_type":5,"event_id":"$root"}}`, 15)
		f.send("$bad2", alice, `{"m.relates_to":"$root"}`, 16)
		f.send("$reply", alice, `{"body":"r","m.relates_to":{"m.in_reply_to":{"event_id":"$root"}}}`, 17)
		rejected := f.event("$rejected", bob, "m.room.message", nil, rel("m.thread", "$root"), 18)
		rejected.Rejected = true
		if _, err := f.store.IngestRoomEvents(ctx, storage.RoomIngest{RoomID: room, Event: &rejected}); err != nil {
			t.Fatal(err)
		}
		// An outlier (an event of a join's auth chain, say) is not shown.
		if _, err := f.store.IngestRoomEvents(ctx, storage.RoomIngest{RoomID: room,
			Outliers: []storage.RoomEvent{f.event("$outlier", bob, "m.room.message", nil, rel("m.thread", "$root"), 19)}}); err != nil {
			t.Fatal(err)
		}

		check := func(what string, q storage.RelationsQuery, want ...string) []storage.RoomEvent {
			t.Helper()
			evs, err := s.RelatedEvents(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			if got := ids(evs); !slices.Equal(got, append([]string{}, want...)) {
				t.Errorf("%s: %v, want %v", what, got, want)
			}
			return evs
		}
		check("newest first", all("$root"), "$r3", "$r2", "$r1")
		q := all("$root")
		q.Forward = true
		check("oldest first", q, "$r1", "$r2", "$r3")
		q = all("$root")
		q.EventType = "m.room.encrypted"
		check("encrypted only", q, "$r3")
		q = all("$root")
		q.RelType = "m.annotation"
		check("annotations of the root", q)
		q.Depth = 3
		check("annotations down to depth 3", q, "$react")
		q = all("$root")
		q.Depth = 3
		check("everything down to depth 3", q, "$react", "$r3", "$r2", "$r1")
		// Pages: (After, UpTo].
		q = all("$root")
		q.Limit = 2
		page := check("first page", q, "$r3", "$r2")
		q.UpTo = page[1].Pos - 1
		check("second page", q, "$r1")
		q = all("$root")
		q.Forward, q.Limit, q.After = true, 1, page[1].Pos-1
		check("forward from the second", q, "$r2")

		// A redaction forgets the relation.
		f.write(storage.RoomWrite{Redactions: []storage.RoomRedaction{{EventID: "$r2", RoomID: room, JSON: []byte(`{"redacted":true}`)}}},
			f.event("$redaction", alice, "m.room.redaction", nil, `{"redacts":"$r2"}`, 20))
		check("after the redaction", all("$root"), "$r3", "$r1")
		// The redacted event arriving again does not bring it back.
		if _, err := f.store.IngestRoomEvents(ctx, storage.RoomIngest{RoomID: room,
			Outliers: []storage.RoomEvent{f.event("$r2", alice, "m.room.message", nil, rel("m.thread", "$root"), 12)}}); err != nil {
			t.Fatal(err)
		}
		check("after the redacted event came again", all("$root"), "$r3", "$r1")
	})
}

// Threads list the roots with replies, the most recently active first,
// a page at a time; participated keeps those whose root or a reply the
// user sent. Thread summaries count the replies, name the latest and the
// user's participation.
func TestThreadsAndAggregations(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		f, s := setup(t, db)
		f.send("$t1", alice, `{"body":"one"}`, 1)
		f.send("$t2", bob, `{"body":"two"}`, 2)
		f.send("$t3", bob, `{"body":"three"}`, 3)
		f.send("$a", bob, rel("m.thread", "$t1"), 4)
		f.send("$b", bob, rel("m.thread", "$t2"), 5)
		f.send("$c", bob, rel("m.thread", "$t1"), 6)
		f.send("$d", alice, rel("m.thread", "$t3"), 7)

		threads := func(q storage.ThreadsQuery, want ...string) []storage.Thread {
			t.Helper()
			q.RoomID = room
			if q.Before == 0 {
				q.Before = math.MaxInt64
			}
			if q.Limit == 0 {
				q.Limit = 10
			}
			got, err := s.Threads(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			var roots []string
			for _, th := range got {
				roots = append(roots, th.RootID)
			}
			if !slices.Equal(roots, want) {
				t.Errorf("threads %+v: %v, want %v", q, roots, want)
			}
			return got
		}
		threads(storage.ThreadsQuery{}, "$t3", "$t1", "$t2")
		first := threads(storage.ThreadsQuery{Limit: 2}, "$t3", "$t1")
		threads(storage.ThreadsQuery{Limit: 2, Before: first[1].Latest}, "$t2")
		// alice sent $t1's root and a reply in $t3; bob none of $t2's... but its root.
		threads(storage.ThreadsQuery{Participant: alice}, "$t3", "$t1")
		threads(storage.ThreadsQuery{Participant: bob}, "$t3", "$t1", "$t2")
		threads(storage.ThreadsQuery{Participant: "@carol:x"})

		// Edits: the latest valid one is bundled, whole.
		f.send("$e1", alice, `{"body":"* one","m.new_content":{"body":"one!"},"m.relates_to":{"rel_type":"m.replace","event_id":"$t1"}}`, 50)
		f.send("$e2", alice, `{"body":"* one","m.new_content":{"body":"one!!"},"m.relates_to":{"rel_type":"m.replace","event_id":"$t1"}}`, 60)
		f.send("$e0", alice, `{"body":"* one","m.new_content":{"body":"old"},"m.relates_to":{"rel_type":"m.replace","event_id":"$t1"}}`, 40)
		f.send("$forged", bob, `{"body":"* one","m.new_content":{"body":"bob's"},"m.relates_to":{"rel_type":"m.replace","event_id":"$t1"}}`, 99)
		// The latest reply of $t2 edited by its sender.
		f.send("$be", bob, `{"body":"* b","m.new_content":{"body":"b!"},"m.relates_to":{"rel_type":"m.replace","event_id":"$b"}}`, 70)
		f.send("$ref", bob, rel("m.reference", "$t2"), 71)
		f.send("$ref2", alice, rel("m.reference", "$t2"), 72)

		evs, err := f.store.RoomEventsByID(ctx, []string{"$t1", "$t2", "$t3", "$a", "$e1"})
		if err != nil {
			t.Fatal(err)
		}
		agg, err := s.Aggregations(ctx, alice, evs)
		if err != nil {
			t.Fatal(err)
		}
		th := agg["$t1"].Thread
		if th == nil || th.Count != 2 || th.Latest.EventID != "$c" || !th.Participated {
			t.Errorf("$t1's thread: %+v", th)
		}
		if e := agg["$t1"].Replace; e == nil || e.EventID != "$e2" {
			t.Errorf("$t1's edit: %+v", e)
		}
		if th := agg["$t2"].Thread; th == nil || th.Count != 1 || th.Latest.EventID != "$b" || th.Participated {
			t.Errorf("$t2's thread for alice: %+v", th)
		}
		if got := agg["$t2"].References; !slices.Equal(got, []string{"$ref", "$ref2"}) {
			t.Errorf("$t2's references: %v", got)
		}
		if e := agg["$b"].Replace; e == nil || e.EventID != "$be" {
			t.Errorf("the edit of $t2's latest reply: %+v", agg["$b"])
		}
		if th := agg["$t3"].Thread; th == nil || !th.Participated {
			t.Errorf("$t3's thread for alice: %+v", th)
		}
		// A reply in a thread has no thread of its own, an edit nothing.
		if a, ok := agg["$a"]; ok {
			t.Errorf("a reply in a thread has aggregations %+v", a)
		}
		if a, ok := agg["$e1"]; ok {
			t.Errorf("an edit has aggregations %+v", a)
		}

		// A redacted original has no edit bundled; its thread stays.
		f.write(storage.RoomWrite{Redactions: []storage.RoomRedaction{{EventID: "$t1", RoomID: room,
			JSON: []byte(`{"type":"m.room.message","sender":"` + alice + `","content":{},"unsigned":{"redacted_because":{"type":"m.room.redaction"}}}`)}}},
			f.event("$red", alice, "m.room.redaction", nil, `{"redacts":"$t1"}`, 80))
		evs, err = f.store.RoomEventsByID(ctx, []string{"$t1"})
		if err != nil {
			t.Fatal(err)
		}
		if agg, err = s.Aggregations(ctx, bob, evs); err != nil {
			t.Fatal(err)
		}
		if a := agg["$t1"]; a.Replace != nil || a.Thread == nil || a.Thread.Count != 2 || !a.Thread.Participated {
			t.Errorf("the redacted root for bob: %+v", a)
		}
	})
}
