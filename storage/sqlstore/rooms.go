package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"slices"
	"strconv"
	"strings"

	"github.com/lib/pq"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/storage"
)

// The rooms' tables (migration 14): see package roomserver for the design.

// WriteRoomEvents writes a chain of new events of a room in one
// transaction: each event with the snapshot of the state before it and a
// stream position, the new state snapshots and current state, the room's
// extremities (the last event), and, for each membership event, the
// membership the device-list side reads (storage.SetMembership's own
// transaction body), so that who shares a room with whom changes with the
// event, and, with Federate, the events queued for the room's other
// servers (txQueueRoomPDUs). The change concerns the room's local members.
func (s *Store) WriteRoomEvents(ctx context.Context, w storage.RoomWrite) (_ storage.RoomWriteResult, err error) {
	defer named("WriteRoomEvents", &err)
	var res storage.RoomWriteResult
	ch, err := s.writeChange(ctx, s.roomWrite(ctx, w, &res))
	res.Change = ch
	return res, err
}

// roomWrite is the transaction of WriteRoomEvents, filling *res.
func (s *Store) roomWrite(ctx context.Context, w storage.RoomWrite, res *storage.RoomWriteResult) func(tx *txn) error {
	return func(tx *txn) error {
		*res = storage.RoomWriteResult{}
		defer func() { res.DeviceUpdatesQueued = tx.deviceUpdatesQueued }()
		head := w.NewHead
		if head == 0 {
			head = storage.NewRoomHead()
		}
		var depth int64
		for _, ev := range w.Events {
			depth = max(depth, ev.Depth)
		}
		snapshot := w.StateSnapshot
		switch {
		case w.Create != nil:
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM rooms WHERE room_id = $1`, w.RoomID).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return storage.ErrExists
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO rooms (room_id, room_version, creator, published, depth, state_snapshot, created_ts, head)
				VALUES ($1, $2, $3, $4, $5, 0, $6, $7)`, w.RoomID, w.Create.RoomVersion, w.Create.Creator, boolInt(w.Create.Published), depth, w.Now, head); err != nil {
				return err
			}
			snapshot = 0
		case w.Head != 0:
			// The compare and the lock in one statement.
			r, err := tx.ExecContext(ctx, `UPDATE rooms SET head = $1, depth = CASE WHEN depth > $2 THEN depth ELSE $2 END
				WHERE room_id = $3 AND head = $4`, head, depth, w.RoomID, w.Head)
			if err != nil {
				return err
			}
			if n, err := r.RowsAffected(); err != nil {
				return err
			} else if n == 0 {
				var n int
				if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM rooms WHERE room_id = $1`, w.RoomID).Scan(&n); err != nil {
					return err
				}
				if n == 0 {
					return storage.ErrNotFound
				}
				return storage.ErrRoomMoved
			}
		default:
			var have []string
			var err error
			var was int64
			if snapshot, was, have, err = s.txLockRoom(ctx, tx, w.RoomID); err != nil {
				return err
			}
			if !sameSet(have, w.Extremities) {
				return storage.ErrRoomMoved
			}
			depth = max(depth, was)
			if _, err := tx.ExecContext(ctx, `UPDATE rooms SET head = $1, depth = $2 WHERE room_id = $3`, head, depth, w.RoomID); err != nil {
				return err
			}
		}
		// A retried request whose first made its event: nothing more.
		if t := w.Txn; t != nil && len(w.Events) > 0 {
			r, err := tx.ExecContext(ctx, `INSERT INTO room_txns (user_id, device_id, txn_path, event_id, created_ts) VALUES ($1, $2, $3, $4, $5)
				ON CONFLICT (user_id, device_id, txn_path) DO NOTHING`, t.UserID, t.DeviceID, t.Path, w.Events[len(w.Events)-1].EventID, w.Now)
			if err != nil {
				return err
			}
			if n, err := r.RowsAffected(); err != nil {
				return err
			} else if n == 0 {
				return storage.ErrTxnDone
			}
		}
		if w.Alias != "" {
			if err := s.txPutRoomAlias(ctx, tx, storage.RoomAlias{Alias: w.Alias, RoomID: w.RoomID, Creator: w.Create.Creator}); err != nil {
				return err
			}
		}
		was := snapshot
		nids := make([]int64, len(w.Events))
		positions := make([]storage.StreamPos, len(w.Events))
		for i, ev := range w.Events {
			var err error
			if !s.positionsLast() {
				if positions[i], err = s.nextPos(ctx, tx); err != nil {
					return err
				}
			}
			if nids[i], err = s.txWriteRoomEvent(ctx, tx, ev, &snapshot, positions[i]); err != nil {
				return err
			}
		}
		if snapshot != was {
			if _, err := tx.ExecContext(ctx, `UPDATE rooms SET state_snapshot = $1 WHERE room_id = $2`, snapshot, w.RoomID); err != nil {
				return err
			}
		}
		res.Head, res.StateSnapshot = head, snapshot
		var had []string // the room's extremities, checked above
		if w.Create == nil {
			had = w.Extremities
		}
		if err := s.txReplaceExtremities(ctx, tx, w.RoomID, had, w.Events); err != nil {
			return err
		}
		// The room's local members see the events in /sync.
		members, err := s.txRoomMembers(ctx, tx, w.RoomID, snapshot)
		if err != nil {
			return err
		}
		s.concernLocalMembers(tx, members)
		if w.Federate {
			if res.PDUsQueued, err = s.txQueueRoomPDUs(ctx, tx, members, w.Events, nil); err != nil {
				return err
			}
		}
		if err := txRedact(ctx, tx, w.Redactions); err != nil {
			return err
		}
		if s.positionsLast() {
			return s.placeLast(ctx, tx, w, nids, res)
		}
		for i, ev := range w.Events {
			if err := s.txPlaceRoomEvent(ctx, tx, ev, nids[i], positions[i], res, w.Now); err != nil {
				return err
			}
		}
		return nil
	}
}

// placeLast ends a room write on PostgreSQL (positionsLast): the
// memberships its member events change, then the stream notification,
// then, in one statement, the events' stream positions, their current
// state rows' and the changed memberships': the counter is locked from
// that statement to the commit, holding up every other write of the
// server, so nothing else comes after it.
func (s *Store) placeLast(ctx context.Context, tx *txn, w storage.RoomWrite, nids []int64, res *storage.RoomWriteResult) error {
	if len(w.Events) == 0 {
		return nil
	}
	var moves []memberMove
	stateTypes, stateKeys, stateNids, stateOrds := []string{}, []string{}, []int64{}, []int64{}
	for i, ev := range w.Events {
		if ev.StateKey == nil {
			continue
		}
		stateTypes, stateKeys = append(stateTypes, ev.Type), append(stateKeys, *ev.StateKey)
		stateNids, stateOrds = append(stateNids, nids[i]), append(stateOrds, int64(i+1))
		if ev.Type != "m.room.member" {
			continue
		}
		if err := s.txUnforget(ctx, tx, ev); err != nil {
			return err
		}
		moves = append(moves, memberMove{*ev.StateKey, deviceListMembership(ev.Membership)})
	}
	var moved []string
	if len(moves) > 0 {
		stale, changed, err := s.txSetMemberships(ctx, tx, w.RoomID, moves, w.Now, true)
		if err != nil {
			return err
		}
		res.NewlyStale, moved = append(res.NewlyStale, stale...), changed
	}
	if err := s.notifyEarly(ctx, tx); err != nil {
		return err
	}
	n := int64(len(w.Events))
	var last storage.StreamPos
	if err := tx.QueryRowContext(ctx, placeLastQuery, n, pq.Array(nids), pq.Array(stateTypes), pq.Array(stateKeys),
		pq.Array(stateNids), pq.Array(stateOrds), w.RoomID, pq.Array(moved)).Scan(&last); err != nil {
		return err
	}
	tx.pos = last
	return nil
}

// placeLastQuery gives a room write's $1 events (their nids $2, in order)
// the next $1 stream positions, the current state rows of its state
// events (types $3, keys $4, nids $5, places $6 among the events, in room
// $7) their events' positions, and the memberships of the users $8 in the
// room the last one; it returns the last one.
const placeLastQuery = `WITH p AS (UPDATE stream_position SET pos = pos + $1 WHERE id = 1 RETURNING pos - $1 AS base),
e AS (UPDATE room_events SET pos = p.base + x.i FROM p, unnest($2::BIGINT[]) WITH ORDINALITY AS x(nid, i)
	WHERE room_events.event_nid = x.nid),
c AS (UPDATE room_current_state SET pos = p.base + x.i FROM p, unnest($3::TEXT[], $4::TEXT[], $5::BIGINT[], $6::BIGINT[]) AS x(t, k, nid, i)
	WHERE room_current_state.room_id = $7 AND room_current_state.event_type = x.t AND room_current_state.state_key = x.k
	AND room_current_state.event_nid = x.nid),
m AS (UPDATE memberships SET pos = p.base + $1 FROM p WHERE memberships.room_id = $7 AND memberships.user_id = ANY($8::TEXT[]))
SELECT base + $1 FROM p`

// txUnforget brings back a room a local user forgot, with a new invite or
// join of theirs.
func (s *Store) txUnforget(ctx context.Context, tx *txn, ev storage.RoomEvent) error {
	if (ev.Membership == storage.MembershipJoin || ev.Membership == storage.MembershipInvite) && strings.HasSuffix(*ev.StateKey, ":"+s.serverName) {
		_, err := tx.ExecContext(ctx, `DELETE FROM room_forgotten WHERE user_id = $1 AND room_id = $2`, *ev.StateKey, ev.RoomID)
		return err
	}
	return nil
}

// txLockRoom locks a room's record for the transaction and reads it, then
// its extremities (storage.ErrNotFound for an unknown room). Two
// statements: a lock taken in a join would read the other table as it was
// before the lock was granted (PostgreSQL re-reads only the locked row).
func (s *Store) txLockRoom(ctx context.Context, tx *txn, roomID string) (snapshot, depth int64, extremities []string, err error) {
	err = tx.QueryRowContext(ctx, `SELECT state_snapshot, depth FROM rooms WHERE room_id = $1`+s.d.forUpdate, roomID).Scan(&snapshot, &depth)
	if err != nil {
		return 0, 0, nil, notFound(err)
	}
	extremities, err = s.txUserList(ctx, tx, `SELECT event_id FROM room_extremities WHERE room_id = $1`, roomID)
	return snapshot, depth, extremities, err
}

// sameSet reports whether two lists hold the same strings.
func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// txReplaceExtremities makes the last of events the room's one forward
// extremity, in place of was (the room's). One the room had alone is
// replaced in place, named by its whole key: on PostgreSQL every
// replacement leaves a dead index entry under the room's ID until
// vacuum, and a lookup by the room's ID alone visits all of them (a busy
// room's messages made it read hundreds).
func (s *Store) txReplaceExtremities(ctx context.Context, tx *txn, roomID string, was []string, events []storage.RoomEvent) error {
	if len(events) == 0 {
		return nil
	}
	last := events[len(events)-1].EventID
	if len(was) == 1 {
		_, err := tx.ExecContext(ctx, `UPDATE room_extremities SET event_id = $1 WHERE room_id = $2 AND event_id = $3`, last, roomID, was[0])
		return err
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM room_extremities WHERE room_id = $1`, roomID); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO room_extremities (room_id, event_id) VALUES ($1, $2)`, roomID, last)
	return err
}

// txRedact replaces redacted events' JSON.
func txRedact(ctx context.Context, tx *txn, redactions []storage.RoomRedaction) error {
	if err := txForgetRelations(ctx, tx, redactions); err != nil {
		return err
	}
	for _, r := range redactions {
		if _, err := tx.ExecContext(ctx, `UPDATE room_events SET event_json = $1 WHERE event_id = $2 AND room_id = $3`,
			string(r.JSON), r.EventID, r.RoomID); err != nil {
			return err
		}
	}
	return nil
}

// positionsLast says whether a room write takes its events' stream
// positions last, after everything else it writes: on PostgreSQL, where
// the counter stays locked from the first position taken to the commit,
// holding up every other write of the server. SQLite has one writer at a
// time anyway: there each event's position is written with it.
func (s *Store) positionsLast() bool { return s.d.name == "postgres" }

// txWriteRoomEvent writes one event after *snapshot (the state before
// it), moving *snapshot past it when it is a state event, and returns its
// nid. Its stream position is pos, or, when 0, comes later
// (txPlaceRoomEvent).
func (s *Store) txWriteRoomEvent(ctx context.Context, tx *txn, ev storage.RoomEvent, snapshot *int64, pos storage.StreamPos) (int64, error) {
	var stateKey any
	if ev.StateKey != nil {
		stateKey = *ev.StateKey
	}
	// A state event makes the snapshot of the state after it.
	next := *snapshot
	if ev.StateKey != nil {
		if err := tx.QueryRowContext(ctx, `INSERT INTO room_state_snapshots (room_id) VALUES ($1) RETURNING snapshot_nid`, ev.RoomID).Scan(&next); err != nil {
			return 0, err
		}
	}
	var nid int64
	var position any
	if pos != 0 {
		position = pos
	}
	if err := tx.QueryRowContext(ctx, `INSERT INTO room_events
		(event_id, room_id, event_type, state_key, sender, depth, room_version, event_json, state_before, state_after, pos)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING event_nid`,
		ev.EventID, ev.RoomID, ev.Type, stateKey, ev.Sender, ev.Depth, ev.RoomVersion, string(ev.JSON), *snapshot, next, position).Scan(&nid); err != nil {
		return 0, err
	}
	if err := txPutRelation(ctx, tx, ev); err != nil {
		return 0, err
	}
	if ev.StateKey == nil {
		return nid, nil
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO room_state_entries (snapshot_nid, event_type, state_key, event_nid)
		SELECT $1, event_type, state_key, event_nid FROM room_state_entries
		WHERE snapshot_nid = $2 AND NOT (event_type = $3 AND state_key = $4)`, next, *snapshot, ev.Type, *ev.StateKey); err != nil {
		return 0, err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO room_state_entries (snapshot_nid, event_type, state_key, event_nid) VALUES ($1, $2, $3, $4)`,
		next, ev.Type, *ev.StateKey, nid); err != nil {
		return 0, err
	}
	*snapshot = next
	var membership any
	if ev.Type == "m.room.member" {
		membership = ev.Membership
	}
	if _, err := tx.ExecContext(ctx, `
		INSERT INTO room_current_state (room_id, event_type, state_key, event_nid, membership, pos) VALUES ($1, $2, $3, $4, $5, 0)
		ON CONFLICT (room_id, event_type, state_key) DO UPDATE SET event_nid = excluded.event_nid, membership = excluded.membership`,
		ev.RoomID, ev.Type, *ev.StateKey, nid, membership); err != nil {
		return 0, err
	}
	return nid, nil
}

// txPlaceRoomEvent gives a written state event's current state row its
// stream position pos (the event's, taken with it: SQLite; PostgreSQL's
// writes end with placeLast) and, for a membership event, changes the
// membership device lists read.
func (s *Store) txPlaceRoomEvent(ctx context.Context, tx *txn, ev storage.RoomEvent, nid int64, pos storage.StreamPos, res *storage.RoomWriteResult, now int64) error {
	if ev.StateKey == nil {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `UPDATE room_current_state SET pos = $1
		WHERE room_id = $2 AND event_type = $3 AND state_key = $4 AND event_nid = $5`, pos, ev.RoomID, ev.Type, *ev.StateKey, nid); err != nil {
		return err
	}
	if ev.Type != "m.room.member" {
		return nil
	}
	if err := s.txUnforget(ctx, tx, ev); err != nil {
		return err
	}
	stale, err := s.txSetMembership(ctx, tx, ev.RoomID, *ev.StateKey, deviceListMembership(ev.Membership), now)
	res.NewlyStale = append(res.NewlyStale, stale...)
	return err
}

// deviceListMembership is what a room membership means for device lists:
// joined and invited users share the room, anyone else does not.
func deviceListMembership(m string) string {
	switch m {
	case storage.MembershipJoin, storage.MembershipInvite:
		return m
	}
	return storage.MembershipLeave
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Room returns a room's record, or storage.ErrNotFound. One statement
// reads it with its extremities, so that both come from one moment: an
// event built on them gets the depth that goes with them.
func (s *Store) Room(ctx context.Context, roomID string) (_ storage.Room, err error) {
	defer named("Room", &err)
	rows, err := s.q.QueryContext(ctx, `SELECT r.room_version, r.creator, r.published, r.depth, r.state_snapshot, r.head, x.event_id
		FROM rooms r LEFT JOIN room_extremities x ON x.room_id = r.room_id WHERE r.room_id = $1`, roomID)
	if err != nil {
		return storage.Room{}, err
	}
	defer rows.Close()
	r := storage.Room{RoomID: roomID}
	found := false
	for rows.Next() {
		var published int
		var extremity sql.NullString
		if err := rows.Scan(&r.RoomVersion, &r.Creator, &published, &r.Depth, &r.StateSnapshot, &r.Head, &extremity); err != nil {
			return r, err
		}
		found = true
		r.Published = published != 0
		if extremity.Valid {
			r.Extremities = append(r.Extremities, extremity.String)
		}
	}
	if err := rows.Err(); err != nil {
		return r, err
	}
	if !found {
		return r, storage.ErrNotFound
	}
	return r, nil
}

const roomEventColumns = `e.event_id, e.room_id, e.event_type, e.state_key, e.sender, e.depth, e.room_version, e.event_json, COALESCE(e.pos, 0),
	e.outlier, e.rejected, e.soft_failed, COALESCE(e.state_before, 0)`

func (s *Store) roomEvents(ctx context.Context, query string, params ...any) ([]storage.RoomEvent, error) {
	rows, err := s.q.QueryContext(ctx, query, params...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.RoomEvent
	for rows.Next() {
		var ev storage.RoomEvent
		var stateKey sql.NullString
		var js string
		var outlier, rejected, softFailed int
		if err := rows.Scan(&ev.EventID, &ev.RoomID, &ev.Type, &stateKey, &ev.Sender, &ev.Depth, &ev.RoomVersion, &js, &ev.Pos,
			&outlier, &rejected, &softFailed, &ev.StateBefore); err != nil {
			return nil, err
		}
		ev.Outlier, ev.Rejected, ev.SoftFailed = outlier != 0, rejected != 0, softFailed != 0
		if stateKey.Valid {
			ev.StateKey = &stateKey.String
		}
		ev.JSON = []byte(js)
		if ev.Type == "m.room.member" {
			ev.Membership = membershipOf(js)
		}
		out = append(out, ev)
	}
	return out, rows.Err()
}

// membershipOf reads the membership of a member event's JSON.
func membershipOf(js string) string {
	var ev struct {
		Content struct {
			Membership string `json:"membership"`
		} `json:"content"`
	}
	_ = json.Unmarshal([]byte(js), &ev) // checked before it was stored
	return ev.Content.Membership
}

// RoomCurrentState returns the events of a room's current state.
func (s *Store) RoomCurrentState(ctx context.Context, roomID string) (_ []storage.RoomEvent, err error) {
	defer named("RoomCurrentState", &err)
	return s.roomEvents(ctx, `SELECT `+roomEventColumns+` FROM room_current_state c JOIN room_events e ON e.event_nid = c.event_nid
		WHERE c.room_id = $1 ORDER BY e.event_nid`, roomID)
}

// RoomJoinedServers returns the servers with a user joined to a room in
// its current state, sorted: read from the members' rows alone, not their
// events (a join asks whether this server is in the room, and the room may
// have thousands of members).
func (s *Store) RoomJoinedServers(ctx context.Context, roomID string) (_ []string, err error) {
	defer named("RoomJoinedServers", &err)
	users, err := s.userList(ctx, `SELECT state_key FROM room_current_state
		WHERE room_id = $1 AND event_type = 'm.room.member' AND membership = 'join'`, roomID)
	if err != nil {
		return nil, err
	}
	servers := []string{}
	for _, u := range users {
		if server := matrixid.Server(u); server != "" {
			servers = append(servers, server)
		}
	}
	slices.Sort(servers)
	return slices.Compact(servers), nil
}

// RoomStateEvents returns the events of a room's current state with the
// given (type, state key) pairs, those that exist.
func (s *Store) RoomStateEvents(ctx context.Context, roomID string, keys []storage.StateKey) (_ []storage.RoomEvent, err error) {
	defer named("RoomStateEvents", &err)
	if len(keys) == 0 {
		return nil, nil
	}
	cond, params := stateKeyCondition("c", []any{roomID}, keys)
	return s.roomEvents(ctx, `SELECT `+roomEventColumns+` FROM room_current_state c JOIN room_events e ON e.event_nid = c.event_nid
		WHERE c.room_id = $1 AND (`+cond+`) ORDER BY e.event_nid`, params...)
}

// RoomSnapshotEvents returns the events of a state snapshot with the
// given (type, state key) pairs, those that exist.
func (s *Store) RoomSnapshotEvents(ctx context.Context, snapshot int64, keys []storage.StateKey) (_ []storage.RoomEvent, err error) {
	defer named("RoomSnapshotEvents", &err)
	if len(keys) == 0 {
		return nil, nil
	}
	cond, params := stateKeyCondition("se", []any{snapshot}, keys)
	return s.roomEvents(ctx, `SELECT `+roomEventColumns+` FROM room_state_entries se JOIN room_events e ON e.event_nid = se.event_nid
		WHERE se.snapshot_nid = $1 AND (`+cond+`) ORDER BY e.event_nid`, params...)
}

// stateKeyCondition matches the rows of table alias t with one of keys,
// their parameters appended to params.
func stateKeyCondition(t string, params []any, keys []storage.StateKey) (string, []any) {
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" OR ")
		}
		b.WriteString("(" + t + ".event_type = $" + strconv.Itoa(len(params)+1) + " AND " + t + ".state_key = $" + strconv.Itoa(len(params)+2) + ")")
		params = append(params, k.Type, k.StateKey)
	}
	return b.String(), params
}

// RoomStateBefore returns the state of a room before one of its events
// (not an outlier's: storage.ErrNotFound).
func (s *Store) RoomStateBefore(ctx context.Context, eventID string) (_ []storage.RoomEvent, err error) {
	defer named("RoomStateBefore", &err)
	var snapshot sql.NullInt64
	if err := s.q.QueryRowContext(ctx, `SELECT state_before FROM room_events WHERE event_id = $1`, eventID).Scan(&snapshot); err != nil {
		return nil, notFound(err)
	}
	if !snapshot.Valid {
		return nil, storage.ErrNotFound
	}
	return s.roomEvents(ctx, `SELECT `+roomEventColumns+` FROM room_state_entries se JOIN room_events e ON e.event_nid = se.event_nid
		WHERE se.snapshot_nid = $1 ORDER BY e.event_nid`, snapshot.Int64)
}

// RoomStateAfter returns the state of a room after one of its placed
// events: every key, or only keys when not nil (storage.ErrNotFound for
// an outlier or a rejected event).
func (s *Store) RoomStateAfter(ctx context.Context, eventID string, keys []storage.StateKey) (_ []storage.RoomEvent, err error) {
	defer named("RoomStateAfter", &err)
	var snapshot sql.NullInt64
	if err := s.q.QueryRowContext(ctx, `SELECT state_after FROM room_events WHERE event_id = $1`, eventID).Scan(&snapshot); err != nil {
		return nil, notFound(err)
	}
	if !snapshot.Valid {
		return nil, storage.ErrNotFound
	}
	params := []any{snapshot.Int64}
	var b strings.Builder
	if keys != nil {
		if len(keys) == 0 {
			return nil, nil
		}
		b.WriteString(" AND (")
		for i, k := range keys {
			if i > 0 {
				b.WriteString(" OR ")
			}
			b.WriteString("(se.event_type = $" + strconv.Itoa(len(params)+1) + " AND se.state_key = $" + strconv.Itoa(len(params)+2) + ")")
			params = append(params, k.Type, k.StateKey)
		}
		b.WriteString(")")
	}
	return s.roomEvents(ctx, `SELECT `+roomEventColumns+` FROM room_state_entries se JOIN room_events e ON e.event_nid = se.event_nid
		WHERE se.snapshot_nid = $1`+b.String()+` ORDER BY e.event_nid`, params...)
}

// RoomEvent returns a stored event by ID, or storage.ErrNotFound.
func (s *Store) RoomEvent(ctx context.Context, eventID string) (_ storage.RoomEvent, err error) {
	defer named("RoomEvent", &err)
	evs, err := s.roomEvents(ctx, `SELECT `+roomEventColumns+` FROM room_events e WHERE e.event_id = $1 AND e.rejected = 0`, eventID)
	if err != nil {
		return storage.RoomEvent{}, err
	}
	if len(evs) == 0 {
		return storage.RoomEvent{}, storage.ErrNotFound
	}
	return evs[0], nil
}

// RoomEventsByID returns the stored events among ids, rejected ones
// included (with their flag), in no particular order.
func (s *Store) RoomEventsByID(ctx context.Context, ids []string) (_ []storage.RoomEvent, err error) {
	defer named("RoomEventsByID", &err)
	var out []storage.RoomEvent
	for len(ids) > 0 {
		n := min(len(ids), 500)
		evs, err := s.roomEvents(ctx, `SELECT `+roomEventColumns+` FROM room_events e WHERE e.event_id IN (`+placeholders(1, n)+`)`,
			args(nil, ids[:n])...)
		if err != nil {
			return nil, err
		}
		out = append(out, evs...)
		ids = ids[n:]
	}
	return out, nil
}

// RoomMinDepth returns the smallest depth of a room's placed events (not
// outliers, not rejected): where this server's history of the room
// starts. 0 when it has none.
func (s *Store) RoomMinDepth(ctx context.Context, roomID string) (_ int64, err error) {
	defer named("RoomMinDepth", &err)
	var depth sql.NullInt64
	err = s.q.QueryRowContext(ctx, `SELECT MIN(depth) FROM room_events WHERE room_id = $1 AND outlier = 0 AND rejected = 0`,
		roomID).Scan(&depth)
	return depth.Int64, err
}

// RoomMembership returns a user's current membership of a room ("" when
// none).
func (s *Store) RoomMembership(ctx context.Context, roomID, userID string) (_ string, err error) {
	defer named("RoomMembership", &err)
	var m sql.NullString
	err = s.q.QueryRowContext(ctx, `SELECT membership FROM room_current_state
		WHERE room_id = $1 AND event_type = 'm.room.member' AND state_key = $2`, roomID, userID).Scan(&m)
	if err == sql.ErrNoRows {
		return "", nil
	}
	return m.String, err
}

// UserRoomMemberships returns the current memberships of a user in every
// room this server knows, forgotten rooms left out.
func (s *Store) UserRoomMemberships(ctx context.Context, userID string) (_ []storage.RoomMember, err error) {
	defer named("UserRoomMemberships", &err)
	rows, err := s.q.QueryContext(ctx, `SELECT c.room_id, c.membership, e.event_id, c.pos
		FROM room_current_state c JOIN room_events e ON e.event_nid = c.event_nid
		WHERE c.event_type = 'm.room.member' AND c.state_key = $1
		AND NOT EXISTS (SELECT 1 FROM room_forgotten f WHERE f.user_id = $1 AND f.room_id = c.room_id)
		ORDER BY c.room_id`, userID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.RoomMember
	for rows.Next() {
		m := storage.RoomMember{UserID: userID}
		if err := rows.Scan(&m.RoomID, &m.Membership, &m.EventID, &m.Pos); err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// RoomTxnEvent returns the event a client's transaction made, or
// storage.ErrNotFound.
func (s *Store) RoomTxnEvent(ctx context.Context, t storage.RoomTxn) (_ string, err error) {
	defer named("RoomTxnEvent", &err)
	var id string
	err = s.q.QueryRowContext(ctx, `SELECT event_id FROM room_txns WHERE user_id = $1 AND device_id = $2 AND txn_path = $3`,
		t.UserID, t.DeviceID, t.Path).Scan(&id)
	return id, notFound(err)
}

func (s *Store) txPutRoomAlias(ctx context.Context, tx *txn, a storage.RoomAlias) error {
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM room_aliases WHERE alias = $1`, a.Alias).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return storage.ErrExists
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO room_aliases (alias, room_id, creator) VALUES ($1, $2, $3)`, a.Alias, a.RoomID, a.Creator)
	if err != nil && s.d.isUniqueViolation(err) {
		return storage.ErrExists
	}
	return err
}

// PutRoomAlias creates an alias (storage.ErrExists when taken).
func (s *Store) PutRoomAlias(ctx context.Context, a storage.RoomAlias) (err error) {
	defer named("PutRoomAlias", &err)
	return s.write(ctx, func(tx *txn) error { return s.txPutRoomAlias(ctx, tx, a) })
}

// RoomAlias returns an alias, or storage.ErrNotFound.
func (s *Store) RoomAlias(ctx context.Context, alias string) (_ storage.RoomAlias, err error) {
	defer named("RoomAlias", &err)
	a := storage.RoomAlias{Alias: alias}
	err = s.q.QueryRowContext(ctx, `SELECT room_id, creator FROM room_aliases WHERE alias = $1`, alias).Scan(&a.RoomID, &a.Creator)
	return a, notFound(err)
}

// RoomAliases returns the aliases that name a room, sorted.
func (s *Store) RoomAliases(ctx context.Context, roomID string) (_ []string, err error) {
	defer named("RoomAliases", &err)
	rows, err := s.q.QueryContext(ctx, `SELECT alias FROM room_aliases WHERE room_id = $1 ORDER BY alias`, roomID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []string{}
	for rows.Next() {
		var a string
		if err := rows.Scan(&a); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// DeleteRoomAlias deletes an alias (storage.ErrNotFound when unknown).
func (s *Store) DeleteRoomAlias(ctx context.Context, alias string) (err error) {
	defer named("DeleteRoomAlias", &err)
	return s.write(ctx, func(tx *txn) error {
		r, err := tx.ExecContext(ctx, `DELETE FROM room_aliases WHERE alias = $1`, alias)
		if err != nil {
			return err
		}
		if n, _ := r.RowsAffected(); n == 0 {
			return storage.ErrNotFound
		}
		return nil
	})
}

// ForgetRoom records that a user forgot a room: it leaves their list of
// rooms until they join it again.
func (s *Store) ForgetRoom(ctx context.Context, userID, roomID string) (err error) {
	defer named("ForgetRoom", &err)
	return s.write(ctx, func(tx *txn) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO room_forgotten (user_id, room_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`, userID, roomID)
		return err
	})
}

// RoomTimeline returns the newest events of a room with positions in
// (from, to], at most limit of them, oldest first, and whether there were
// more (the timeline is limited). Rejected and soft-failed events are
// never shown.
func (s *Store) RoomTimeline(ctx context.Context, roomID string, from, to storage.StreamPos, limit int) (_ []storage.RoomEvent, limited bool, err error) {
	defer named("RoomTimeline", &err)
	evs, err := s.roomEvents(ctx, `SELECT `+roomEventColumns+` FROM room_events e
		WHERE e.room_id = $1 AND e.pos > $2 AND e.pos <= $3 AND e.rejected = 0 AND e.soft_failed = 0
		ORDER BY e.pos DESC LIMIT $4`, roomID, from, to, limit+1)
	if err != nil {
		return nil, false, err
	}
	if len(evs) > limit {
		evs, limited = evs[:limit], true
	}
	slices.Reverse(evs)
	return evs, limited, nil
}

// RoomMessages returns up to limit events of a room with positions in
// (from, to], the oldest first when forward, else the newest first: the
// pages of /messages. Rejected and soft-failed events are left out.
func (s *Store) RoomMessages(ctx context.Context, roomID string, from, to storage.StreamPos, limit int, forward bool) (_ []storage.RoomEvent, err error) {
	defer named("RoomMessages", &err)
	if forward {
		return s.roomEvents(ctx, `SELECT `+roomEventColumns+` FROM room_events e
			WHERE e.room_id = $1 AND e.pos > $2 AND e.pos <= $3 AND e.rejected = 0 AND e.soft_failed = 0
			ORDER BY e.pos LIMIT $4`, roomID, from, to, limit)
	}
	return s.roomEvents(ctx, `SELECT `+roomEventColumns+` FROM room_events e
		WHERE e.room_id = $1 AND e.pos > $2 AND e.pos <= $3 AND e.rejected = 0 AND e.soft_failed = 0
		ORDER BY e.pos DESC LIMIT $4`, roomID, from, to, limit)
}

// PutSyncFilter stores a user's filter and returns its ID, the user's
// next number.
func (s *Store) PutSyncFilter(ctx context.Context, userID string, filter []byte) (_ int64, err error) {
	defer named("PutSyncFilter", &err)
	var id int64
	err = s.write(ctx, func(tx *txn) error {
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(filter_id), -1) + 1 FROM sync_filters WHERE user_id = $1`, userID).Scan(&id); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO sync_filters (user_id, filter_id, filter_json) VALUES ($1, $2, $3)`, userID, id, string(filter))
		return err
	})
	return id, err
}

// SyncFilter returns a user's filter, or storage.ErrNotFound.
func (s *Store) SyncFilter(ctx context.Context, userID string, id int64) (_ []byte, err error) {
	defer named("SyncFilter", &err)
	var js string
	err = s.q.QueryRowContext(ctx, `SELECT filter_json FROM sync_filters WHERE user_id = $1 AND filter_id = $2`, userID, id).Scan(&js)
	return []byte(js), notFound(err)
}
