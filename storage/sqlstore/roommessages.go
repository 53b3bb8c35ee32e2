package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"

	"github.com/lib/pq"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/storage"
)

// On PostgreSQL every write that advances the /sync stream holds the
// stream's counter from its position to its commit, the log's flush
// included: such writes are one at a time, server-wide. So the room
// messages that wait together are written together, by one statement
// (writeMessages): one flush, one hold of the counter, one round trip
// for all of them, the way SQLite's write queue shares a commit. Only
// plain messages go this way (isPlainMessage): everything else is
// written by WriteRoomEvents. The statement does for each message what
// WriteRoomEvents does for one: the compare of the room's head, the
// transaction ID, the event with its stream position, the extremity, the
// PDUs queued for the room's servers, and the notification of the
// members' /sync requests on the other daemons.

// isPlainMessage says whether w is a message writeMessages can write:
// one event that changes no state, built on a known head of a room with
// one extremity, redacting nothing.
func isPlainMessage(w storage.RoomWrite) bool {
	return w.Create == nil && w.Head != 0 && len(w.Events) == 1 && w.Events[0].StateKey == nil &&
		len(w.Redactions) == 0 && w.Alias == "" && len(w.Extremities) == 1
}

// writeMessage writes a plain message with those waiting (PostgreSQL),
// or, when its room's members are not at hand, by WriteRoomEvents.
func (s *Store) writeMessage(ctx context.Context, w storage.RoomWrite) (_ storage.RoomWriteResult, err error) {
	members, ok := s.cachedMembers(w.StateSnapshot)
	if !ok {
		return s.WriteRoomEvents(ctx, w)
	}
	defer named("WriteRoomEvents", &err)
	p := &pendingWrite{ctx: ctx, message: &w, members: members}
	if _, err := s.messages.write(p); err != nil {
		return storage.RoomWriteResult{}, err
	}
	return p.roomResult, nil
}

// cachedMembers returns the members of a snapshot if they are cached.
func (s *Store) cachedMembers(snapshot int64) (memberList, bool) {
	c := &s.roomMembers
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.lists[snapshot]
	return l, ok
}

// writeMessagesQuery writes the messages given column by column in
// arrays $1-$15 (one element per message, in order; $16 is the time),
// each only if its room still has the head it was built on and its
// client transaction has no event yet; their positions follow one
// another from one move of the counter, in the order given. Each
// replaces its room's one extremity, prev (named by its whole key: see
// txReplaceExtremities). $17 and $18 list their PDUs' destinations
// (message index, server), $20 is the stream notification (on channel
// $19). It returns, for each message whose room it moved, its position,
// or NULL when its transaction turned out to be taken (by a write
// committed meanwhile).
//
// It runs prepared: planning it took ~0.7 ms of PostgreSQL's CPU, more
// than half of what running it takes for a batch of four. Arrays, not
// JSON: PostgreSQL's generic plan for it estimates each unnest at a few
// rows and so looks each room, extremity and transaction up by its index
// (checked against tables of 100,000 rooms and 300,000 transactions);
// with JSON it estimated many more and read whole tables.
const writeMessagesQuery = `
WITH u AS (
	SELECT u.*, x.taken IS NOT NULL AS taken
	FROM unnest($1::int[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[], $6::text[], $7::text[], $8::text[], $9::text[],
		$10::text[], $11::bigint[], $12::text[], $13::text[], $14::text[], $15::text[])
		AS u(i, room_id, head, new_head, depth, event_id, event_type, sender, room_version, event_json, snapshot, txn_user, txn_device, txn_path,
			prev)
	LEFT JOIN LATERAL (SELECT 1 AS taken FROM room_txns t
		WHERE t.user_id = u.txn_user AND t.device_id = u.txn_device AND t.txn_path = u.txn_path LIMIT 1) x ON true
),
r AS (
	UPDATE rooms SET head = u.new_head, depth = GREATEST(rooms.depth, u.depth)
	FROM u WHERE rooms.room_id = u.room_id AND rooms.head = u.head AND NOT u.taken
	RETURNING u.i
),
t AS (
	INSERT INTO room_txns (user_id, device_id, txn_path, event_id, created_ts)
	SELECT u.txn_user, u.txn_device, u.txn_path, u.event_id, $16 FROM u JOIN r USING (i) WHERE u.txn_user IS NOT NULL
	ON CONFLICT DO NOTHING
	RETURNING user_id, device_id, txn_path
),
ok AS (
	SELECT u.i FROM u JOIN r USING (i) WHERE u.txn_user IS NULL
	UNION ALL
	SELECT u.i FROM u JOIN t ON t.user_id = u.txn_user AND t.device_id = u.txn_device AND t.txn_path = u.txn_path
),
n AS (SELECT COUNT(*) AS n FROM ok),
p AS (UPDATE stream_position SET pos = pos + (SELECT n FROM n) WHERE id = 1 RETURNING pos),
placed AS (
	SELECT ok.i, (SELECT pos FROM p) - (SELECT n FROM n) + ROW_NUMBER() OVER (ORDER BY ok.i) AS pos FROM ok
),
e AS (
	INSERT INTO room_events (event_id, room_id, event_type, sender, depth, room_version, event_json, state_before, state_after, pos)
	SELECT u.event_id, u.room_id, u.event_type, u.sender, u.depth, u.room_version, u.event_json, u.snapshot, u.snapshot, placed.pos
	FROM u JOIN placed USING (i) ORDER BY placed.pos
	RETURNING event_nid, event_id
),
x AS (
	UPDATE room_extremities SET event_id = u.event_id FROM u JOIN placed USING (i)
	WHERE room_extremities.room_id = u.room_id AND room_extremities.event_id = u.prev
),
q AS (
	INSERT INTO outbound_pdus (destination, event_nid)
	SELECT d.destination, e.event_nid
	FROM unnest($17::int[], $18::text[]) AS d(i, destination) JOIN u USING (i) JOIN e ON e.event_id = u.event_id
	ORDER BY d.i, d.destination
	ON CONFLICT DO NOTHING
),
notified AS (SELECT pg_notify($19, $20) FROM n WHERE n.n > 0)
SELECT r.i, placed.pos, (SELECT COUNT(*) FROM notified) FROM r LEFT JOIN placed USING (i)`

// writeMessages writes a batch of plain messages (pendingWrite.message),
// of distinct rooms, in one statement.
func (s *Store) writeMessages(batch []*pendingWrite) {
	ctx := context.Background() // each write's own context is not for the others
	live := liveWrites(batch)
	if len(live) == 0 {
		return
	}
	// The statement's arrays, a column each; txn_* are NULL for a
	// message without a client transaction.
	var (
		idx, targetIdx                           []int64
		roomIDs, evIDs, types, senders, versions []string
		jsons, targets                           []string
		heads, newHeads, depths, snapshots       []int64
		prevs                                    []string
		txnUsers, txnDevices, txnPaths           []sql.NullString
		concerned                                []string
		now                                      int64
	)
	for i, w := range live {
		m, ev := w.message, w.message.Events[0]
		idx = append(idx, int64(i))
		roomIDs, evIDs, types = append(roomIDs, m.RoomID), append(evIDs, ev.EventID), append(types, ev.Type)
		senders, versions, jsons = append(senders, ev.Sender), append(versions, ev.RoomVersion), append(jsons, string(ev.JSON))
		heads, newHeads, depths, snapshots = append(heads, m.Head), append(newHeads, m.NewHead), append(depths, ev.Depth), append(snapshots, m.StateSnapshot)
		var user, device, path sql.NullString
		if t := m.Txn; t != nil {
			user, device, path = sql.NullString{String: t.UserID, Valid: true}, sql.NullString{String: t.DeviceID, Valid: true}, sql.NullString{String: t.Path, Valid: true}
		}
		txnUsers, txnDevices, txnPaths = append(txnUsers, user), append(txnDevices, device), append(txnPaths, path)
		prevs = append(prevs, m.Extremities[0])
		if m.Federate {
			for _, d := range s.pduDestinations(w.members.all, nil) {
				targetIdx, targets = append(targetIdx, int64(i)), append(targets, d)
			}
		}
		concerned = append(concerned, w.members.local...)
		now = max(now, m.Now)
	}
	slices.Sort(concerned)
	payload := usersPrefix + strings.Join(slices.Compact(concerned), "\n")
	if len(payload) > maxNotifyPayload {
		payload = ""
	}
	fail := func(err error) {
		for _, w := range live {
			w.err = err
		}
	}
	// PostgreSQL only: s.q runs on s.wdb, prepared.
	rows, err := s.q.QueryContext(ctx, writeMessagesQuery, pq.Array(idx), pq.Array(roomIDs), pq.Array(heads), pq.Array(newHeads),
		pq.Array(depths), pq.Array(evIDs), pq.Array(types), pq.Array(senders), pq.Array(versions), pq.Array(jsons), pq.Array(snapshots),
		pq.Array(txnUsers), pq.Array(txnDevices), pq.Array(txnPaths), pq.Array(prevs), now, pq.Array(targetIdx), pq.Array(targets), streamChannel, payload)
	if err != nil {
		fail(err)
		return
	}
	defer rows.Close()
	moved := make([]bool, len(live))
	positions := make([]storage.StreamPos, len(live))
	for rows.Next() {
		var i int
		var pos *int64
		var notified int // read so that the notification is sent: a CTE without changes runs only when read
		if err := rows.Scan(&i, &pos, &notified); err != nil {
			fail(err)
			return
		}
		moved[i] = true
		if pos != nil {
			positions[i] = storage.StreamPos(*pos)
		}
	}
	if err := rows.Err(); err != nil {
		fail(err)
		return
	}
	for i, w := range live {
		m := w.message
		switch {
		case positions[i] != 0:
			hasTargets := slices.Contains(targetIdx, int64(i))
			w.roomResult = storage.RoomWriteResult{Change: storage.Change{Pos: positions[i], Users: w.members.local},
				PDUsQueued: hasTargets, Head: m.NewHead, StateSnapshot: m.StateSnapshot}
			w.change = w.roomResult.Change
		case moved[i]:
			// The room took the new head but not the event: the
			// transaction was taken meanwhile. The head moves on again,
			// so that writes built on this one fail too.
			w.err = storage.ErrTxnDone
			s.wstmts.sent.Add(1)
			if _, err := s.wdb.ExecContext(ctx, `UPDATE rooms SET head = $1 WHERE room_id = $2 AND head = $3`,
				storage.NewRoomHead(), m.RoomID, m.NewHead); err != nil {
				w.err = errors.Join(w.err, err)
			}
		default:
			w.err = s.whyNotWritten(ctx, m)
		}
	}
}

// whyNotWritten tells why writeMessages left a message out: its
// transaction has its event, its room is unknown, or its room moved.
func (s *Store) whyNotWritten(ctx context.Context, m *storage.RoomWrite) error {
	if t := m.Txn; t != nil {
		if _, err := s.RoomTxnEvent(ctx, *t); err == nil {
			return storage.ErrTxnDone
		} else if !errors.Is(err, storage.ErrNotFound) {
			return err
		}
	}
	var n int
	if err := s.q.QueryRowContext(ctx, `SELECT COUNT(*) FROM rooms WHERE room_id = $1`, m.RoomID).Scan(&n); err != nil {
		return err
	}
	if n == 0 {
		return storage.ErrNotFound
	}
	return storage.ErrRoomMoved
}

// pduDestinations are the servers an event of a room with these members
// goes to: every server with a joined member, but this one and those in
// skip (see txQueueRoomPDUs), sorted.
func (s *Store) pduDestinations(members []roomMember, skip []string) []string {
	var out []string
	for _, m := range members {
		server := matrixid.Server(m.userID)
		if m.membership != storage.MembershipJoin || server == "" || server == s.serverName || slices.Contains(skip, server) {
			continue
		}
		out = append(out, server)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
