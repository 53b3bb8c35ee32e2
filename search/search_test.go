package search_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/search"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

func TestWords(t *testing.T) {
	for in, want := range map[string][]string{
		"Hello, World!":        {"hello", "world"},
		`fox* OR "dog" -cat`:   {"fox", "or", "dog", "cat"},
		"naïve café café":      {"naïve", "café"},
		"  ":                   nil,
		"snake_case and 42":    {"snake_case", "and", "42"},
		`'); DROP TABLE x; --`: {"drop", "table", "x"},
	} {
		if got := search.Words(in); !slices.Equal(got, want) {
			t.Errorf("Words(%q) = %q, want %q", in, got, want)
		}
	}
}

// member sees every event of its rooms, in a fixed client form.
type member struct{ joined []string }

func (m member) JoinedRooms(context.Context, string) ([]string, error) { return m.joined, nil }
func (m member) VisibleEvent(_ context.Context, _, _, eventID string) (json.RawMessage, error) {
	return json.Marshal(map[string]any{"event_id": eventID, "content": map[string]any{"body": "message"}})
}
func (m member) EventContext(context.Context, string, string, string, int, int) (search.EventContext, error) {
	return search.EventContext{}, nil
}

// Events stored before the index existed, or since the last search, are
// indexed when a search needs them, in batches, once each.
func TestSearchIndexesStoredHistory(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		store, err := sqlstore.Open(ctx, db.URI, "local.test")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		const alice = "@alice:local.test"
		log := logrus.New()
		log.SetOutput(io.Discard)
		_, key, _ := ed25519.GenerateKey(rand.Reader)
		rooms := roomserver.New(store, roomserver.Options{ServerName: "local.test", KeyID: "ed25519:k", PrivateKey: key, Logger: log})
		room, err := rooms.CreateRoom(ctx, alice, roomserver.CreateRoomRequest{})
		if err != nil {
			t.Fatal(err)
		}
		const n = 1100 // more than one batch of the index
		for i := 0; i < n; i++ {
			if _, err := rooms.Send(ctx, alice, "D", room, "m.room.message", fmt.Sprint("t", i),
				json.RawMessage(fmt.Sprintf(`{"msgtype":"m.text","body":"message number %d"}`, i))); err != nil {
				t.Fatal(err)
			}
		}
		svc := search.New(store, member{joined: []string{room}})
		term := "message"
		var q search.Request
		q.SearchCategories.RoomEvents = &search.RoomEventsCriteria{SearchTerm: &term, OrderBy: "recent"}
		res, err := svc.Search(ctx, alice, q, "")
		if err != nil {
			t.Fatal(err)
		}
		re := res.SearchCategories.RoomEvents
		if re.Count != n || len(re.Results) != 10 || re.NextBatch == "" {
			t.Fatalf("count %d, %d results, next %q", re.Count, len(re.Results), re.NextBatch)
		}
		if looked, err := store.IndexRoomEvents(ctx, 10); err != nil || looked != 0 {
			t.Fatalf("the index after the search is behind by %d (%v)", looked, err)
		}
		// A later search indexes only what came since.
		if _, err := rooms.Send(ctx, alice, "D", room, "m.room.message", "late", json.RawMessage(`{"msgtype":"m.text","body":"message late"}`)); err != nil {
			t.Fatal(err)
		}
		if res, err = svc.Search(ctx, alice, q, ""); err != nil || res.SearchCategories.RoomEvents.Count != n+1 {
			t.Fatalf("after one more message: %+v, %v", res.SearchCategories.RoomEvents, err)
		}
	})
}
