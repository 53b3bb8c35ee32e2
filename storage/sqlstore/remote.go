package sqlstore

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"strings"

	"github.com/keyserver/keyserver/storage"
)

// UserDeviceList returns what /user/devices reports for a local user: the
// position of their newest device-list change (0 when none) and their
// devices with keys. Both are read from the database, never from the
// device cache: a cached list older than the position would be announced
// as current, and the update carrying the change then dropped as already
// seen. The position is read first, so a change landing in between is in
// the list and announced again after it, never in neither.
func (s *Store) UserDeviceList(ctx context.Context, userID string) (_ int64, _ []storage.Device, err error) {
	defer named("UserDeviceList", &err)
	var id sql.NullInt64
	err = s.q.QueryRowContext(ctx, `SELECT MAX(pos) FROM device_list_changes WHERE user_id = $1`, userID).Scan(&id)
	if err != nil {
		return 0, nil, err
	}
	devices, err := s.queryDevices(ctx, `SELECT `+deviceColumns+` FROM devices
		WHERE key_json IS NOT NULL AND user_id = $1`, userID)
	return id.Int64, devices, err
}

// ServerKeys returns the cached keys of a server among keyIDs.
func (s *Store) ServerKeys(ctx context.Context, serverName string, keyIDs []string) (_ []storage.ServerKey, err error) {
	defer named("ServerKeys", &err)
	if len(keyIDs) == 0 {
		return nil, nil
	}
	rows, err := s.q.QueryContext(ctx, `SELECT key_id, public_key, valid_until_ts, expired_ts FROM server_keys
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
func (s *Store) StoreServerKeys(ctx context.Context, keys []storage.ServerKey) (err error) {
	defer named("StoreServerKeys", &err)
	if len(keys) == 0 {
		return nil
	}
	return s.write(ctx, func(tx *txn) error {
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
func (s *Store) RemoteDeviceLists(ctx context.Context, userIDs []string) (_ map[string]*storage.RemoteDeviceList, err error) {
	defer named("RemoteDeviceLists", &err)
	out := map[string]*storage.RemoteDeviceList{}
	if len(userIDs) == 0 {
		return out, nil
	}
	in := placeholders(1, len(userIDs))
	rows, err := s.q.QueryContext(ctx, `
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

	// The devices, and in the same statement the cross-signing keys (their
	// usage in the device ID's column) and local users' signatures on them
	// (target key, signer, signer's key, signature), told apart by the
	// column "kind".
	rows, err = s.q.QueryContext(ctx, `
		SELECT user_id, device_id, display_name, key_json, '', 0 AS kind FROM remote_devices WHERE user_id IN (`+in+`)
		UNION ALL
		SELECT user_id, usage, NULL, key_json, '', 1 FROM remote_cross_signing_keys WHERE user_id IN (`+in+`)
		UNION ALL
		SELECT target_user_id, target_key_id, signer_user_id, signer_key_id, signature, 2 FROM cross_signing_signatures
		WHERE target_user_id IN (`+in+`)
		ORDER BY 1, 2, 3`, args(nil, userIDs)...)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var userID, extra string
		var d storage.RemoteDevice
		var name sql.NullString
		var kind int
		if err := rows.Scan(&userID, &d.DeviceID, &name, &d.KeyJSON, &extra, &kind); err != nil {
			rows.Close()
			return nil, err
		}
		if name.Valid {
			d.DisplayName = &name.String
		}
		l := out[userID]
		switch {
		case l == nil:
		case kind == 1:
			if l.CrossSigning == nil {
				l.CrossSigning = map[string][]byte{}
			}
			l.CrossSigning[d.DeviceID] = d.KeyJSON
		case kind == 2:
			l.Signatures = append(l.Signatures, storage.CrossSigningSignature{TargetUserID: userID, TargetKeyID: d.DeviceID,
				SignerUserID: name.String, SignerKeyID: string(d.KeyJSON), Signature: extra})
		default:
			l.Devices = append(l.Devices, d)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}

	rows, err = s.q.QueryContext(ctx, `
		SELECT DISTINCT theirs.user_id FROM memberships theirs JOIN memberships ours ON ours.room_id = theirs.room_id
		WHERE ours.user_id LIKE $1 AND ours.membership IN ('join', 'invite') AND theirs.membership IN ('join', 'invite')
		AND theirs.user_id IN (`+placeholders(2, len(userIDs))+`)`,
		args([]any{s.localPattern()}, userIDs)...)
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
func (s *Store) ReplaceRemoteDeviceList(ctx context.Context, list storage.RemoteDeviceList, serverName string) (_ storage.Change, err error) {
	defer named("ReplaceRemoteDeviceList", &err)
	return s.writeChange(ctx, func(tx *txn) error {
		var known int
		var current int64
		err := tx.QueryRowContext(ctx, `SELECT stream_id FROM remote_device_lists WHERE user_id = $1`+s.d.forUpdate, list.UserID).Scan(&current)
		switch {
		case err == nil:
			known = 1
		case err != sql.ErrNoRows:
			return err
		}
		if known == 1 && list.StreamID < current {
			// Updates newer than this answer were applied while it was on
			// its way: the cache is ahead of it, so keep the cache.
			_, err := tx.ExecContext(ctx, `DELETE FROM stale_device_lists WHERE user_id = $1`, list.UserID)
			return err
		}
		old := map[string]storage.RemoteDevice{}
		rows, err := tx.QueryContext(ctx, `SELECT device_id, display_name, key_json FROM remote_devices WHERE user_id = $1`, list.UserID)
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
		keysChanged, err := s.replaceRemoteCrossSigning(ctx, tx, list.UserID, list.CrossSigning, true)
		if err != nil {
			return err
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
		if err := s.rememberStreamID(ctx, tx, list.UserID, list.StreamID); err != nil {
			return err
		}
		// A list seen for the first time is news to nobody: no client can
		// have fetched it from us before (an update that came before it
		// was recorded as a change then).
		if known == 0 {
			return nil
		}
		for _, id := range changed {
			if _, err = s.recordRemoteChange(ctx, tx, list.UserID, id, false); err != nil {
				return err
			}
		}
		for _, id := range gone {
			if _, err = s.recordRemoteChange(ctx, tx, list.UserID, id, true); err != nil {
				return err
			}
		}
		if keysChanged {
			if _, err = s.recordCrossSigningChange(ctx, tx, list.UserID, list.UserID, false); err != nil {
				return err
			}
		}
		return nil
	})
}

// replaceRemoteCrossSigning writes the cross-signing keys of a remote user
// that differ from the cached ones; with all, the usages not named are
// dropped. It reports whether anything changed.
func (s *Store) replaceRemoteCrossSigning(ctx context.Context, tx *txn, userID string, keys map[string][]byte, all bool) (bool, error) {
	rows, err := tx.QueryContext(ctx, `SELECT usage, key_json FROM remote_cross_signing_keys WHERE user_id = $1`, userID)
	if err != nil {
		return false, err
	}
	old := map[string][]byte{}
	for rows.Next() {
		var usage string
		var js []byte
		if err := rows.Scan(&usage, &js); err != nil {
			rows.Close()
			return false, err
		}
		old[usage] = js
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return false, err
	}
	changed := false
	for _, usage := range []string{storage.UsageMaster, storage.UsageSelfSigning} {
		js, ok := keys[usage]
		switch {
		case ok && !bytes.Equal(old[usage], js):
			if _, err := tx.ExecContext(ctx, `INSERT INTO remote_cross_signing_keys (user_id, usage, key_json) VALUES ($1, $2, $3)
				ON CONFLICT (user_id, usage) DO UPDATE SET key_json = excluded.key_json`, userID, usage, string(js)); err != nil {
				return false, err
			}
			changed = true
		case !ok && all && old[usage] != nil:
			if _, err := tx.ExecContext(ctx, `DELETE FROM remote_cross_signing_keys WHERE user_id = $1 AND usage = $2`, userID, usage); err != nil {
				return false, err
			}
			changed = true
		}
	}
	return changed, nil
}

// UpdateRemoteCrossSigning applies an m.signing_key_update to the cache of
// a remote user's keys.
func (s *Store) UpdateRemoteCrossSigning(ctx context.Context, userID string, keys map[string][]byte) (_ storage.Change, err error) {
	defer named("UpdateRemoteCrossSigning", &err)
	return s.writeChange(ctx, func(tx *txn) error {
		var streamID int64
		err := tx.QueryRowContext(ctx, `SELECT stream_id FROM remote_device_lists WHERE user_id = $1`+s.d.forUpdate, userID).Scan(&streamID)
		if errors.Is(err, sql.ErrNoRows) {
			return nil // not tracked: nothing cached to update
		}
		if err != nil {
			return err
		}
		changed, err := s.replaceRemoteCrossSigning(ctx, tx, userID, keys, false)
		if err != nil || !changed {
			return err
		}
		_, err = s.recordCrossSigningChange(ctx, tx, userID, userID, false)
		return err
	})
}

func sameDevice(a, b storage.RemoteDevice) bool {
	if (a.DisplayName == nil) != (b.DisplayName == nil) || (a.DisplayName != nil && *a.DisplayName != *b.DisplayName) {
		return false
	}
	return bytes.Equal(a.KeyJSON, b.KeyJSON)
}

// MarkRemoteStale marks a remote user's cached list as out of date, due
// for a resync now (a user already marked keeps its retry state).
func (s *Store) MarkRemoteStale(ctx context.Context, userID, serverName string, now int64) (err error) {
	defer named("MarkRemoteStale", &err)
	return s.write(ctx, func(tx *txn) error { return markStale(ctx, tx, userID, serverName, now, 0) })
}

// markStale marks a user stale; holdUntil > 0 also holds the resync for
// the caller until then (see HoldResync), taking it from any holder.
func markStale(ctx context.Context, tx *txn, userID, serverName string, now, holdUntil int64) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO stale_device_lists (user_id, server_name, since_ts, attempts, retry_at_ts, resync_until)
		VALUES ($1, $2, $3, 0, 0, $4) ON CONFLICT (user_id) DO UPDATE SET resync_until = excluded.resync_until
		WHERE excluded.resync_until > 0`, userID, serverName, now, holdUntil)
	return err
}

// HoldResync takes a stale user's resync until a time unless another
// daemon holds it.
func (s *Store) HoldResync(ctx context.Context, userID string, now, until int64) (held, stale bool, err error) {
	defer named("HoldResync", &err)
	err = s.write(ctx, func(tx *txn) error {
		var current int64
		err := tx.QueryRowContext(ctx, `SELECT resync_until FROM stale_device_lists WHERE user_id = $1`+s.d.forUpdate, userID).Scan(&current)
		if err == sql.ErrNoRows {
			return nil
		}
		if err != nil {
			return err
		}
		stale = true
		if current > now {
			return nil
		}
		held = true
		_, err = tx.ExecContext(ctx, `UPDATE stale_device_lists SET resync_until = $1 WHERE user_id = $2`, until, userID)
		return err
	})
	return held, stale, err
}

// ReleaseResync gives up a hold on a user's resync.
func (s *Store) ReleaseResync(ctx context.Context, userID string) (err error) {
	defer named("ReleaseResync", &err)
	return s.write(ctx, func(tx *txn) error {
		_, err := tx.ExecContext(ctx, `UPDATE stale_device_lists SET resync_until = 0 WHERE user_id = $1`, userID)
		return err
	})
}

// keptStreamIDs is how many recent stream_ids are remembered per remote
// user: enough for the prev_ids of updates arriving close together.
const keptStreamIDs = 50

// rememberStreamID records a stream_id as seen for a remote user and
// forgets all but the newest few.
func (s *Store) rememberStreamID(ctx context.Context, tx *txn, userID string, streamID int64) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO remote_stream_ids (user_id, stream_id) VALUES ($1, $2)
		ON CONFLICT (user_id, stream_id) DO NOTHING`, userID, streamID); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `DELETE FROM remote_stream_ids WHERE user_id = $1 AND stream_id < (
		SELECT MIN(stream_id) FROM (
			SELECT stream_id FROM remote_stream_ids WHERE user_id = $1 ORDER BY stream_id DESC LIMIT $2) newest)`,
		userID, keptStreamIDs)
	return err
}

// SharesRoomWithLocal reports whether some local user shares a room with
// userID.
func (s *Store) SharesRoomWithLocal(ctx context.Context, userID string) (_ bool, err error) {
	defer named("SharesRoomWithLocal", &err)
	var n int
	err = s.q.QueryRowContext(ctx, sharesRoomWithLocalQuery, userID, s.localPattern()).Scan(&n)
	return n > 0, err
}

// ApplyRemoteDeviceUpdate applies one device-list update of a remote user
// to the cache, in one transaction that also checks its prev_ids against
// the stream_ids seen for the user. An update whose prev_ids are not all
// known (or for a user without a cache) marks the user stale instead.
func (s *Store) ApplyRemoteDeviceUpdate(ctx context.Context, u storage.RemoteDeviceUpdate) (_ storage.ApplyResult, err error) {
	defer named("ApplyRemoteDeviceUpdate", &err)
	var res storage.ApplyResult
	serverName := u.UserID[strings.IndexByte(u.UserID, ':')+1:]
	ch, err := s.writeChange(ctx, func(tx *txn) error {
		res = storage.ApplyResult{}
		var current int64
		err := tx.QueryRowContext(ctx, `SELECT stream_id FROM remote_device_lists WHERE user_id = $1`+s.d.forUpdate, u.UserID).Scan(&current)
		if err == sql.ErrNoRows {
			// No list is cached: it is fetched when a local client first
			// needs it, not on an update (a server announcing a user who
			// joined a large room would otherwise be sent a request by
			// every server of the room). The local users sharing a room
			// with the user are told of the change, so their clients ask.
			res.Outcome = storage.NotCached
			_, err := s.recordRemoteChange(ctx, tx, u.UserID, u.DeviceID, u.Deleted)
			return err
		}
		if err != nil {
			return err
		}
		seen := map[int64]bool{current: true}
		rows, err := tx.QueryContext(ctx, `SELECT stream_id FROM remote_stream_ids WHERE user_id = $1`, u.UserID)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			seen[id] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if seen[u.StreamID] || u.StreamID < current {
			res.Outcome = storage.Duplicate // already applied, or older than the cache
			return nil
		}
		for _, p := range u.PrevIDs {
			if !seen[p] {
				res.Outcome = storage.NeedResync
				return markStale(ctx, tx, u.UserID, serverName, 0, u.ResyncHoldUntil)
			}
		}

		changed := false
		var old storage.RemoteDevice
		var name sql.NullString
		err = tx.QueryRowContext(ctx, `SELECT key_json, display_name FROM remote_devices WHERE user_id = $1 AND device_id = $2`,
			u.UserID, u.DeviceID).Scan(&old.KeyJSON, &name)
		exists := err == nil
		if err != nil && err != sql.ErrNoRows {
			return err
		}
		if name.Valid {
			old.DisplayName = &name.String
		}
		switch {
		case u.Deleted:
			if exists {
				if _, err := tx.ExecContext(ctx, `DELETE FROM remote_devices WHERE user_id = $1 AND device_id = $2`, u.UserID, u.DeviceID); err != nil {
					return err
				}
				changed = true
			}
		case u.KeyJSON != nil:
			nu := storage.RemoteDevice{DeviceID: u.DeviceID, DisplayName: u.DisplayName, KeyJSON: u.KeyJSON}
			old.DeviceID = u.DeviceID
			if !exists || !sameDevice(old, nu) {
				if _, err := tx.ExecContext(ctx, `
					INSERT INTO remote_devices (user_id, device_id, display_name, key_json) VALUES ($1, $2, $3, $4)
					ON CONFLICT (user_id, device_id) DO UPDATE SET display_name = excluded.display_name, key_json = excluded.key_json`,
					u.UserID, u.DeviceID, u.DisplayName, string(u.KeyJSON)); err != nil {
					return err
				}
				changed = true
			}
		}
		// A device without keys is of no use to clients: nothing to cache.
		if _, err := tx.ExecContext(ctx, `UPDATE remote_device_lists SET stream_id = $1 WHERE user_id = $2`, u.StreamID, u.UserID); err != nil {
			return err
		}
		if err := s.rememberStreamID(ctx, tx, u.UserID, u.StreamID); err != nil {
			return err
		}
		res.Outcome = storage.Applied
		if !changed {
			return nil
		}
		_, err = s.recordRemoteChange(ctx, tx, u.UserID, u.DeviceID, u.Deleted)
		return err
	})
	res.Change = ch
	return res, err
}
