package sqlstore

import (
	"context"
	"database/sql"
	"strconv"

	"github.com/keyserver/keyserver/storage"
)

// Relations between events (migration 29, table event_relations): one row
// per event whose content declares a relation (storage.RelationOf),
// written in the transaction that stores the event (txWriteRoomEvent,
// txInsertOutlier) and deleted in the one that redacts it (txRedact).
// Whether an event is shown (placed, neither rejected nor soft-failed) is
// read from room_events when the relations are read, so an outlier placed
// later counts from then on.

// txPutRelation records an event's relation, if it declares one.
func txPutRelation(ctx context.Context, tx *txn, ev storage.RoomEvent) error {
	relType, parent, ok := storage.RelationOf(ev.JSON)
	if !ok {
		return nil
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO event_relations (event_id, room_id, parent_id, rel_type) VALUES ($1, $2, $3, $4)
		ON CONFLICT (event_id) DO NOTHING`, ev.EventID, ev.RoomID, parent, relType)
	return err
}

// txForgetRelations deletes the relations of redacted events.
func txForgetRelations(ctx context.Context, tx *txn, redactions []storage.RoomRedaction) error {
	for _, r := range redactions {
		if _, err := tx.ExecContext(ctx, `DELETE FROM event_relations WHERE event_id = $1`, r.EventID); err != nil {
			return err
		}
	}
	return nil
}

// hasRelation says whether a write's events declare a relation: such a
// write is not a plain message (isPlainMessage), whose PostgreSQL function
// does not record relations.
func hasRelation(w storage.RoomWrite) bool {
	for _, ev := range w.Events {
		if _, _, ok := storage.RelationOf(ev.JSON); ok {
			return true
		}
	}
	return false
}

// shown is the condition on room_events e of an event clients may see.
const shown = `e.outlier = 0 AND e.rejected = 0 AND e.soft_failed = 0 AND e.pos IS NOT NULL`

// RelatedEvents returns a page of the events related to a parent.
func (s *Store) RelatedEvents(ctx context.Context, q storage.RelationsQuery) (_ []storage.RoomEvent, err error) {
	defer named("RelatedEvents", &err)
	order := " DESC"
	if q.Forward {
		order = ""
	}
	// The related events, down to depth relations away; one event has one
	// relation, so a chain of them ends (or loops) within depth steps.
	return s.roomEvents(ctx, `WITH RECURSIVE related (event_id, depth) AS (
			SELECT event_id, 1 FROM event_relations WHERE parent_id = $1 AND room_id = $2
			UNION SELECT r.event_id, related.depth + 1 FROM event_relations r JOIN related ON r.parent_id = related.event_id
			WHERE related.depth < $3 AND r.room_id = $2
		)
		SELECT e.event_id, e.room_id, e.event_type, e.state_key, e.sender, e.depth, e.room_version, e.event_json, COALESCE(e.pos, 0),
			e.outlier, e.rejected, e.soft_failed, COALESCE(e.state_before, 0)
		FROM room_events e JOIN event_relations r ON r.event_id = e.event_id
		WHERE e.event_id IN (SELECT event_id FROM related) AND e.room_id = $2
		AND e.outlier = 0 AND e.rejected = 0 AND e.soft_failed = 0 AND e.pos > $4 AND e.pos <= $5
		AND ($6 = '' OR r.rel_type = $6) AND ($7 = '' OR e.event_type = $7)
		ORDER BY e.pos`+order+` LIMIT `+strconv.Itoa(max(q.Limit, 0)),
		q.ParentID, q.RoomID, max(q.Depth, 1), q.After, q.UpTo, q.RelType, q.EventType)
}

// Threads returns a page of a room's threads, the most recently active
// first. A root must be shown, as its replies.
func (s *Store) Threads(ctx context.Context, q storage.ThreadsQuery) (_ []storage.Thread, err error) {
	defer named("Threads", &err)
	rows, err := s.q.QueryContext(ctx, `SELECT r.parent_id, MAX(e.pos) FROM event_relations r
		JOIN room_events e ON e.event_id = r.event_id
		JOIN room_events p ON p.event_id = r.parent_id
		WHERE r.room_id = $1 AND r.rel_type = 'm.thread' AND e.room_id = $1
		AND e.outlier = 0 AND e.rejected = 0 AND e.soft_failed = 0 AND e.pos IS NOT NULL
		AND p.room_id = $1 AND p.outlier = 0 AND p.rejected = 0 AND p.soft_failed = 0 AND p.pos IS NOT NULL
		GROUP BY r.parent_id, p.sender
		HAVING MAX(e.pos) < $2 AND ($3 = '' OR p.sender = $3 OR SUM(CASE WHEN e.sender = $3 THEN 1 ELSE 0 END) > 0)
		ORDER BY MAX(e.pos) DESC LIMIT `+strconv.Itoa(max(q.Limit, 0)), q.RoomID, q.Before, q.Participant)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.Thread
	for rows.Next() {
		var t storage.Thread
		if err := rows.Scan(&t.RootID, &t.Latest); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// ThreadSummaries sums up the threads of the roots named.
func (s *Store) ThreadSummaries(ctx context.Context, roomID string, roots []string, userID string) (_ map[string]storage.ThreadSummary, err error) {
	defer named("ThreadSummaries", &err)
	out := map[string]storage.ThreadSummary{}
	latest := map[storage.StreamPos]string{} // the latest reply's position -> its root
	for len(roots) > 0 {
		n := min(len(roots), 500)
		rows, err := s.q.QueryContext(ctx, `SELECT r.parent_id, COUNT(*), MAX(e.pos), SUM(CASE WHEN e.sender = $1 THEN 1 ELSE 0 END)
			FROM event_relations r JOIN room_events e ON e.event_id = r.event_id
			WHERE r.room_id = $2 AND r.rel_type = 'm.thread' AND e.room_id = $2 AND `+shown+`
			AND r.parent_id IN (`+placeholders(3, n)+`) GROUP BY r.parent_id`, args([]any{userID, roomID}, roots[:n])...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var root string
			var sum storage.ThreadSummary
			var pos storage.StreamPos
			var mine int
			if err := rows.Scan(&root, &sum.Count, &pos, &mine); err != nil {
				rows.Close()
				return nil, err
			}
			sum.Participated = mine > 0
			out[root] = sum
			latest[pos] = root
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		roots = roots[n:]
	}
	positions := make([]any, 0, len(latest))
	for pos := range latest {
		positions = append(positions, pos)
	}
	for len(positions) > 0 {
		n := min(len(positions), 500)
		evs, err := s.roomEvents(ctx, `SELECT `+roomEventColumns+` FROM room_events e WHERE e.room_id = $1 AND e.pos IN (`+
			placeholders(2, n)+`)`, append([]any{roomID}, positions[:n]...)...)
		if err != nil {
			return nil, err
		}
		for _, ev := range evs {
			if root, ok := latest[ev.Pos]; ok {
				sum := out[root]
				sum.Latest = ev
				out[root] = sum
			}
		}
		positions = positions[n:]
	}
	return out, nil
}

// RelationTypes returns, of the parents named, those with recorded
// relations and their types.
func (s *Store) RelationTypes(ctx context.Context, roomID string, parents []string) (_ map[string][]string, err error) {
	defer named("RelationTypes", &err)
	out := map[string][]string{}
	for len(parents) > 0 {
		n := min(len(parents), 500)
		rows, err := s.q.QueryContext(ctx, `SELECT DISTINCT parent_id, rel_type FROM event_relations
			WHERE parent_id IN (`+placeholders(1, n)+`) AND room_id = $`+strconv.Itoa(n+1), append(args(nil, parents[:n]), roomID)...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var parent, relType string
			if err := rows.Scan(&parent, &relType); err != nil {
				rows.Close()
				return nil, err
			}
			out[parent] = append(out[parent], relType)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		parents = parents[n:]
	}
	return out, nil
}

// RelatedByType returns the events of the relation types named related to
// the parents named, oldest first.
func (s *Store) RelatedByType(ctx context.Context, roomID string, parents, relTypes []string) (_ []storage.RelatedEvent, err error) {
	defer named("RelatedByType", &err)
	if len(relTypes) == 0 {
		return nil, nil
	}
	var out []storage.RelatedEvent
	for len(parents) > 0 {
		n := min(len(parents), 500)
		params := args([]any{roomID}, relTypes)
		params = args(params, parents[:n])
		rows, err := s.q.QueryContext(ctx, `SELECT r.parent_id, r.rel_type, `+roomEventColumns+`
			FROM event_relations r JOIN room_events e ON e.event_id = r.event_id
			WHERE r.room_id = $1 AND r.rel_type IN (`+placeholders(2, len(relTypes))+`)
			AND r.parent_id IN (`+placeholders(2+len(relTypes), n)+`) AND e.room_id = $1 AND `+shown+`
			ORDER BY e.pos`, params...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var re storage.RelatedEvent
			if err := scanRoomEvent(rows, &re.Event, &re.ParentID, &re.RelType); err != nil {
				rows.Close()
				return nil, err
			}
			out = append(out, re)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		parents = parents[n:]
	}
	return out, nil
}

// scanRoomEvent scans a row of the columns before, then roomEventColumns.
func scanRoomEvent(rows *sql.Rows, ev *storage.RoomEvent, before ...any) error {
	var stateKey sql.NullString
	var js string
	var outlier, rejected, softFailed int
	dest := append(before, &ev.EventID, &ev.RoomID, &ev.Type, &stateKey, &ev.Sender, &ev.Depth, &ev.RoomVersion, &js, &ev.Pos,
		&outlier, &rejected, &softFailed, &ev.StateBefore)
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	ev.Outlier, ev.Rejected, ev.SoftFailed = outlier != 0, rejected != 0, softFailed != 0
	if stateKey.Valid {
		ev.StateKey = &stateKey.String
	}
	ev.JSON = []byte(js)
	if ev.Type == "m.room.member" {
		ev.Membership = membershipOf(js)
	}
	return nil
}
