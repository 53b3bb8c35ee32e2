package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"

	"github.com/lib/pq"

	"github.com/keyserver/keyserver/storage"
)

// On PostgreSQL every write that advances the /sync stream holds the
// stream's counter from its position to its commit, the log's flush
// included: such writes are one at a time, server-wide. So the room
// messages that wait together are written together, by one call of a
// function (writeMessages): one flush, one hold of the counter, one round
// trip for all of them, the way SQLite's write queue shares a commit.
// Only plain messages go this way (isPlainMessage): everything else is
// written by WriteRoomEvents. The function does for each message what
// WriteRoomEvents does for one: the compare of the room's head, the
// transaction ID, the event with its stream position, the extremity, the
// PDUs queued for the room's servers, and the notification of the
// members' /sync requests on the other daemons.

// isPlainMessage says whether w is a message writeMessages can write:
// one event that changes no state, built on a known head of a room with
// one extremity, redacting nothing, declaring no relation.
func isPlainMessage(w storage.RoomWrite) bool {
	return w.Create == nil && w.Head != 0 && len(w.Events) == 1 && w.Events[0].StateKey == nil &&
		len(w.Redactions) == 0 && w.Alias == "" && len(w.Extremities) == 1 && !hasRelation(w)
}

// writeMessage writes a plain message, whose room's members are at
// hand, with those waiting (PostgreSQL).
func (s *Store) writeMessage(ctx context.Context, w storage.RoomWrite, members memberList) (_ storage.RoomWriteResult, err error) {
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

// writeMessagesQuery calls write_room_messages (migrations.go) with the
// batch given column by column, one array element per message, in order.
// A function rather than one statement of common table expressions: its
// statements run one message after the other, so that a message can
// follow another of its room in the same batch (the second compares the
// head the first left), and PostgreSQL keeps their plans.
const writeMessagesQuery = `SELECT msg, outcome, at_pos FROM write_room_messages($1, $2, $3, $4, $5, $6, $7, $8, $9, $10,
	$11, $12, $13, $14, $15, $16, $17, $18, $19)`

// writeMessages writes a batch of plain messages (pendingWrite.message)
// in one call; those of one room are in the order they were built.
func (s *Store) writeMessages(batch []*pendingWrite) {
	ctx := context.Background() // each write's own context is not for the others
	live := liveWrites(batch)
	if len(live) == 0 {
		return
	}
	// The function's arrays, a column each; txn_* are NULL for a
	// message without a client transaction.
	var (
		roomIDs, evIDs, types, senders, versions, prevs []string
		jsons, targets                                  []string
		heads, newHeads, depths, snapshots              []int64
		targetIdx                                       []int64
		txnUsers, txnDevices, txnPaths                  []sql.NullString
		concerned                                       [][]string // the local members of each snapshot
		seen                                            []roomSnapshot
		now                                             int64
	)
	for i, w := range live {
		m, ev := w.message, w.message.Events[0]
		roomIDs, evIDs, types = append(roomIDs, m.RoomID), append(evIDs, ev.EventID), append(types, ev.Type)
		senders, versions, jsons = append(senders, ev.Sender), append(versions, ev.RoomVersion), append(jsons, string(ev.JSON))
		heads, newHeads = append(heads, m.Head), append(newHeads, m.NewHead)
		depths, snapshots, prevs = append(depths, ev.Depth), append(snapshots, m.StateSnapshot), append(prevs, m.Extremities[0])
		var user, device, path sql.NullString
		if t := m.Txn; t != nil {
			user, device, path = sql.NullString{String: t.UserID, Valid: true}, sql.NullString{String: t.DeviceID, Valid: true}, sql.NullString{String: t.Path, Valid: true}
		}
		txnUsers, txnDevices, txnPaths = append(txnUsers, user), append(txnDevices, device), append(txnPaths, path)
		if m.Federate {
			for _, d := range w.members.servers {
				targetIdx, targets = append(targetIdx, int64(i)), append(targets, d)
			}
		}
		if k := (roomSnapshot{m.RoomID, m.StateSnapshot}); !slices.Contains(seen, k) {
			seen, concerned = append(seen, k), append(concerned, w.members.local)
		}
		now = max(now, m.Now)
	}
	payload := notifyPayload(concerned...)
	fail := func(err error) {
		for _, w := range live {
			w.err = err
		}
	}
	// PostgreSQL only: s.q runs on s.wdb, prepared.
	rows, err := s.q.QueryContext(ctx, writeMessagesQuery, pq.Array(roomIDs), pq.Array(heads), pq.Array(newHeads),
		pq.Array(depths), pq.Array(evIDs), pq.Array(types), pq.Array(senders), pq.Array(versions), pq.Array(jsons), pq.Array(snapshots),
		pq.Array(prevs), pq.Array(txnUsers), pq.Array(txnDevices), pq.Array(txnPaths), now, pq.Array(targetIdx), pq.Array(targets),
		s.channels.stream, payload)
	if err != nil {
		fail(err)
		return
	}
	defer rows.Close()
	outcomes := make([]int, len(live))
	for i := range outcomes {
		outcomes[i] = -1
	}
	positions := make([]storage.StreamPos, len(live))
	for rows.Next() {
		var i, outcome int
		var pos sql.NullInt64
		if err := rows.Scan(&i, &outcome, &pos); err != nil {
			fail(err)
			return
		}
		if i < 0 || i >= len(live) {
			fail(fmt.Errorf("write_room_messages answered for message %d of %d", i, len(live)))
			return
		}
		outcomes[i], positions[i] = outcome, storage.StreamPos(pos.Int64)
	}
	if err := rows.Err(); err != nil {
		fail(err)
		return
	}
	for i, w := range live {
		m := w.message
		switch outcomes[i] {
		case 0:
			hasTargets := slices.Contains(targetIdx, int64(i))
			w.roomResult = storage.RoomWriteResult{Change: storage.Change{Pos: positions[i], Users: w.members.local},
				PDUsQueued: hasTargets, Head: m.NewHead, StateSnapshot: m.StateSnapshot}
			w.change = w.roomResult.Change
		case 2:
			w.err = storage.ErrTxnDone
		default:
			w.err = s.whyNotWritten(ctx, m)
		}
	}
}

// roomSnapshot is a room's state snapshot: the messages of one in a
// batch have the same members.
type roomSnapshot struct {
	room     string
	snapshot int64
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
