package sqlstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// Benchmarks of the storage hot paths, on both databases:
//
//	go test ./storage/sqlstore -run '^$' -bench . (with KEYSERVER_TEST_POSTGRES for PostgreSQL)

func forEachDatabaseB(b *testing.B, f func(b *testing.B, s *sqlstore.Store)) {
	for _, name := range []string{"sqlite3", "postgres"} {
		b.Run(name, func(b *testing.B) {
			db := testutil.SQLite(b)
			if name == "postgres" {
				db = testutil.Postgres(b)
			}
			s, err := sqlstore.Open(context.Background(), db.URI, "bench.test")
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			f(b, s)
		})
	}
}

// seed makes users with devices that have keys and one-time keys.
func seed(b *testing.B, s *sqlstore.Store, users, devices, otks int) []string {
	ctx := context.Background()
	var ids []string
	for u := 0; u < users; u++ {
		user := fmt.Sprintf("@u%d:bench.test", u)
		ids = append(ids, user)
		if _, err := s.CreateAccount(ctx, user, "x", nil); err != nil {
			b.Fatal(err)
		}
		for d := 0; d < devices; d++ {
			dev := fmt.Sprintf("D%d", d)
			if _, err := s.Login(ctx, storage.NewLogin{UserID: user, DeviceID: dev, TokenHash: user + dev}); err != nil {
				b.Fatal(err)
			}
			var keys []storage.Key
			for k := 0; k < otks; k++ {
				keys = append(keys, storage.Key{Algorithm: "signed_curve25519", KeyID: fmt.Sprintf("K%d", k), JSON: []byte(`{"key":"x"}`)})
			}
			if _, err := s.UploadKeys(ctx, user, dev, nil, func(storage.KeyState) (storage.KeyWrite, error) {
				return storage.KeyWrite{DeviceKeys: []byte(`{"device_id":"` + dev + `"}`), OneTimeKeys: keys}, nil
			}); err != nil {
				b.Fatal(err)
			}
		}
	}
	return ids
}

func BenchmarkDevicesWithKeys20Users(b *testing.B) {
	forEachDatabaseB(b, func(b *testing.B, s *sqlstore.Store) {
		users := seed(b, s, 40, 2, 0)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, err := s.DevicesWithKeys(context.Background(), users[i%20:i%20+20]); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkTokenOwner(b *testing.B) {
	forEachDatabaseB(b, func(b *testing.B, s *sqlstore.Store) {
		users := seed(b, s, 10, 1, 0)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if _, _, err := s.TokenOwner(context.Background(), users[i%10]+"D0"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkClaimKeys(b *testing.B) {
	forEachDatabaseB(b, func(b *testing.B, s *sqlstore.Store) {
		users := seed(b, s, 20, 1, 500)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			req := []storage.ClaimRequest{{UserID: users[i%20], DeviceID: "D0", Algorithm: "signed_curve25519"}}
			if _, err := s.ClaimKeys(context.Background(), req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// Claims from 16 clients at once, spread over 200 devices, as the claim
// phase of keyserver-bench sends them. The CPU time per claim is reported
// with the wall time, since waiting claims cost none.
func BenchmarkClaimKeysConcurrent(b *testing.B) {
	forEachDatabaseB(b, func(b *testing.B, s *sqlstore.Store) {
		users := seed(b, s, 200, 1, 100)
		var next atomic.Int64
		b.SetParallelism(8) // 16 goroutines on 2 cores
		b.ResetTimer()
		defer testutil.ReportCPUPerOp(b)()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				i := next.Add(1)
				req := []storage.ClaimRequest{{UserID: users[(i*7919)%200], DeviceID: "D0", Algorithm: "signed_curve25519"}}
				if _, err := s.ClaimKeys(context.Background(), req); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

func BenchmarkUploadFiveKeys(b *testing.B) {
	forEachDatabaseB(b, func(b *testing.B, s *sqlstore.Store) {
		users := seed(b, s, 1, 1, 0)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			var keys []storage.Key
			ids := make([]string, 5)
			for k := 0; k < 5; k++ {
				keys = append(keys, storage.Key{Algorithm: "signed_curve25519", KeyID: fmt.Sprintf("N%d_%d", i, k), JSON: []byte(`{"key":"x"}`)})
				ids[k] = keys[k].FullID()
			}
			if _, err := s.UploadKeys(context.Background(), users[0], "D0", ids, func(storage.KeyState) (storage.KeyWrite, error) {
				return storage.KeyWrite{OneTimeKeys: keys}, nil
			}); err != nil {
				b.Fatal(err)
			}
			if i%90 == 89 { // stay below any cap a caller would apply
				if _, _, err := s.DeleteDevices(context.Background(), users[0], []string{"D0"}); err != nil {
					b.Fatal(err)
				}
				if _, err := s.Login(context.Background(), storage.NewLogin{UserID: users[0], DeviceID: "D0", TokenHash: fmt.Sprint(i)}); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

// Room messages from 16 clients at once, each to a room of its own, as
// roomserver writes them (built on the room's head, with the client's
// transaction, queued for federation): the storage part of the room-send
// phase of keyserver-bench. The CPU time per message is reported with the
// wall time.
func BenchmarkRoomMessagesConcurrent(b *testing.B) {
	forEachDatabaseB(b, func(b *testing.B, s *sqlstore.Store) {
		ctx := context.Background()
		type room struct {
			id, sender, prev string
			head, snapshot   int64
			depth            int64
		}
		rooms := make(chan *room, 16)
		for r := 0; r < 16; r++ {
			sender := fmt.Sprintf("@u%d:bench.test", r)
			if _, err := s.CreateAccount(ctx, sender, "x", nil); err != nil {
				b.Fatal(err)
			}
			id, empty := fmt.Sprintf("!r%d:bench.test", r), ""
			ev := func(eventID, evType string, stateKey *string, membership string, depth int64) storage.RoomEvent {
				return storage.RoomEvent{EventID: eventID, RoomID: id, Type: evType, StateKey: stateKey, Sender: sender,
					Depth: depth, RoomVersion: "10", JSON: []byte(`{"type":"` + evType + `"}`), Membership: membership}
			}
			res, err := s.WriteRoomEvents(ctx, storage.RoomWrite{Create: &storage.Room{RoomID: id, RoomVersion: "10", Creator: sender},
				RoomID: id, Events: []storage.RoomEvent{ev("$c"+id, "m.room.create", &empty, "", 1), ev("$j"+id, "m.room.member", &sender, "join", 2)}})
			if err != nil {
				b.Fatal(err)
			}
			rooms <- &room{id: id, sender: sender, prev: "$j" + id, head: res.Head, snapshot: res.StateSnapshot, depth: 2}
		}
		// A message's JSON as a client's is stored: ~700 bytes.
		body := strings.Repeat("x", 500)
		var n atomic.Int64
		b.SetParallelism(8) // 16 goroutines on 2 cores
		b.ResetTimer()
		defer testutil.ReportCPUPerOp(b)()
		b.RunParallel(func(pb *testing.PB) {
			r := <-rooms
			for pb.Next() {
				i := n.Add(1)
				r.depth++
				eventID := fmt.Sprintf("$m%d", i)
				w := storage.RoomWrite{RoomID: r.id, Extremities: []string{r.prev}, Head: r.head, StateSnapshot: r.snapshot,
					NewHead: storage.NewRoomHead(), Federate: true, Now: time.Now().UnixMilli(),
					Txn: &storage.RoomTxn{UserID: r.sender, DeviceID: "D0", Path: fmt.Sprintf("/send/m.room.message/%d", i)},
					Events: []storage.RoomEvent{{EventID: eventID, RoomID: r.id, Type: "m.room.message", Sender: r.sender,
						Depth: r.depth, RoomVersion: "10", JSON: []byte(`{"type":"m.room.message","content":{"body":"` + body + `"}}`)}}}
				if _, err := s.StartRoomWrite(ctx, w)(); err != nil {
					b.Error(err)
					return
				}
				r.prev, r.head = eventID, w.NewHead
			}
		})
	})
}

// Storing the state of a 2,000-member room of another server, as joining
// it over federation does (its events, then its current state, the
// members' memberships and their tracking), with one local member. Each
// operation is a room of its own; the statements per room are reported.
func BenchmarkIngestLargeRoomState(b *testing.B) {
	const members = 2000
	forEachDatabaseB(b, func(b *testing.B, s *sqlstore.Store) {
		ctx := context.Background()
		var statements int64
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			roomID, empty, me := fmt.Sprintf("!big%d:remote.example", i), "", "@me:bench.test"
			ev := func(eventID, evType string, stateKey *string, membership string) storage.RoomEvent {
				return storage.RoomEvent{EventID: eventID, RoomID: roomID, Type: evType, StateKey: stateKey, Sender: "@c:remote.example",
					Depth: 2, RoomVersion: "10", JSON: []byte(`{"content":{"membership":"` + membership + `"}}`), Membership: membership}
			}
			events := []storage.RoomEvent{ev("$c"+roomID, "m.room.create", &empty, "")}
			for m := range members {
				u := fmt.Sprintf("@u%d.%d:s%d.example", i, m, m%50)
				events = append(events, ev(fmt.Sprintf("$m%d%s", m, roomID), "m.room.member", &u, "join"))
			}
			events = append(events, ev("$me"+roomID, "m.room.member", &me, "join"))
			ids := make([]string, len(events))
			for j, e := range events {
				ids[j] = e.EventID
			}
			before := s.StatementsSent()
			b.StartTimer()
			if _, err := s.IngestRoomEvents(ctx, storage.RoomIngest{RoomID: roomID,
				Create: &storage.Room{RoomVersion: "10", Creator: "@c:remote.example"}, Outliers: events, PutState: ids, Now: 1}); err != nil {
				b.Fatal(err)
			}
			statements += s.StatementsSent() - before
		}
		b.ReportMetric(float64(statements)/float64(b.N), "statements/op")
	})
}
