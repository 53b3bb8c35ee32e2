package storage

import "context"

// SearchIndex is the full-text index of room events for POST /search:
// the body of m.room.message events, the name of m.room.name and the
// topic of m.room.topic events. Events are indexed in the order they
// were stored, up to a position the index keeps (IndexRoomEvents), so
// history stored before the index existed is searchable too.
type SearchIndex interface {
	// IndexRoomEvents indexes up to limit room events stored since the
	// index's position and moves it on; it returns how many were looked
	// at (0: the index is current).
	IndexRoomEvents(ctx context.Context, limit int) (int, error)
	// SearchRoomEvents returns the indexed events that match q, newest
	// first or by rank (q.ByRank), and how many match in all.
	SearchRoomEvents(ctx context.Context, q SearchQuery) ([]SearchHit, int, error)
}

// The keys of an event's content that are indexed.
const (
	SearchKeyBody  = "content.body"
	SearchKeyName  = "content.name"
	SearchKeyTopic = "content.topic"
)

// SearchQuery is a search of room events.
type SearchQuery struct {
	// Words are the search term's words, each matched as a prefix; an
	// event matches when it has them all.
	Words []string
	// Rooms, Keys: where to look (none: nothing matches).
	Rooms []string
	Keys  []string
	// Senders and Types keep only events of these (none: all);
	// NotSenders and NotTypes leave those out.
	Senders, NotSenders, Types, NotTypes []string
	// ByRank orders by relevance (Offset pages on), otherwise newest
	// first (Before pages on: only events before that stream position;
	// 0: from the newest).
	ByRank bool
	Offset int
	Before StreamPos
	Limit  int
}

// SearchHit is one matching event.
type SearchHit struct {
	EventID string
	RoomID  string
	Sender  string
	Pos     StreamPos
	// Rank is the event's relevance to the words (higher is better).
	Rank float64
}
