package sqlstore

import (
	"bytes"
	"context"
	"database/sql"
	"strings"

	"github.com/keyserver/keyserver/storage"
)

// DeviceListStreamID returns the position of the user's newest device-list
// change, 0 when there is none.
func (s *Store) DeviceListStreamID(ctx context.Context, userID string) (int64, error) {
	var id sql.NullInt64
	err := s.db.QueryRowContext(ctx, `SELECT MAX(pos) FROM device_list_changes WHERE user_id = $1`, userID).Scan(&id)
	return id.Int64, err
}

// ServerKeys returns the cached keys of a server among keyIDs.
func (s *Store) ServerKeys(ctx context.Context, serverName string, keyIDs []string) ([]storage.ServerKey, error) {
	if len(keyIDs) == 0 {
		return nil, nil
	}
	rows, err := s.db.QueryContext(ctx, `SELECT key_id, public_key, valid_until_ts, expired_ts FROM server_keys
		WHERE server_name = $1 AND key_id IN (`+placeholders(2, len(keyIDs))+`)`, args([]any{serverName}, keyIDs)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.ServerKey
	for rows.Next() {
		k := storage.ServerKey{ServerName: serverName}
		if err := rows.Scan(&k.KeyID, &k.PublicKey, &k.ValidUntilTS, &k.ExpiredTS); err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// StoreServerKeys caches server keys, replacing what was known of them.
func (s *Store) StoreServerKeys(ctx context.Context, keys []storage.ServerKey) error {
	if len(keys) == 0 {
		return nil
	}
	return s.write(ctx, func(tx *sql.Tx) error {
		for _, k := range keys {
			if _, err := tx.ExecContext(ctx, `
				INSERT INTO server_keys (server_name, key_id, public_key, valid_until_ts, expired_ts) VALUES ($1, $2, $3, $4, $5)
				ON CONFLICT (server_name, key_id) DO UPDATE SET public_key = excluded.public_key,
					valid_until_ts = excluded.valid_until_ts, expired_ts = excluded.expired_ts`,
				k.ServerName, k.KeyID, k.PublicKey, k.ValidUntilTS, k.ExpiredTS); err != nil {
				return err
			}
		}
		return nil
	})
}

// RemoteDeviceLists reads the cached lists of the given users in three
// queries: the lists with their stale marks, their devices, and which of
// them share a room with a local user.
func (s *Store) RemoteDeviceLists(ctx context.Context, userIDs []string, localServer string) (map[string]*storage.RemoteDeviceList, error) {
	out := map[string]*storage.RemoteDeviceList{}
	if len(userIDs) == 0 {
		return out, nil
	}
	in := placeholders(1, len(userIDs))
	rows, err := s.db.QueryContext(ctx, `
		SELECT l.user_id, l.stream_id, l.fetched_ts, s.user_id IS NOT NULL
		FROM remote_device_lists l LEFT JOIN stale_device_lists s ON s.user_id = l.user_id
		WHERE l.user_id IN (`+in+`)`, args(nil, userIDs)...)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		l := &storage.RemoteDeviceList{}
		if err := rows.Scan(&l.UserID, &l.StreamID, &l.FetchedTS, &l.Stale); err != nil {
			rows.Close()
			return nil, err
		}
		out[l.UserID] = l
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return out, nil
	}

	rows, err = s.db.QueryContext(ctx, `SELECT user_id, device_id, display_name, key_json FROM remote_devices
		WHERE user_id IN (`+in+`) ORDER BY user_id, device_id`, args(nil, userIDs)...)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var userID string
		var d storage.RemoteDevice
		var name sql.NullString
		if err := rows.Scan(&userID, &d.DeviceID, &name, &d.KeyJSON); err != nil {
			rows.Close()
			return nil, err
		}
		if name.Valid {
			d.DisplayName = &name.String
		}
		if l := out[userID]; l != nil {
			l.Devices = append(l.Devices, d)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}

	// Server names hold no LIKE wildcards, so the suffix names exactly the
	// local users.
	rows, err = s.db.QueryContext(ctx, `
		SELECT DISTINCT theirs.user_id FROM memberships theirs JOIN memberships ours ON ours.room_id = theirs.room_id
		WHERE ours.user_id LIKE $1 AND ours.membership = 'join' AND theirs.membership = 'join'
		AND theirs.user_id IN (`+placeholders(2, len(userIDs))+`)`,
		args([]any{"%:" + strings.NewReplacer("%", "", "_", "").Replace(localServer)}, userIDs)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var userID string
		if err := rows.Scan(&userID); err != nil {
			return nil, err
		}
		if l := out[userID]; l != nil {
			l.SharesRoom = true
		}
	}
	return out, rows.Err()
}

// ReplaceRemoteDeviceList stores a fetched list in place of the cached one.
func (s *Store) ReplaceRemoteDeviceList(ctx context.Context, list storage.RemoteDeviceList, serverName string) (storage.StreamPos, error) {
	var pos storage.StreamPos
	err := s.write(ctx, func(tx *sql.Tx) error {
		pos = 0
		var known int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM remote_device_lists WHERE user_id = $1`, list.UserID).Scan(&known); err != nil {
			return err
		}
		old := map[string]storage.RemoteDevice{}
		rows, err := tx.QueryContext(ctx, `SELECT device_id, display_name, key_json FROM remote_devices WHERE user_id = $1`+s.d.forUpdate, list.UserID)
		if err != nil {
			return err
		}
		for rows.Next() {
			var d storage.RemoteDevice
			var name sql.NullString
			if err := rows.Scan(&d.DeviceID, &name, &d.KeyJSON); err != nil {
				rows.Close()
				return err
			}
			if name.Valid {
				d.DisplayName = &name.String
			}
			old[d.DeviceID] = d
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}

		// Only what differs is written, and only a difference is a change.
		var changed []string
		seen := map[string]bool{}
		for _, d := range list.Devices {
			seen[d.DeviceID] = true
			if o, ok := old[d.DeviceID]; ok && sameDevice(o, d) {
				continue
			}
			changed = append(changed, d.DeviceID)
			if _, err := tx.ExecContext(ctx, `
				INSERT INTO remote_devices (user_id, device_id, display_name, key_json) VALUES ($1, $2, $3, $4)
				ON CONFLICT (user_id, device_id) DO UPDATE SET display_name = excluded.display_name, key_json = excluded.key_json`,
				list.UserID, d.DeviceID, d.DisplayName, string(d.KeyJSON)); err != nil {
				return err
			}
		}
		var gone []string
		for id := range old {
			if !seen[id] {
				gone = append(gone, id)
			}
		}
		if len(gone) > 0 {
			if _, err := tx.ExecContext(ctx, `DELETE FROM remote_devices WHERE user_id = $1 AND device_id IN (`+placeholders(2, len(gone))+`)`,
				args([]any{list.UserID}, gone)...); err != nil {
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, `
			INSERT INTO remote_device_lists (user_id, server_name, stream_id, fetched_ts) VALUES ($1, $2, $3, $4)
			ON CONFLICT (user_id) DO UPDATE SET stream_id = excluded.stream_id, fetched_ts = excluded.fetched_ts`,
			list.UserID, serverName, list.StreamID, list.FetchedTS); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM stale_device_lists WHERE user_id = $1`, list.UserID); err != nil {
			return err
		}
		// A list seen for the first time is news to nobody: no client can
		// have fetched it from us before.
		if known == 0 {
			return nil
		}
		for _, id := range changed {
			if pos, err = recordDeviceChange(ctx, tx, list.UserID, id, false); err != nil {
				return err
			}
		}
		for _, id := range gone {
			if pos, err = recordDeviceChange(ctx, tx, list.UserID, id, true); err != nil {
				return err
			}
		}
		return nil
	})
	return pos, err
}

func sameDevice(a, b storage.RemoteDevice) bool {
	if (a.DisplayName == nil) != (b.DisplayName == nil) || (a.DisplayName != nil && *a.DisplayName != *b.DisplayName) {
		return false
	}
	return bytes.Equal(a.KeyJSON, b.KeyJSON)
}

// MarkRemoteStale marks a remote user's cached list as out of date.
func (s *Store) MarkRemoteStale(ctx context.Context, userID, serverName string, now int64) error {
	return s.write(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO stale_device_lists (user_id, server_name, since_ts) VALUES ($1, $2, $3)
			ON CONFLICT (user_id) DO NOTHING`, userID, serverName, now)
		return err
	})
}
