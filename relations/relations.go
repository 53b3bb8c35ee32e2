// Package relations is the relations between a room's events: threads,
// edits (m.replace), references and annotations (reactions), declared by
// an event's content m.relates_to, which stays in the clear when the
// event is encrypted. It reads the relations the database recorded and
// applies the rules of the bundled aggregations (unsigned m.relations)
// that the room server adds to the events it shows a user.
//
// # Storage (package sqlstore, migration 29)
//
// event_relations has a row per event that declares a relation (its rel_type
// and the event it relates to), written in the transaction that stores the
// event, for the events of this server and those of other servers alike,
// and deleted in the one that redacts it: a redacted relation stops
// counting. Events stored before migration 29 have no row.
//
// # Bundled aggregations (the client-server specification, v1.7 and later)
//
//   - m.thread, for an event that is not itself in a thread: the number of
//     replies (events with an m.thread relation to it), the latest one, and
//     whether the user sent the root or one of the replies.
//   - m.replace: the most recent valid edit, the whole event: an event of
//     the same sender and the same type, neither a state event, the most
//     recent by origin_server_ts and then by the greater event ID; none for
//     a redacted event. The original's content is served as it is.
//   - m.reference: the IDs of the events referring to it, oldest first.
//
// State events get none, nor do edits and annotations. The events counted
// are those shown to clients (placed in the room, neither rejected nor
// soft-failed), as Synapse counts them: history visibility is not applied
// to the counts.
package relations

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"

	"github.com/keyserver/keyserver/storage"
)

// The relation types the specification names.
const (
	Thread     = "m.thread"
	Replace    = "m.replace"
	Reference  = "m.reference"
	Annotation = "m.annotation"
)

// Store is what relations read of the database.
type Store interface {
	storage.Relations
}

// Service reads relations and bundles their aggregations.
type Service struct {
	db Store
}

// New makes a Service.
func New(db Store) *Service { return &Service{db: db} }

// RelatedEvents returns a page of the events related to an event
// (storage.RelationsQuery).
func (s *Service) RelatedEvents(ctx context.Context, q storage.RelationsQuery) ([]storage.RoomEvent, error) {
	return s.db.RelatedEvents(ctx, q)
}

// Threads returns a page of a room's threads, the most recently active
// first.
func (s *Service) Threads(ctx context.Context, q storage.ThreadsQuery) ([]storage.Thread, error) {
	return s.db.Threads(ctx, q)
}

// Aggregations returns the aggregations bundled with the events of one
// room shown to userID, by event ID; an event with none has no entry. The
// latest reply of each thread summed up has an entry of its own when it
// was edited.
func (s *Service) Aggregations(ctx context.Context, userID string, evs []storage.RoomEvent) (map[string]storage.Aggregations, error) {
	out := map[string]storage.Aggregations{}
	byRoom := map[string][]storage.RoomEvent{}
	var rooms []string
	for _, ev := range evs {
		if ev.StateKey != nil {
			continue
		}
		if relType, _, ok := storage.RelationOf(ev.JSON); ok && (relType == Replace || relType == Annotation) {
			continue
		}
		if _, ok := byRoom[ev.RoomID]; !ok {
			rooms = append(rooms, ev.RoomID)
		}
		byRoom[ev.RoomID] = append(byRoom[ev.RoomID], ev)
	}
	for _, roomID := range rooms {
		if err := s.roomAggregations(ctx, userID, roomID, byRoom[roomID], out); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// roomAggregations adds the aggregations of one room's events to out.
func (s *Service) roomAggregations(ctx context.Context, userID, roomID string, evs []storage.RoomEvent, out map[string]storage.Aggregations) error {
	byID := map[string]storage.RoomEvent{}
	asked := map[string]bool{}
	var ids []string
	for _, ev := range evs {
		if asked[ev.EventID] {
			continue
		}
		byID[ev.EventID], asked[ev.EventID] = ev, true
		ids = append(ids, ev.EventID)
	}
	// Most events have no relations: one look at the table says which
	// have, and of what types.
	types, err := s.db.RelationTypes(ctx, roomID, ids)
	if err != nil || len(types) == 0 {
		return err
	}
	var roots, editable []string
	for _, id := range ids {
		for _, t := range types[id] {
			switch t {
			case Thread:
				if relType, _, ok := storage.RelationOf(byID[id].JSON); !ok || relType != Thread {
					roots = append(roots, id)
				}
			case Replace, Reference:
				editable = append(editable, id)
			}
		}
	}
	editable = slices.Compact(editable)
	threads := map[string]storage.ThreadSummary{}
	if len(roots) > 0 {
		if threads, err = s.db.ThreadSummaries(ctx, roomID, roots, userID); err != nil {
			return err
		}
	}
	// The latest replies' edits are bundled with them.
	for _, sum := range threads {
		if _, ok := byID[sum.Latest.EventID]; !ok && sum.Latest.EventID != "" {
			byID[sum.Latest.EventID] = sum.Latest
			editable = append(editable, sum.Latest.EventID)
		}
	}
	var related []storage.RelatedEvent
	if len(editable) > 0 {
		if related, err = s.db.RelatedByType(ctx, roomID, editable, []string{Replace, Reference}); err != nil {
			return err
		}
	}
	for root, sum := range threads {
		sum.Participated = sum.Participated || byID[root].Sender == userID
		a := out[root]
		a.Thread = &sum
		out[root] = a
	}
	for _, rel := range related {
		parent, ok := byID[rel.ParentID]
		if !ok {
			continue
		}
		switch rel.RelType {
		case Reference:
			if !asked[rel.ParentID] {
				continue // a latest reply: only its edit is bundled
			}
			a := out[rel.ParentID]
			a.References = append(a.References, rel.Event.EventID)
			out[rel.ParentID] = a
		case Replace:
			if !validEdit(parent, rel.Event) {
				continue
			}
			a := out[rel.ParentID]
			if a.Replace == nil || newerEdit(rel.Event, *a.Replace) {
				edit := rel.Event
				a.Replace = &edit
			}
			out[rel.ParentID] = a
		}
	}
	return nil
}

// validEdit says whether edit may replace original: the same sender and
// type, neither a state event, the original not redacted.
func validEdit(original, edit storage.RoomEvent) bool {
	return original.Sender == edit.Sender && original.Type == edit.Type && original.StateKey == nil && edit.StateKey == nil &&
		!Redacted(original.JSON)
}

// newerEdit says whether a is more recent than b: by origin_server_ts,
// then by the greater event ID.
func newerEdit(a, b storage.RoomEvent) bool {
	ta, tb := originTS(a.JSON), originTS(b.JSON)
	if ta != tb {
		return ta > tb
	}
	return a.EventID > b.EventID
}

func originTS(eventJSON []byte) int64 {
	var ev struct {
		TS int64 `json:"origin_server_ts"`
	}
	_ = json.Unmarshal(eventJSON, &ev)
	return ev.TS
}

// Redacted says whether a stored event was redacted (its unsigned part
// names the redaction).
func Redacted(eventJSON []byte) bool {
	if !bytes.Contains(eventJSON, []byte(`redacted_because`)) {
		return false
	}
	var ev struct {
		Unsigned struct {
			RedactedBecause json.RawMessage `json:"redacted_because"`
		} `json:"unsigned"`
	}
	return json.Unmarshal(eventJSON, &ev) == nil && len(ev.Unsigned.RedactedBecause) > 0
}
