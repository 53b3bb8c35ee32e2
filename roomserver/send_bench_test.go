package roomserver_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// Messages sent by 16 clients at once, each to a room of its own with 50
// members: what a message costs the daemon below HTTP (building, signing
// and authorising the event, and its write), per message, with the CPU
// time of the process (PostgreSQL's not included), on both databases:
//
//	go test ./roomserver -run '^$' -bench Send (with KEYSERVER_TEST_POSTGRES for PostgreSQL)
func BenchmarkSendConcurrent(b *testing.B) {
	for _, name := range []string{"sqlite3", "postgres"} {
		b.Run(name, func(b *testing.B) {
			db := testutil.SQLite(b)
			if name == "postgres" {
				db = testutil.Postgres(b)
			}
			benchmarkSend(b, db)
		})
	}
}

func benchmarkSend(b *testing.B, db testutil.Database) {
	ctx := context.Background()
	store, err := sqlstore.Open(ctx, db.URI, "test.local")
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	log := logrus.New()
	log.SetOutput(io.Discard)
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	rooms := roomserver.New(store, roomserver.Options{ServerName: "test.local", KeyID: "ed25519:test", PrivateKey: key, Logger: log})
	const members = 50
	var users []string
	for u := 0; u < members; u++ {
		user := fmt.Sprintf("@u%d:test.local", u)
		if _, err := store.CreateAccount(ctx, user, "x", nil); err != nil {
			b.Fatal(err)
		}
		users = append(users, user)
	}
	ids := make(chan string, 16)
	for r := 0; r < 16; r++ {
		id, err := rooms.CreateRoom(ctx, users[r], roomserver.CreateRoomRequest{Preset: "public_chat"})
		if err != nil {
			b.Fatal(err)
		}
		for _, u := range users {
			if u == users[r] {
				continue
			}
			if _, err := rooms.Join(ctx, u, id, nil, nil); err != nil {
				b.Fatal(err)
			}
		}
		ids <- id
	}
	// The collector's target the daemon runs with (cmd/keyserver), unless
	// GOGC says otherwise.
	if os.Getenv("GOGC") == "" {
		defer debug.SetGCPercent(debug.SetGCPercent(400))
	}
	content := json.RawMessage(`{"msgtype":"m.text","body":"` + strings.Repeat("x", 200) + `"}`)
	var n atomic.Int64
	b.SetParallelism(8) // 16 goroutines on 2 cores
	b.ReportAllocs()
	b.ResetTimer()
	defer testutil.ReportCPUPerOp(b)()
	b.RunParallel(func(pb *testing.PB) {
		id := <-ids
		for pb.Next() {
			i := n.Add(1)
			if _, err := rooms.Send(ctx, users[i%members], "D", id, "m.room.message", fmt.Sprint(i), content); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
