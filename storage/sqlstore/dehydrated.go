package sqlstore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/keyserver/keyserver/storage"
)

// CreateDehydratedDevice creates a new, keyless device for a user's next
// dehydrated device: a device without access tokens. An ID already taken
// by another of the user's devices is storage.ErrDeviceExists, unless it
// is the current dehydrated device, which is then deleted first (keys and
// messages included). The device becomes the dehydrated one only with
// SetDehydratedDevice, once its keys are stored.
func (s *Store) CreateDehydratedDevice(ctx context.Context, userID, deviceID, displayName string, now int64) (_ storage.Change, err error) {
	defer named("CreateDehydratedDevice", &err)
	return s.writeChange(ctx, func(tx *txn) error {
		var current string
		err := tx.QueryRowContext(ctx, `SELECT device_id FROM dehydrated_devices WHERE user_id = $1`+s.d.forUpdate, userID).Scan(&current)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if current == deviceID {
			if _, _, err := s.deleteDevices(ctx, tx, userID, []string{deviceID}); err != nil {
				return err
			}
		}
		var name any
		if displayName != "" {
			name = displayName
		}
		r, err := tx.ExecContext(ctx, `
			INSERT INTO devices (user_id, device_id, display_name, created_ts, last_seen_ts, last_seen_ip)
			VALUES ($1, $2, $3, $4, $4, '') ON CONFLICT (user_id, device_id) DO NOTHING`,
			userID, deviceID, name, now)
		if err != nil {
			return err
		}
		if n, err := r.RowsAffected(); err != nil || n == 0 {
			if err == nil {
				err = storage.ErrDeviceExists
			}
			return err
		}
		_, err = s.recordLocalChange(ctx, tx, userID, deviceID, false)
		return err
	})
}

// SetDehydratedDevice makes a device (made by CreateDehydratedDevice, its
// keys stored) the user's dehydrated device, with its device_data. The
// previous one is deleted, with its keys and to-device messages.
func (s *Store) SetDehydratedDevice(ctx context.Context, userID, deviceID string, data []byte) (_ storage.Change, err error) {
	defer named("SetDehydratedDevice", &err)
	return s.writeChange(ctx, func(tx *txn) error {
		var old string
		err := tx.QueryRowContext(ctx, `SELECT device_id FROM dehydrated_devices WHERE user_id = $1`+s.d.forUpdate, userID).Scan(&old)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if old != "" && old != deviceID {
			if _, _, err := s.deleteDevices(ctx, tx, userID, []string{old}); err != nil {
				return err
			}
		}
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM devices WHERE user_id = $1 AND device_id = $2`, userID, deviceID).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return storage.ErrNotFound // deleted meanwhile
		}
		_, err = tx.ExecContext(ctx, `
			INSERT INTO dehydrated_devices (user_id, device_id, device_data) VALUES ($1, $2, $3)
			ON CONFLICT (user_id) DO UPDATE SET device_id = excluded.device_id, device_data = excluded.device_data`,
			userID, deviceID, string(data))
		return err
	})
}

// DehydratedDevice returns the ID and device_data of the user's dehydrated
// device, or storage.ErrNotFound.
func (s *Store) DehydratedDevice(ctx context.Context, userID string) (_ string, _ []byte, err error) {
	defer named("DehydratedDevice", &err)
	var id, data string
	err = s.q.QueryRowContext(ctx, `SELECT device_id, device_data FROM dehydrated_devices WHERE user_id = $1`, userID).Scan(&id, &data)
	return id, []byte(data), notFound(err)
}

// DeleteDehydratedDevice deletes the user's dehydrated device (keys and
// messages included) and returns its ID, or storage.ErrNotFound.
func (s *Store) DeleteDehydratedDevice(ctx context.Context, userID string) (_ string, _ storage.Change, err error) {
	defer named("DeleteDehydratedDevice", &err)
	var id string
	ch, err := s.writeChange(ctx, func(tx *txn) error {
		if err := tx.QueryRowContext(ctx, `SELECT device_id FROM dehydrated_devices WHERE user_id = $1`+s.d.forUpdate, userID).Scan(&id); err != nil {
			return notFound(err)
		}
		_, _, err := s.deleteDevices(ctx, tx, userID, []string{id})
		return err
	})
	return id, ch, err
}
