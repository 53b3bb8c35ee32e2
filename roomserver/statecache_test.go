package roomserver_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"io"
	"sync/atomic"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// countingStore counts the reads of state snapshots.
type countingStore struct {
	*sqlstore.Store
	snapshotReads atomic.Int64
}

func (c *countingStore) RoomSnapshotEvents(ctx context.Context, snapshot int64, keys []storage.StateKey) ([]storage.RoomEvent, error) {
	c.snapshotReads.Add(1)
	return c.Store.RoomSnapshotEvents(ctx, snapshot, keys)
}

// What was read of a room's state to build events stays at hand when the
// daemon changes the state: after a join, the members who sent before
// and the one who joined send without reading the state again.
func TestStateReadCarriedOverStateChanges(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		store, err := sqlstore.Open(ctx, db.URI, "test.local")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		for _, u := range []string{"@alice:test.local", "@bob:test.local"} {
			if _, err := store.CreateAccount(ctx, u, "x", nil); err != nil {
				t.Fatal(err)
			}
		}
		counting := &countingStore{Store: store}
		log := logrus.New()
		log.SetOutput(io.Discard)
		_, key, _ := ed25519.GenerateKey(rand.Reader)
		rooms := roomserver.New(counting, roomserver.Options{ServerName: "test.local", KeyID: "ed25519:test", PrivateKey: key, Logger: log})
		roomID, err := rooms.CreateRoom(ctx, "@alice:test.local", roomserver.CreateRoomRequest{Preset: "public_chat"})
		if err != nil {
			t.Fatal(err)
		}
		send := func(user, txn string) {
			t.Helper()
			if _, err := rooms.Send(ctx, user, "D", roomID, "m.room.message", txn, json.RawMessage(`{"body":"hi"}`)); err != nil {
				t.Fatal(err)
			}
		}
		send("@alice:test.local", "1")
		if _, err := rooms.Join(ctx, "@bob:test.local", roomID, nil, nil); err != nil {
			t.Fatal(err)
		}
		before := counting.snapshotReads.Load()
		if before == 0 {
			t.Fatal("the room's state was never read") // the count would prove nothing
		}
		send("@alice:test.local", "2")
		send("@bob:test.local", "3")
		if n := counting.snapshotReads.Load() - before; n != 0 {
			t.Fatalf("sending after a join read the room's state %d times", n)
		}
	})
}
