package sqlstore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/keyserver/keyserver/storage"
)

// Login issues an access token for a device, creating the device when it
// is new. Tokens issued earlier for the same device are revoked: a token is
// bound to exactly one device, and naming an existing device takes it over.
func (s *Store) Login(ctx context.Context, login storage.NewLogin) (_ storage.LoginResult, err error) {
	defer named("Login", &err)
	var res storage.LoginResult
	ch, err := s.writeChange(ctx, func(tx *txn) error {
		// The lock orders this login with a deactivation (which updates
		// the row first): a login checked just before it cannot leave a
		// device behind on the closed account.
		var deactivated int64
		err := tx.QueryRowContext(ctx, `SELECT deactivated_ts FROM accounts WHERE user_id = $1`+s.d.forUpdate, login.UserID).
			Scan(&deactivated)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if deactivated != 0 {
			return storage.ErrDeactivated
		}
		res, err = s.login(ctx, tx, login)
		return err
	})
	res.Change = ch
	return res, err
}

func (s *Store) login(ctx context.Context, tx *txn, l storage.NewLogin) (storage.LoginResult, error) {
	var res storage.LoginResult
	r, err := tx.ExecContext(ctx, `
		INSERT INTO devices (user_id, device_id, display_name, created_ts, last_seen_ts, last_seen_ip)
		VALUES ($1, $2, $3, $4, $4, $5)
		ON CONFLICT (user_id, device_id) DO NOTHING`,
		l.UserID, l.DeviceID, l.DisplayName, l.TS, l.IP)
	if err != nil {
		return res, err
	}
	if n, _ := r.RowsAffected(); n > 0 {
		// A new, still keyless device is a change of the user's device list.
		res.DeviceCreated = true
		if res.Pos, err = s.recordLocalChange(ctx, tx, l.UserID, l.DeviceID, false); err != nil {
			return res, err
		}
	} else {
		if _, err := tx.ExecContext(ctx, `DELETE FROM access_tokens WHERE user_id = $1 AND device_id = $2`, l.UserID, l.DeviceID); err != nil {
			return res, err
		}
		if err := s.revokeTokens(ctx, tx, l.UserID); err != nil {
			return res, err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE devices SET last_seen_ts = $1, last_seen_ip = $2 WHERE user_id = $3 AND device_id = $4`,
			l.TS, l.IP, l.UserID, l.DeviceID); err != nil {
			return res, err
		}
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO access_tokens (token_hash, user_id, device_id, created_ts) VALUES ($1, $2, $3, $4)`,
		l.TokenHash, l.UserID, l.DeviceID, l.TS)
	return res, err
}

// TokenOwner returns the user and device an access token belongs to, from
// the token cache when it can.
func (s *Store) TokenOwner(ctx context.Context, tokenHash string) (_ string, _ string, err error) {
	defer named("TokenOwner", &err)
	if o, ok := s.tokens.get(tokenHash); ok {
		return o.userID, o.deviceID, nil
	}
	gen, cache := s.tokens.generation()
	var o tokenOwner
	err = s.q.QueryRowContext(ctx, `SELECT user_id, device_id FROM access_tokens WHERE token_hash = $1`, tokenHash).
		Scan(&o.userID, &o.deviceID)
	if err == nil && cache {
		s.tokens.put(gen, tokenHash, o.userID, o)
	}
	return o.userID, o.deviceID, notFound(err)
}

const deviceColumns = `user_id, device_id, display_name, key_json, last_seen_ip, last_seen_ts`

func scanDevice(sc interface{ Scan(...any) error }) (storage.Device, error) {
	var d storage.Device
	var name sql.NullString
	var keys []byte
	if err := sc.Scan(&d.UserID, &d.DeviceID, &name, &keys, &d.LastSeenIP, &d.LastSeenTS); err != nil {
		return d, err
	}
	if name.Valid {
		d.DisplayName = &name.String
	}
	if keys != nil {
		d.KeyJSON = keys
	}
	return d, nil
}

func (s *Store) queryDevices(ctx context.Context, query string, params ...any) ([]storage.Device, error) {
	rows, err := s.q.QueryContext(ctx, query, params...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.Device
	for rows.Next() {
		d, err := scanDevice(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// Devices lists a user's devices ordered by device ID.
func (s *Store) Devices(ctx context.Context, userID string) (_ []storage.Device, err error) {
	defer named("Devices", &err)
	return s.queryDevices(ctx, `SELECT `+deviceColumns+` FROM devices WHERE user_id = $1 ORDER BY device_id`, userID)
}

// Device returns one device, or storage.ErrNotFound.
func (s *Store) Device(ctx context.Context, userID, deviceID string) (_ storage.Device, err error) {
	defer named("Device", &err)
	d, err := scanDevice(s.q.QueryRowContext(ctx,
		`SELECT `+deviceColumns+` FROM devices WHERE user_id = $1 AND device_id = $2`, userID, deviceID))
	return d, notFound(err)
}

// DevicesWithKeys returns the devices of the given users that have uploaded
// identity keys: from the cache of users' keys, and for the users it lacks
// from a single query however many they are (see UserKeys). The devices
// returned may be shared with the cache and must not be modified. Their
// last-seen fields may be older than the database's: a login to an
// existing device updates them without dropping the cache, as nothing that
// reads this list shows them.
func (s *Store) DevicesWithKeys(ctx context.Context, userIDs []string) (_ []storage.Device, err error) {
	defer named("DevicesWithKeys", &err)
	keys, err := s.userKeys(ctx, userIDs)
	if err != nil {
		return nil, err
	}
	var out []storage.Device
	for _, u := range userIDs {
		if k := keys[u]; k != nil {
			out = append(out, k.Devices...)
		}
	}
	return out, nil
}

// SetDeviceDisplayName renames a device. Renaming to the current name
// changes nothing and returns position 0.
func (s *Store) SetDeviceDisplayName(ctx context.Context, userID, deviceID, name string) (_ storage.Change, err error) {
	defer named("SetDeviceDisplayName", &err)
	return s.writeChange(ctx, func(tx *txn) error {
		var old sql.NullString
		err := tx.QueryRowContext(ctx, `SELECT display_name FROM devices WHERE user_id = $1 AND device_id = $2`+s.d.forUpdate,
			userID, deviceID).Scan(&old)
		if err != nil {
			return notFound(err)
		}
		if old.Valid && old.String == name {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `UPDATE devices SET display_name = $1 WHERE user_id = $2 AND device_id = $3`,
			name, userID, deviceID); err != nil {
			return err
		}
		_, err = s.recordLocalChange(ctx, tx, userID, deviceID, false)
		return err
	})
}

// DeleteDevices deletes devices with everything that belongs to them: access
// tokens, identity keys, one-time and fallback keys. Each deleted device is
// a device-list change.
func (s *Store) DeleteDevices(ctx context.Context, userID string, deviceIDs []string) (_ []string, _ storage.Change, err error) {
	defer named("DeleteDevices", &err)
	var deleted []string
	if deviceIDs != nil && len(deviceIDs) == 0 {
		return nil, storage.Change{}, nil
	}
	ch, err := s.writeChange(ctx, func(tx *txn) error {
		var err error
		deleted, _, err = s.deleteDevices(ctx, tx, userID, deviceIDs)
		return err
	})
	return deleted, ch, err
}

// deleteDevices is DeleteDevices in the caller's transaction.
func (s *Store) deleteDevices(ctx context.Context, tx *txn, userID string, deviceIDs []string) ([]string, storage.StreamPos, error) {
	var (
		deleted []string
		pos     storage.StreamPos
	)
	if deviceIDs != nil && len(deviceIDs) == 0 {
		return nil, 0, nil
	}
	query := `SELECT device_id FROM devices WHERE user_id = $1`
	if deviceIDs != nil {
		query += ` AND device_id IN (` + placeholders(2, len(deviceIDs)) + `)`
	}
	rows, err := tx.QueryContext(ctx, query+` ORDER BY device_id`+s.d.forUpdate, args([]any{userID}, deviceIDs)...)
	if err != nil {
		return nil, 0, err
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, 0, err
		}
		deleted = append(deleted, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	if len(deleted) == 0 {
		return nil, 0, nil
	}
	// An upload to one of the devices either commits first, and its keys
	// are deleted here, or waits and finds the device gone. The rows are
	// locked first, in device order, as lockDeviceKeys requires.
	if err := s.lockDeviceKeys(ctx, tx, userID, deleted); err != nil {
		return nil, 0, err
	}
	in := ` WHERE user_id = $1 AND device_id IN (` + placeholders(2, len(deleted)) + `)`
	// Their to-device inboxes go too, and a dehydrated device its mark.
	for _, table := range []string{"access_tokens", "one_time_keys", "one_time_key_counts", "fallback_keys", "to_device_inbox",
		"dehydrated_devices", "devices"} {
		if _, err := tx.ExecContext(ctx, `DELETE FROM `+table+in, args([]any{userID}, deleted)...); err != nil {
			return nil, 0, err
		}
	}
	// The signatures on the devices go with them.
	if _, err := tx.ExecContext(ctx, `DELETE FROM cross_signing_signatures WHERE target_user_id = $1 AND target_key_id IN (`+
		placeholders(2, len(deleted))+`)`, args([]any{userID}, deleted)...); err != nil {
		return nil, 0, err
	}
	if err := s.revokeTokens(ctx, tx, userID); err != nil {
		return nil, 0, err
	}
	for _, id := range deleted {
		if pos, err = s.recordLocalChange(ctx, tx, userID, id, true); err != nil {
			return nil, 0, err
		}
	}
	return deleted, pos, nil
}
