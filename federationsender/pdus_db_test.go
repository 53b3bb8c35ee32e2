package federationsender

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/keyserver/keyserver/crosssigning"
	"github.com/keyserver/keyserver/internal/clock"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/internal/workertest"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// pduRoom is a room in a store written as the room server writes it:
// alice of local.test created it and bob of remote.test is a member.
type pduRoom struct {
	t    *testing.T
	db   *sqlstore.Store
	last string
	n    int64
}

func pduJSONOf(id string) string { return `{"event_id":"` + id + `"}` }

func newPDURoom(t *testing.T, db *sqlstore.Store) *pduRoom {
	r := &pduRoom{t: t, db: db}
	empty, alice, bob := "", "@alice:local.test", "@bob:remote.test"
	r.write(false, &storage.Room{RoomID: "!r:local.test", RoomVersion: "10", Creator: alice},
		r.event("$create", "m.room.create", &empty, ""), r.event("$alice", "m.room.member", &alice, "join"))
	// bob's join, as it will come from his server: not sent back there.
	r.write(false, nil, r.event("$bob", "m.room.member", &bob, "join"))
	return r
}

func (r *pduRoom) event(id, evType string, stateKey *string, membership string) storage.RoomEvent {
	r.n++
	return storage.RoomEvent{EventID: id, RoomID: "!r:local.test", Type: evType, StateKey: stateKey, Sender: "@alice:local.test",
		Depth: r.n, RoomVersion: "10", JSON: []byte(pduJSONOf(id)), Membership: membership}
}

func (r *pduRoom) write(federate bool, create *storage.Room, evs ...storage.RoomEvent) {
	r.t.Helper()
	w := storage.RoomWrite{Create: create, RoomID: "!r:local.test", Events: evs, Federate: federate}
	if create == nil {
		w.Extremities = []string{r.last}
	}
	res, err := r.db.WriteRoomEvents(context.Background(), w)
	if err != nil {
		r.t.Fatal(err)
	}
	if res.PDUsQueued != federate {
		r.t.Fatalf("PDUs queued: %v, federated write: %v", res.PDUsQueued, federate)
	}
	r.last = evs[len(evs)-1].EventID
}

// messages writes n messages of alice, federated, and returns their IDs.
func (r *pduRoom) messages(prefix string, n int) []string {
	var ids []string
	var evs []storage.RoomEvent
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("$%s%d", prefix, i)
		ids = append(ids, id)
		evs = append(evs, r.event(id, "m.room.message", nil, ""))
	}
	r.write(true, nil, evs...)
	return ids
}

// deliveredPDUs lists the event IDs delivered, in order, checking each
// PDU is the stored JSON.
func (p *recordingTransport) deliveredPDUs(t *testing.T) []string {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []string
	for _, txn := range p.txns {
		for _, raw := range txn.PDUs {
			var id string
			if _, err := fmt.Sscanf(string(raw), `{"event_id":%q}`, &id); err != nil || string(raw) != pduJSONOf(id) {
				t.Fatalf("PDU %s is not the stored event", raw)
			}
			ids = append(ids, id)
		}
	}
	return ids
}

// Our room events go to the room's other servers in the transactions of
// the device-list updates: at most 50 PDUs, oldest first, beside at most
// 100 EDUs; a failed transaction is retried whole under its ID; each PDU
// is delivered once and leaves the queue.
func TestSenderDeliversPDUsWithEDUs(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, tdb testdb.Database) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		db := workertest.Open(t, tdb)
		alice := "@alice:local.test"
		if _, err := db.CreateAccount(ctx, alice, "x", nil); err != nil {
			t.Fatal(err)
		}
		room := newPDURoom(t, db)
		// bob shares the room: 105 device changes of alice go to his
		// server, and 120 events.
		for i := 0; i < 105; i++ {
			device := fmt.Sprintf("D%d", i)
			if _, err := db.Login(ctx, storage.NewLogin{UserID: alice, DeviceID: device, TokenHash: device}); err != nil {
				t.Fatal(err)
			}
		}
		sent := room.messages("m", 120)

		clk := clock.NewFake()
		tr := &recordingTransport{only: "remote.test", fail: true}
		s := New(db, tr, Options{FormatUpdate: crosssigning.UpdateEDU, ServerName: "local.test", Clock: clk, MinRetry: time.Minute, MaxRetry: time.Hour, RecentRetry: 2 * time.Minute, Maintain: time.Hour,
			Sweep: time.Hour, Jitter: workertest.NoJitter, Logger: workertest.Quiet(), PDUs: db})
		done := make(chan struct{})
		go func() { defer close(done); s.Run(ctx) }()
		defer func() { cancel(); <-done }()
		start := clk.Now()
		workertest.WaitUntil(t, "the first attempt", func() bool { a, _ := tr.counts(); return a == 1 })
		workertest.WaitUntil(t, "the wait for the retry", func() bool { return clk.WaitsUntil(start.Add(time.Minute)) })
		clk.Advance(time.Minute)
		workertest.WaitUntil(t, "the second attempt", func() bool { a, _ := tr.counts(); return a == 2 })
		tr.setFail(false)
		s.DestinationAlive("remote.test")
		workertest.WaitUntil(t, "the queue to empty", func() bool {
			p, _ := db.PDUDestinations(ctx)
			u, _ := db.PendingDestinations(ctx)
			return len(p) == 0 && len(u) == 0 && s.Busy() == 0
		})

		tr.mu.Lock()
		ids, txns := slices.Clone(tr.ids), slices.Clone(tr.txns)
		tr.mu.Unlock()
		if len(ids) != 5 || ids[0] != ids[1] || ids[1] != ids[2] || ids[2] == ids[3] || ids[3] == ids[4] {
			t.Fatalf("transaction IDs %v: want the failed one retried whole, then a new ID per transaction", ids)
		}
		var shape [][2]int
		for _, txn := range txns {
			shape = append(shape, [2]int{len(txn.PDUs), len(txn.EDUs)})
			if txn.Origin != "local.test" {
				t.Fatalf("origin %q", txn.Origin)
			}
		}
		if want := [][2]int{{50, 100}, {50, 5}, {20, 0}}; !slices.Equal(shape, want) {
			t.Fatalf("transactions of (PDUs, EDUs) %v, want %v", shape, want)
		}
		if got := tr.deliveredPDUs(t); !slices.Equal(got, sent) {
			t.Fatalf("PDUs delivered %v\nwant %v", got, sent)
		}
	})
}

// The PDU queue is in the database: what a sender could not deliver
// before it stopped, the next one on the same database sends, though no
// EDU waits for the destination and nothing pokes it.
func TestSenderPDUsSurviveRestart(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, tdb testdb.Database) {
		ctx := context.Background()
		db := workertest.Open(t, tdb)
		room := newPDURoom(t, db)
		sent := room.messages("m", 3)
		bob := "@bob:remote.test"
		// bob leaves: his server is sent the leave, and then nothing.
		sent = append(sent, "$leave")
		room.write(true, nil, room.event("$leave", "m.room.member", &bob, "leave"))
		room.write(false, nil, room.event("$after", "m.room.message", nil, ""))

		clk := clock.NewFake()
		down := &recordingTransport{only: "remote.test", fail: true}
		first := New(db, down, Options{FormatUpdate: crosssigning.UpdateEDU, ServerName: "local.test", Clock: clk, MinRetry: time.Minute,
			Sweep: time.Hour, Jitter: workertest.NoJitter, Logger: workertest.Quiet(), PDUs: db})
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); first.Run(runCtx) }()
		workertest.WaitUntil(t, "a failed attempt", func() bool { a, _ := down.counts(); return a == 1 })
		stop()
		<-done

		up := &recordingTransport{only: "remote.test"}
		second := New(db, up, Options{FormatUpdate: crosssigning.UpdateEDU, ServerName: "local.test", Clock: clk, Sweep: time.Hour,
			Jitter: workertest.NoJitter, Logger: workertest.Quiet(), PDUs: db})
		runCtx, stop = context.WithCancel(ctx)
		done = make(chan struct{})
		go func() { defer close(done); second.Run(runCtx) }()
		defer func() { stop(); <-done }()
		workertest.WaitUntil(t, "delivery after the restart", func() bool {
			p, _ := db.PDUDestinations(ctx)
			_, d := up.counts()
			return d == 1 && len(p) == 0
		})
		if got := up.deliveredPDUs(t); !slices.Equal(got, sent) {
			t.Fatalf("PDUs delivered after the restart %v, want %v", got, sent)
		}
	})
}
