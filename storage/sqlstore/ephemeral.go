package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"

	"github.com/keyserver/keyserver/storage"
)

// Receipts and typing. Each change of either takes a stream position
// (receipts.pos, typing_rooms.pos), which /sync reads (SyncData), and
// concerns the room's local members. Their EDUs go to the room's other
// servers through the to-device queue, which carries each EDU's type.

// txQueueRoomEDU queues an EDU for the other servers with a member joined
// to the room of members.
func txQueueRoomEDU(ctx context.Context, tx *txn, members memberList, eduType string, content json.RawMessage) error {
	if content == nil {
		return nil
	}
	for _, dest := range members.servers {
		if _, err := tx.ExecContext(ctx, `INSERT INTO outbound_to_device (destination, edu_type, content) VALUES ($1, $2, $3)`,
			dest, eduType, string(content)); err != nil {
			return err
		}
	}
	return nil
}

// StoreReceipt stores a receipt unless it goes back: its event is before
// the stored receipt's (both known).
func (s *Store) StoreReceipt(ctx context.Context, r storage.Receipt, edu json.RawMessage) (_ storage.Change, stored bool, err error) {
	defer named("StoreReceipt", &err)
	ch, err := s.writeChange(ctx, func(tx *txn) error {
		stored = false
		var oldPos storage.StreamPos
		var oldEvent string
		err := tx.QueryRowContext(ctx, `SELECT event_id, event_pos FROM receipts
			WHERE room_id = $1 AND receipt_type = $2 AND user_id = $3 AND thread_id = $4`,
			r.RoomID, r.Type, r.UserID, r.ThreadID).Scan(&oldEvent, &oldPos)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return err
		case oldEvent == r.EventID || (oldPos > 0 && r.EventPos > 0 && r.EventPos < oldPos):
			return nil
		}
		pos, err := s.nextPos(ctx, tx)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO receipts (room_id, receipt_type, user_id, thread_id, event_id, event_pos, ts, pos)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
			ON CONFLICT (room_id, receipt_type, user_id, thread_id) DO UPDATE
			SET event_id = excluded.event_id, event_pos = excluded.event_pos, ts = excluded.ts, pos = excluded.pos`,
			r.RoomID, r.Type, r.UserID, r.ThreadID, r.EventID, r.EventPos, r.TS, pos); err != nil {
			return err
		}
		stored = true
		if r.Type == storage.ReceiptPrivate {
			tx.concern(r.UserID)
			return nil
		}
		members, err := s.txRoomMembers(ctx, tx, r.RoomID, 0)
		if err != nil {
			return err
		}
		s.concernLocalMembers(tx, members)
		return txQueueRoomEDU(ctx, tx, members, "m.receipt", edu)
	})
	return ch, stored, err
}

// RoomReceipts returns a room's receipts.
func (s *Store) RoomReceipts(ctx context.Context, roomID string) (_ []storage.Receipt, err error) {
	defer named("RoomReceipts", &err)
	rows, err := s.q.QueryContext(ctx, `SELECT receipt_type, user_id, thread_id, event_id, event_pos, ts, pos FROM receipts
		WHERE room_id = $1 ORDER BY user_id, receipt_type, thread_id`, roomID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.Receipt
	for rows.Next() {
		r := storage.Receipt{RoomID: roomID}
		if err := rows.Scan(&r.Type, &r.UserID, &r.ThreadID, &r.EventID, &r.EventPos, &r.TS, &r.Pos); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// SetTyping starts or stops a typing.
func (s *Store) SetTyping(ctx context.Context, u storage.TypingUpdate) (_ storage.Change, queued bool, err error) {
	defer named("SetTyping", &err)
	ch, err := s.writeChange(ctx, func(tx *txn) error {
		queued = false
		var end, sent int64
		err := tx.QueryRowContext(ctx, `SELECT expires_ts, sent_ts FROM typing WHERE room_id = $1 AND user_id = $2`,
			u.RoomID, u.UserID).Scan(&end, &sent)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		exists := err == nil
		running := exists && end > u.Now
		resend := false
		if u.Typing {
			resend = running && u.EDU != nil && u.ResendAfter > 0 && sent > 0 && sent <= u.Now-u.ResendAfter
			if u.EDU != nil && (!running || resend) {
				sent = u.Now
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO typing (room_id, user_id, expires_ts, sent_ts) VALUES ($1, $2, $3, $4)
				ON CONFLICT (room_id, user_id) DO UPDATE SET expires_ts = excluded.expires_ts, sent_ts = excluded.sent_ts`,
				u.RoomID, u.UserID, u.ExpiresTS, sent); err != nil {
				return err
			}
			if running && !resend {
				return nil // who is typing is the same
			}
		} else {
			if !exists || (u.ExpiredBy != 0 && end > u.ExpiredBy) {
				return nil
			}
			if _, err := tx.ExecContext(ctx, `DELETE FROM typing WHERE room_id = $1 AND user_id = $2`, u.RoomID, u.UserID); err != nil {
				return err
			}
		}
		members, err := s.txRoomMembers(ctx, tx, u.RoomID, 0)
		if err != nil {
			return err
		}
		if !resend {
			pos, err := s.nextPos(ctx, tx)
			if err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO typing_rooms (room_id, pos) VALUES ($1, $2)
				ON CONFLICT (room_id) DO UPDATE SET pos = excluded.pos`, u.RoomID, pos); err != nil {
				return err
			}
			s.concernLocalMembers(tx, members)
		}
		queued = u.EDU != nil && len(members.servers) > 0
		return txQueueRoomEDU(ctx, tx, members, "m.typing", u.EDU)
	})
	return ch, queued, err
}

// ExpiredTyping returns the typings that ended at or before now.
func (s *Store) ExpiredTyping(ctx context.Context, now int64) (_ []storage.TypingUser, err error) {
	defer named("ExpiredTyping", &err)
	return s.typingUsers(ctx, `SELECT room_id, user_id, expires_ts FROM typing WHERE expires_ts <= $1
		ORDER BY expires_ts LIMIT 1000`, now)
}

// TypingToResend returns the running typings whose EDU was last queued at
// or before sentBefore.
func (s *Store) TypingToResend(ctx context.Context, sentBefore, now int64) (_ []storage.TypingUser, err error) {
	defer named("TypingToResend", &err)
	return s.typingUsers(ctx, `SELECT room_id, user_id, expires_ts FROM typing
		WHERE sent_ts > 0 AND sent_ts <= $1 AND expires_ts > $2 ORDER BY sent_ts LIMIT 1000`, sentBefore, now)
}

func (s *Store) typingUsers(ctx context.Context, query string, params ...any) ([]storage.TypingUser, error) {
	rows, err := s.q.QueryContext(ctx, query, params...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.TypingUser
	for rows.Next() {
		var t storage.TypingUser
		if err := rows.Scan(&t.RoomID, &t.UserID, &t.ExpiresTS); err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// NextTypingWork returns the earliest end of a typing or resend of its
// EDU.
func (s *Store) NextTypingWork(ctx context.Context, resendAfter int64) (_ int64, _ bool, err error) {
	defer named("NextTypingWork", &err)
	var at sql.NullInt64
	if err := s.q.QueryRowContext(ctx, `SELECT MIN(CASE WHEN sent_ts > 0 AND sent_ts + $1 < expires_ts
		THEN sent_ts + $1 ELSE expires_ts END) FROM typing`, resendAfter).Scan(&at); err != nil {
		return 0, false, err
	}
	return at.Int64, at.Valid, nil
}

// RoomTyping returns who is typing in a room at now.
func (s *Store) RoomTyping(ctx context.Context, roomID string, now int64) (_ []string, err error) {
	defer named("RoomTyping", &err)
	return s.userList(ctx, `SELECT user_id FROM typing WHERE room_id = $1 AND expires_ts > $2`, roomID, now)
}
