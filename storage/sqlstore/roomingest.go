package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"

	"github.com/keyserver/keyserver/storage"
)

// IngestRoomEvents writes a storage.RoomIngest in one transaction. The
// room's current state moves from one snapshot to another; the keys that
// changed are applied to room_current_state, and each member whose
// membership changed is passed to the device-list side
// (txSetMembership), as a local write does. With Federate, Event is
// queued for the room's other servers but SkipServers (txQueueRoomPDUs).
func (s *Store) IngestRoomEvents(ctx context.Context, in storage.RoomIngest) (_ storage.RoomWriteResult, err error) {
	defer named("IngestRoomEvents", &err)
	var res storage.RoomWriteResult
	ch, err := s.writeChange(ctx, func(tx *txn) error {
		res = storage.RoomWriteResult{}
		defer func() { res.DeviceUpdatesQueued = tx.deviceUpdatesQueued }()
		current, depth, have, err := s.txLockRoom(ctx, tx, in.RoomID)
		switch {
		case errors.Is(err, storage.ErrNotFound) && in.Create != nil:
			if _, err := tx.ExecContext(ctx, `INSERT INTO rooms (room_id, room_version, creator, published, depth, state_snapshot, created_ts)
				VALUES ($1, $2, $3, $4, 0, 0, $5)`, in.RoomID, in.Create.RoomVersion, in.Create.Creator, boolInt(in.Create.Published), in.Now); err != nil {
				return err
			}
		case err != nil:
			return err
		case in.NewExtremities != nil && !sameSet(have, in.Extremities):
			return storage.ErrRoomMoved
		}
		if in.HistoryPos != 0 {
			return s.txPlaceHistory(ctx, tx, in)
		}
		for _, ev := range in.Outliers {
			if err := s.txInsertOutlier(ctx, tx, ev); err != nil {
				return err
			}
			depth = max(depth, ev.Depth)
		}
		var placed *placedEvent
		if in.Event != nil {
			if placed, err = s.txPlaceIngested(ctx, tx, in); err != nil {
				return err
			}
			depth = max(depth, in.Event.Depth)
		}
		if err := txRedact(ctx, tx, in.Redactions); err != nil {
			return err
		}
		if in.NewExtremities != nil {
			if _, err := tx.ExecContext(ctx, `DELETE FROM room_extremities WHERE room_id = $1`, in.RoomID); err != nil {
				return err
			}
			for _, id := range in.NewExtremities {
				if _, err := tx.ExecContext(ctx, `INSERT INTO room_extremities (room_id, event_id) VALUES ($1, $2)`, in.RoomID, id); err != nil {
					return err
				}
			}
		}
		next := current
		switch {
		case in.CurrentAfterEvent && placed != nil && placed.after != 0:
			next = placed.after
		case in.CurrentState != nil:
			if next, err = s.txSnapshotOf(ctx, tx, in.RoomID, 0, in.CurrentState); err != nil {
				return err
			}
		case in.PutState != nil:
			if next, err = s.txSnapshotOf(ctx, tx, in.RoomID, current, in.PutState); err != nil {
				return err
			}
		}
		if next != current {
			pos := storage.StreamPos(0)
			if placed != nil {
				pos = placed.pos
			}
			if err := s.txMoveCurrentState(ctx, tx, in.RoomID, current, next, pos, &res, in.Now); err != nil {
				return err
			}
		}
		head := storage.NewRoomHead()
		if _, err := tx.ExecContext(ctx, `UPDATE rooms SET state_snapshot = $1, depth = $2, head = $3 WHERE room_id = $4`, next, depth, head, in.RoomID); err != nil {
			return err
		}
		res.Head, res.StateSnapshot = head, next
		// Sent on after the room's state moved, so a join it brings makes
		// its server a destination. A rejected or soft-failed event is not.
		members, err := s.txRoomMembers(ctx, tx, in.RoomID, next)
		if err != nil {
			return err
		}
		if ev := in.Event; in.Federate && ev != nil && !ev.Rejected && !ev.SoftFailed {
			if res.PDUsQueued, err = s.txQueueRoomPDUs(ctx, tx, members, []storage.RoomEvent{*ev}, in.SkipServers); err != nil {
				return err
			}
		}
		s.concernLocalMembers(tx, members)
		return nil
	})
	res.Change = ch
	return res, err
}

// txPlaceHistory writes a backfilled event (RoomIngest.HistoryPos) with
// its outliers and redactions, and nothing else of the room.
func (s *Store) txPlaceHistory(ctx context.Context, tx *txn, in storage.RoomIngest) error {
	if in.Event == nil || in.HistoryPos > 0 {
		return errors.New("history is one event at a negative position")
	}
	for _, ev := range in.Outliers {
		if err := s.txInsertOutlier(ctx, tx, ev); err != nil {
			return err
		}
	}
	if _, err := s.txPlaceIngested(ctx, tx, in); err != nil {
		return err
	}
	return txRedact(ctx, tx, in.Redactions)
}

// RoomLowestPos returns the lowest stream position of a room's events,
// or 0 when none is below 0: backfilled history goes below it.
func (s *Store) RoomLowestPos(ctx context.Context, roomID string) (_ storage.StreamPos, err error) {
	defer named("RoomLowestPos", &err)
	var pos sql.NullInt64
	err = s.q.QueryRowContext(ctx, `SELECT MIN(pos) FROM room_events WHERE room_id = $1`, roomID).Scan(&pos)
	return storage.StreamPos(min(pos.Int64, 0)), err
}

// txInsertOutlier stores an event without state unless it is stored.
func (s *Store) txInsertOutlier(ctx context.Context, tx *txn, ev storage.RoomEvent) error {
	var stateKey any
	if ev.StateKey != nil {
		stateKey = *ev.StateKey
	}
	r, err := tx.ExecContext(ctx, `INSERT INTO room_events
		(event_id, room_id, event_type, state_key, sender, depth, room_version, event_json, outlier, rejected)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 1, $9) ON CONFLICT (event_id) DO NOTHING`,
		ev.EventID, ev.RoomID, ev.Type, stateKey, ev.Sender, ev.Depth, ev.RoomVersion, string(ev.JSON), boolInt(ev.Rejected))
	if err != nil {
		return err
	}
	// An event stored before keeps what it had (its relation forgotten
	// if it was redacted since).
	if n, err := r.RowsAffected(); err != nil || n == 0 {
		return err
	}
	return txPutRelation(ctx, tx, ev)
}

// placedEvent is what placing an ingested event made.
type placedEvent struct {
	after int64 // snapshot of the state after it (0 when rejected)
	pos   storage.StreamPos
}

// txPlaceIngested stores the write's event with the state before it and
// a stream position (a rejected one with neither). An event placed
// before is left alone; an outlier is placed.
func (s *Store) txPlaceIngested(ctx context.Context, tx *txn, in storage.RoomIngest) (*placedEvent, error) {
	ev := *in.Event
	var outlier int
	var placedAfter sql.NullInt64
	err := tx.QueryRowContext(ctx, `SELECT outlier, state_after FROM room_events WHERE event_id = $1`, ev.EventID).Scan(&outlier, &placedAfter)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if err := s.txInsertOutlier(ctx, tx, ev); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	case outlier == 0:
		return &placedEvent{after: placedAfter.Int64}, nil // placed already
	}
	if ev.Rejected {
		_, err := tx.ExecContext(ctx, `UPDATE room_events SET outlier = 0, rejected = 1 WHERE event_id = $1`, ev.EventID)
		return &placedEvent{}, err
	}
	var before int64
	if in.StateAfter != "" {
		var after sql.NullInt64
		if err := tx.QueryRowContext(ctx, `SELECT state_after FROM room_events WHERE event_id = $1`, in.StateAfter).Scan(&after); err != nil {
			return nil, notFound(err)
		}
		if !after.Valid {
			return nil, errors.New("the event the state is taken from has no state")
		}
		before = after.Int64
	} else if before, err = s.txSnapshotOf(ctx, tx, ev.RoomID, 0, in.StateBefore); err != nil {
		return nil, err
	}
	after := before
	if ev.StateKey != nil {
		if after, err = s.txSnapshotOf(ctx, tx, ev.RoomID, before, []string{ev.EventID}); err != nil {
			return nil, err
		}
	}
	pos := in.HistoryPos
	if pos == 0 {
		if pos, err = s.nextPos(ctx, tx); err != nil {
			return nil, err
		}
	}
	_, err = tx.ExecContext(ctx, `UPDATE room_events SET outlier = 0, soft_failed = $1, state_before = $2, state_after = $3, pos = $4
		WHERE event_id = $5`, boolInt(ev.SoftFailed), before, after, pos, ev.EventID)
	return &placedEvent{after: after, pos: pos}, err
}

// txSnapshotOf makes a snapshot: the snapshot base (0: empty) with the
// state events ids in place of those with their keys. Every id must be a
// stored state event of the room, at most one per key.
func (s *Store) txSnapshotOf(ctx context.Context, tx *txn, roomID string, base int64, ids []string) (int64, error) {
	var nid int64
	if err := tx.QueryRowContext(ctx, `INSERT INTO room_state_snapshots (room_id) VALUES ($1) RETURNING snapshot_nid`, roomID).Scan(&nid); err != nil {
		return 0, err
	}
	added := 0
	for rest := ids; len(rest) > 0; {
		n := min(len(rest), 500)
		r, err := tx.ExecContext(ctx, `INSERT INTO room_state_entries (snapshot_nid, event_type, state_key, event_nid)
			SELECT $1, event_type, state_key, event_nid FROM room_events
			WHERE room_id = $2 AND state_key IS NOT NULL AND event_id IN (`+placeholders(3, n)+`)`,
			args([]any{nid, roomID}, rest[:n])...)
		if err != nil {
			return 0, err
		}
		k, _ := r.RowsAffected()
		added += int(k)
		rest = rest[n:]
	}
	if added != len(ids) {
		return 0, errors.New("a state event is unknown, of another room, or not state")
	}
	if base != 0 {
		if _, err := tx.ExecContext(ctx, `INSERT INTO room_state_entries (snapshot_nid, event_type, state_key, event_nid)
			SELECT $1, b.event_type, b.state_key, b.event_nid FROM room_state_entries b
			WHERE b.snapshot_nid = $2 AND NOT EXISTS (SELECT 1 FROM room_state_entries n
				WHERE n.snapshot_nid = $1 AND n.event_type = b.event_type AND n.state_key = b.state_key)`, nid, base); err != nil {
			return 0, err
		}
	}
	return nid, nil
}

// txMoveCurrentState makes snapshot next the room's current state in
// room_current_state, giving changed keys the stream position pos (a new
// one when 0), and passes changed memberships to the device lists.
func (s *Store) txMoveCurrentState(ctx context.Context, tx *txn, roomID string, current, next int64, pos storage.StreamPos, res *storage.RoomWriteResult, now int64) error {
	type change struct {
		evType, stateKey string
		nid              sql.NullInt64 // invalid: the key is gone
		json             string
	}
	var changes []change
	rows, err := tx.QueryContext(ctx, `
		SELECT n.event_type, n.state_key, n.event_nid, e.event_json FROM room_state_entries n
		JOIN room_events e ON e.event_nid = n.event_nid
		WHERE n.snapshot_nid = $1 AND NOT EXISTS (SELECT 1 FROM room_state_entries o
			WHERE o.snapshot_nid = $2 AND o.event_type = n.event_type AND o.state_key = n.state_key AND o.event_nid = n.event_nid)
		UNION ALL
		SELECT o.event_type, o.state_key, NULL, '' FROM room_state_entries o
		WHERE o.snapshot_nid = $2 AND NOT EXISTS (SELECT 1 FROM room_state_entries n
			WHERE n.snapshot_nid = $1 AND n.event_type = o.event_type AND n.state_key = o.state_key)`, next, current)
	if err != nil {
		return err
	}
	for rows.Next() {
		var c change
		if err := rows.Scan(&c.evType, &c.stateKey, &c.nid, &c.json); err != nil {
			rows.Close()
			return err
		}
		changes = append(changes, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if len(changes) == 0 {
		return nil
	}
	if pos == 0 {
		if pos, err = s.nextPos(ctx, tx); err != nil {
			return err
		}
	}
	var moves []memberMove
	var rowValues []any // the new keys' rows, 6 values each
	for _, c := range changes {
		membership := storage.MembershipLeave
		if !c.nid.Valid {
			if _, err := tx.ExecContext(ctx, `DELETE FROM room_current_state WHERE room_id = $1 AND event_type = $2 AND state_key = $3`,
				roomID, c.evType, c.stateKey); err != nil {
				return err
			}
		} else {
			var m any
			if c.evType == "m.room.member" {
				membership = membershipOf(c.json)
				m = membership
			}
			rowValues = append(rowValues, roomID, c.evType, c.stateKey, c.nid.Int64, m, pos)
		}
		if c.evType != "m.room.member" {
			continue
		}
		local := strings.HasSuffix(c.stateKey, ":"+s.serverName)
		if local && (membership == storage.MembershipJoin || membership == storage.MembershipInvite) {
			if _, err := tx.ExecContext(ctx, `DELETE FROM room_forgotten WHERE user_id = $1 AND room_id = $2`, c.stateKey, roomID); err != nil {
				return err
			}
		}
		if local {
			tx.concern(c.stateKey)
		}
		moves = append(moves, memberMove{c.stateKey, deviceListMembership(membership)})
	}
	// Many rows a statement: joining a large room brings thousands of
	// members, written while the write holds the stream's counter.
	for chunk := range slices.Chunk(rowValues, 6*(maxUsersPerStatement/6)) {
		if _, err := tx.ExecContext(ctx, `INSERT INTO room_current_state (room_id, event_type, state_key, event_nid, membership, pos)
			VALUES `+valueRows(len(chunk)/6, 6)+`
			ON CONFLICT (room_id, event_type, state_key) DO UPDATE SET event_nid = excluded.event_nid, membership = excluded.membership, pos = excluded.pos`,
			chunk...); err != nil {
			return err
		}
	}
	stale, _, err := s.txSetMemberships(ctx, tx, roomID, moves, now, false)
	res.NewlyStale = append(res.NewlyStale, stale...)
	return err
}
