package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"

	"github.com/keyserver/keyserver/storage"
)

// The push side: pushers, and the notifications that room events gave
// users (for the unread counts of /sync and the pushes to gateways).

// livePusher holds for a pusher whose device still has an access token.
const livePusher = `EXISTS (SELECT 1 FROM access_tokens t WHERE t.user_id = p.user_id AND t.device_id = p.device_id)`

// Pushers returns a user's pushers, those of devices logged out left out.
func (s *Store) Pushers(ctx context.Context, userID string) (_ []storage.Pusher, err error) {
	defer named("Pushers", &err)
	rows, err := s.q.QueryContext(ctx, `SELECT p.user_id, p.device_id, p.app_id, p.pushkey, p.kind, p.app_display_name,
		p.device_display_name, p.profile_tag, p.lang, p.data, p.pushkey_ts
		FROM pushers p WHERE p.user_id = $1 AND `+livePusher+` ORDER BY p.app_id, p.pushkey`, userID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.Pusher
	for rows.Next() {
		var p storage.Pusher
		var data string
		if err := rows.Scan(&p.UserID, &p.DeviceID, &p.AppID, &p.Pushkey, &p.Kind, &p.AppDisplayName,
			&p.DeviceDisplayName, &p.ProfileTag, &p.Lang, &data, &p.PushkeyTS); err != nil {
			return nil, err
		}
		p.Data = json.RawMessage(data)
		out = append(out, p)
	}
	return out, rows.Err()
}

// SetPusher adds a pusher or replaces the user's of the same app ID and
// pushkey. Unless appending, the pushers of other users with that app ID
// and pushkey go (the device changed hands). The user's pushers of
// devices logged out go too.
func (s *Store) SetPusher(ctx context.Context, p storage.Pusher, appendPusher bool) (err error) {
	defer named("SetPusher", &err)
	return s.write(ctx, func(tx *txn) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM pushers WHERE user_id = $1 AND NOT EXISTS (
			SELECT 1 FROM access_tokens t WHERE t.user_id = pushers.user_id AND t.device_id = pushers.device_id)`, p.UserID); err != nil {
			return err
		}
		if !appendPusher {
			if _, err := tx.ExecContext(ctx, `DELETE FROM pushers WHERE app_id = $1 AND pushkey = $2 AND user_id <> $3`,
				p.AppID, p.Pushkey, p.UserID); err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO pushers (user_id, device_id, app_id, pushkey, kind, app_display_name,
			device_display_name, profile_tag, lang, data, pushkey_ts) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
			ON CONFLICT (user_id, app_id, pushkey) DO UPDATE SET device_id = excluded.device_id, kind = excluded.kind,
			app_display_name = excluded.app_display_name, device_display_name = excluded.device_display_name,
			profile_tag = excluded.profile_tag, lang = excluded.lang, data = excluded.data, pushkey_ts = excluded.pushkey_ts`,
			p.UserID, p.DeviceID, p.AppID, p.Pushkey, p.Kind, p.AppDisplayName, p.DeviceDisplayName, p.ProfileTag, p.Lang,
			string(p.Data), p.PushkeyTS)
		return err
	})
}

// DeletePusher removes a user's pusher; deleting one that is not there
// is no error.
func (s *Store) DeletePusher(ctx context.Context, userID, appID, pushkey string) (err error) {
	defer named("DeletePusher", &err)
	return s.write(ctx, func(tx *txn) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM pushers WHERE user_id = $1 AND app_id = $2 AND pushkey = $3`, userID, appID, pushkey)
		return err
	})
}

// PushCursor returns the position up to which room events have been
// evaluated for notifications.
func (s *Store) PushCursor(ctx context.Context) (_ storage.StreamPos, err error) {
	defer named("PushCursor", &err)
	var pos storage.StreamPos
	err = s.q.QueryRowContext(ctx, `SELECT pos FROM push_cursor WHERE id = 1`).Scan(&pos)
	return pos, err
}

// PushEvents returns up to limit room events in (after, upTo], in stream
// order: those with a position, neither rejected nor soft-failed, and the
// invites of users with pushers to rooms this server is not in (outliers,
// whose position is that of the invitee's membership). There is no index
// on the position alone (see migration 19): each room's range is read by
// its timeline index, the rooms the outer loop (CROSS JOIN fixes that
// order on SQLite, which would otherwise scan every event).
func (s *Store) PushEvents(ctx context.Context, after, upTo storage.StreamPos, limit int) (_ []storage.PushEvent, err error) {
	defer named("PushEvents", &err)
	rows, err := s.q.QueryContext(ctx, `SELECT x.event_id, x.room_id, x.sender, x.event_json, x.pos FROM (
		SELECT e.event_id, e.room_id, e.sender, e.event_json, e.pos
			FROM rooms r CROSS JOIN room_events e
			WHERE e.room_id = r.room_id AND e.pos > $1 AND e.pos <= $2 AND e.rejected = 0 AND e.soft_failed = 0
		UNION ALL
		SELECT e.event_id, e.room_id, e.sender, e.event_json, c.pos
			FROM room_current_state c JOIN room_events e ON e.event_nid = c.event_nid
			WHERE c.event_type = 'm.room.member' AND c.membership = 'invite' AND c.state_key IN (SELECT user_id FROM pushers)
			AND e.pos IS NULL AND c.pos > $1 AND c.pos <= $2) x
		ORDER BY x.pos LIMIT $3`, after, upTo, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.PushEvent
	for rows.Next() {
		var e storage.PushEvent
		var js string
		if err := rows.Scan(&e.EventID, &e.RoomID, &e.Sender, &js, &e.Pos); err != nil {
			return nil, err
		}
		e.JSON = []byte(js)
		out = append(out, e)
	}
	return out, rows.Err()
}

// PushRoomState returns a room's joined members with their member
// events, and its power levels, as the room's current state has them.
func (s *Store) PushRoomState(ctx context.Context, roomID string) (_ storage.PushRoomState, err error) {
	defer named("PushRoomState", &err)
	rows, err := s.q.QueryContext(ctx, `SELECT c.event_type, c.state_key, e.event_json
		FROM room_current_state c JOIN room_events e ON e.event_nid = c.event_nid
		WHERE c.room_id = $1 AND ((c.event_type = 'm.room.member' AND c.membership = 'join')
			OR (c.event_type IN ('m.room.power_levels', 'm.room.create') AND c.state_key = ''))`, roomID)
	if err != nil {
		return storage.PushRoomState{}, err
	}
	defer rows.Close()
	st := storage.PushRoomState{Members: map[string][]byte{}}
	for rows.Next() {
		var typ, key, js string
		if err := rows.Scan(&typ, &key, &js); err != nil {
			return storage.PushRoomState{}, err
		}
		switch typ {
		case "m.room.power_levels":
			st.PowerLevels = []byte(js)
		case "m.room.create":
			st.Create = []byte(js)
		default:
			st.Members[key] = []byte(js)
		}
	}
	return st, rows.Err()
}

// CommitPushes records the notifications and reads of the events in
// (from, to] and moves the cursor to to, in one transaction, if the cursor
// is still at from; false (and nothing written) when another process
// moved it first.
func (s *Store) CommitPushes(ctx context.Context, from, to storage.StreamPos, notifications []storage.PushNotification, reads []storage.PushRead) (claimed bool, err error) {
	defer named("CommitPushes", &err)
	err = s.write(ctx, func(tx *txn) error {
		claimed = false
		r, err := tx.ExecContext(ctx, `UPDATE push_cursor SET pos = $1 WHERE id = 1 AND pos = $2`, to, from)
		if err != nil {
			return err
		}
		if n, err := r.RowsAffected(); err != nil || n == 0 {
			return err
		}
		for _, n := range notifications {
			if _, err := tx.ExecContext(ctx, `INSERT INTO push_notifications (user_id, room_id, event_id, pos, highlight, ts)
				VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (user_id, event_id) DO NOTHING`,
				n.UserID, n.RoomID, n.EventID, n.Pos, boolInt(n.Highlight), n.TS); err != nil {
				return err
			}
		}
		for _, rd := range reads {
			if err := txPushRead(ctx, tx, rd); err != nil {
				return err
			}
		}
		claimed = true
		return nil
	})
	return claimed && err == nil, err
}

// MarkPushRead records that a user read a room up to a position (never
// moving back): the notifications at or before it stop counting.
func (s *Store) MarkPushRead(ctx context.Context, rd storage.PushRead) (err error) {
	defer named("MarkPushRead", &err)
	return s.write(ctx, func(tx *txn) error { return txPushRead(ctx, tx, rd) })
}

func txPushRead(ctx context.Context, tx *txn, rd storage.PushRead) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO push_read (user_id, room_id, pos) VALUES ($1, $2, $3)
		ON CONFLICT (user_id, room_id) DO UPDATE SET pos = excluded.pos WHERE excluded.pos > push_read.pos`,
		rd.UserID, rd.RoomID, rd.Pos); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `DELETE FROM push_notifications WHERE user_id = $1 AND room_id = $2 AND pos <= $3`,
		rd.UserID, rd.RoomID, rd.Pos)
	return err
}

// UnreadCounts returns a user's unread notifications per room, counting
// those at positions up to upTo after the user's read position in the
// room; rooms without any are left out.
func (s *Store) UnreadCounts(ctx context.Context, userID string, upTo storage.StreamPos) (_ map[string]storage.UnreadCount, err error) {
	defer named("UnreadCounts", &err)
	rows, err := s.q.QueryContext(ctx, `SELECT n.room_id, COUNT(*), SUM(n.highlight) FROM push_notifications n
		WHERE n.user_id = $1 AND n.pos <= $2
		AND n.pos > COALESCE((SELECT r.pos FROM push_read r WHERE r.user_id = n.user_id AND r.room_id = n.room_id), 0)
		GROUP BY n.room_id`, userID, upTo)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]storage.UnreadCount{}
	for rows.Next() {
		var room string
		var c storage.UnreadCount
		var highlights sql.NullInt64
		if err := rows.Scan(&room, &c.Notifications, &highlights); err != nil {
			return nil, err
		}
		c.Highlights = int(highlights.Int64)
		out[room] = c
	}
	return out, rows.Err()
}
