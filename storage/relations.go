package storage

import (
	"bytes"
	"context"
	"encoding/json"
)

// Relations between events (content's m.relates_to: replies in threads,
// edits, reactions, references). The database records an event's relation
// in the transaction that stores the event, whoever sent it, and forgets
// it in the transaction that redacts the event (package relations).

// RelationOf reads the relation an event's JSON declares: the rel_type
// and event_id of its content's m.relates_to, both non-empty strings; ok
// is false for an event without one (a reply's m.in_reply_to alone is no
// relation). The relation is in the clear for encrypted events too.
func RelationOf(eventJSON []byte) (relType, parentID string, ok bool) {
	if !bytes.Contains(eventJSON, []byte(`m.relates_to`)) {
		return "", "", false
	}
	var ev struct {
		Content struct {
			RelatesTo json.RawMessage `json:"m.relates_to"`
		} `json:"content"`
	}
	if json.Unmarshal(eventJSON, &ev) != nil || len(ev.Content.RelatesTo) == 0 {
		return "", "", false
	}
	var rel map[string]json.RawMessage
	if json.Unmarshal(ev.Content.RelatesTo, &rel) != nil {
		return "", "", false
	}
	if json.Unmarshal(rel["rel_type"], &relType) != nil || json.Unmarshal(rel["event_id"], &parentID) != nil {
		return "", "", false
	}
	if relType == "" || parentID == "" {
		return "", "", false
	}
	return relType, parentID, true
}

// RelationsQuery asks for a page of the events of a room related to one
// of its events, ordered by stream position.
type RelationsQuery struct {
	RoomID, ParentID string
	// RelType and EventType, when not empty, keep only the events with
	// that relation type and event type.
	RelType, EventType string
	// Depth is how many relations away an event may be: 1 for direct
	// relations only.
	Depth int
	// The page: events with positions in (After, UpTo], the newest first
	// unless Forward; at most Limit.
	After, UpTo StreamPos
	Forward     bool
	Limit       int
}

// ThreadsQuery asks for a page of a room's threads, the most recently
// active first: those whose latest reply is below Before.
type ThreadsQuery struct {
	RoomID string
	// Participant, when set, keeps the threads that user took part in
	// (sent the root or a reply).
	Participant string
	Before      StreamPos
	Limit       int
}

// Thread is a thread of a room: its root and the position of its latest
// reply.
type Thread struct {
	RootID string
	Latest StreamPos
}

// ThreadSummary sums up a thread's replies: how many, the latest, and
// whether a user sent one of them.
type ThreadSummary struct {
	Count        int
	Latest       RoomEvent
	Participated bool
}

// RelatedEvent is an event with its relation to another.
type RelatedEvent struct {
	ParentID, RelType string
	Event             RoomEvent
}

// Relations are the recorded relations between a room's events. Events
// are those clients may be shown: placed in the room (not outliers),
// neither rejected nor soft-failed.
type Relations interface {
	// RelatedEvents returns a page of the events related to a parent
	// (RelationsQuery).
	RelatedEvents(ctx context.Context, q RelationsQuery) ([]RoomEvent, error)
	// Threads returns a page of a room's threads (ThreadsQuery).
	Threads(ctx context.Context, q ThreadsQuery) ([]Thread, error)
	// ThreadSummaries sums up the threads of the roots named (those with
	// replies), participation for userID.
	ThreadSummaries(ctx context.Context, roomID string, roots []string, userID string) (map[string]ThreadSummary, error)
	// RelationTypes returns, of the parents named, those with recorded
	// relations and their types (shown or not): what may be worth reading.
	RelationTypes(ctx context.Context, roomID string, parents []string) (map[string][]string, error)
	// RelatedByType returns the events of the types named related to the
	// parents named, oldest first.
	RelatedByType(ctx context.Context, roomID string, parents, relTypes []string) ([]RelatedEvent, error)
}

// Aggregations are the relations bundled with an event for a user
// (unsigned m.relations): its thread, its edit, the events referring to it.
type Aggregations struct {
	Thread     *ThreadSummary
	Replace    *RoomEvent
	References []string
}
