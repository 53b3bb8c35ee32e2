package sqlstore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/keyserver/keyserver/storage"
)

// Server-side key backups (package keybackup). Every change of a user's
// backups first locks the user's row of backup_users, so that they happen
// one at a time: a new version cannot become current in the middle of an
// upload, and a key's replacement is decided on what is stored when it is
// written. Reads take no lock.

// CreateBackupVersion creates a backup version, which becomes the user's
// current one, and returns its number: one more than the last version the
// user had, deleted ones included.
func (s *Store) CreateBackupVersion(ctx context.Context, userID, algorithm string, authData []byte) (_ int64, err error) {
	defer named("CreateBackupVersion", &err)
	var version int64
	err = s.write(ctx, func(tx *txn) error {
		if err := tx.QueryRowContext(ctx, `
			INSERT INTO backup_users (user_id, last_version) VALUES ($1, 1)
			ON CONFLICT (user_id) DO UPDATE SET last_version = backup_users.last_version + 1
			RETURNING last_version`, userID).Scan(&version); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `
			INSERT INTO backup_versions (user_id, version, algorithm, auth_data, etag, key_count) VALUES ($1, $2, $3, $4, 0, 0)`,
			userID, version, algorithm, string(authData))
		return err
	})
	return version, err
}

// BackupVersion returns one of the user's backup versions, the current
// one when version is 0, or storage.ErrNotFound (never created, deleted,
// or no version at all).
func (s *Store) BackupVersion(ctx context.Context, userID string, version int64) (_ storage.BackupVersion, err error) {
	defer named("BackupVersion", &err)
	var row *sql.Row
	if version == 0 {
		row = s.q.QueryRowContext(ctx, `SELECT version, algorithm, auth_data, etag, key_count FROM backup_versions
			WHERE user_id = $1 ORDER BY version DESC LIMIT 1`, userID)
	} else {
		row = s.q.QueryRowContext(ctx, `SELECT version, algorithm, auth_data, etag, key_count FROM backup_versions
			WHERE user_id = $1 AND version = $2`, userID, version)
	}
	var v storage.BackupVersion
	var authData string
	if err := row.Scan(&v.Version, &v.Algorithm, &authData, &v.ETag, &v.Count); err != nil {
		return storage.BackupVersion{}, notFound(err)
	}
	v.AuthData = []byte(authData)
	return v, nil
}

// UpdateBackupVersion replaces the auth_data of a version, or returns
// storage.ErrNotFound. Its keys, etag and count stay as they are.
func (s *Store) UpdateBackupVersion(ctx context.Context, userID string, version int64, authData []byte) (err error) {
	defer named("UpdateBackupVersion", &err)
	return s.writeStatements(ctx, func(q querier) error {
		res, err := q.ExecContext(ctx, `UPDATE backup_versions SET auth_data = $1 WHERE user_id = $2 AND version = $3`,
			string(authData), userID, version)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return storage.ErrNotFound
		}
		return nil
	})
}

// DeleteBackupVersion deletes a version with its keys. existed is false
// only for a version that was never created; deleting a version again
// is not an error.
func (s *Store) DeleteBackupVersion(ctx context.Context, userID string, version int64) (existed bool, err error) {
	defer named("DeleteBackupVersion", &err)
	err = s.write(ctx, func(tx *txn) error {
		last, err := s.lockBackups(ctx, tx, userID)
		if err != nil || version < 1 || version > last {
			existed = false
			if errors.Is(err, storage.ErrNotFound) {
				return nil
			}
			return err
		}
		existed = true
		if _, err := tx.ExecContext(ctx, `DELETE FROM backup_keys WHERE user_id = $1 AND version = $2`, userID, version); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM backup_versions WHERE user_id = $1 AND version = $2`, userID, version)
		return err
	})
	return existed, err
}

// PutBackupKeys stores keys in a version, if it is the user's current one:
// a key new to the version is added; one it holds already is replaced when
// replaces(stored, uploaded) says so, else left as it is. The etag is
// bumped once when anything was written. storage.ErrNotFound: the version
// does not exist. When it is not the current version nothing is written,
// and the result's Current says which one is.
func (s *Store) PutBackupKeys(ctx context.Context, userID string, version int64, keys []storage.BackupKey,
	replaces func(stored, uploaded storage.BackupKey) bool) (_ storage.BackupKeysResult, err error) {
	defer named("PutBackupKeys", &err)
	var res storage.BackupKeysResult
	err = s.write(ctx, func(tx *txn) error {
		var err error
		if res, err = s.lockedVersion(ctx, tx, userID, version); err != nil {
			return err
		}
		if res.Current != version {
			return nil
		}
		changed := false
		for _, k := range keys {
			stored := storage.BackupKey{RoomID: k.RoomID, SessionID: k.SessionID}
			var data string
			err := tx.QueryRowContext(ctx, `
				SELECT first_message_index, forwarded_count, is_verified, session_data FROM backup_keys
				WHERE user_id = $1 AND version = $2 AND room_id = $3 AND session_id = $4`,
				userID, version, k.RoomID, k.SessionID).Scan(&stored.FirstMessageIndex, &stored.ForwardedCount, &stored.IsVerified, &data)
			switch {
			case errors.Is(err, sql.ErrNoRows):
				if _, err := tx.ExecContext(ctx, `
					INSERT INTO backup_keys (user_id, version, room_id, session_id, first_message_index, forwarded_count, is_verified, session_data)
					VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
					userID, version, k.RoomID, k.SessionID, k.FirstMessageIndex, k.ForwardedCount, k.IsVerified, string(k.SessionData)); err != nil {
					return err
				}
				res.Count++
				changed = true
			case err != nil:
				return err
			default:
				stored.SessionData = []byte(data)
				if !replaces(stored, k) {
					continue
				}
				if _, err := tx.ExecContext(ctx, `
					UPDATE backup_keys SET first_message_index = $1, forwarded_count = $2, is_verified = $3, session_data = $4
					WHERE user_id = $5 AND version = $6 AND room_id = $7 AND session_id = $8`,
					k.FirstMessageIndex, k.ForwardedCount, k.IsVerified, string(k.SessionData), userID, version, k.RoomID, k.SessionID); err != nil {
					return err
				}
				changed = true
			}
		}
		if !changed {
			return nil
		}
		res.ETag++
		_, err = tx.ExecContext(ctx, `UPDATE backup_versions SET etag = $1, key_count = $2 WHERE user_id = $3 AND version = $4`,
			res.ETag, res.Count, userID, version)
		return err
	})
	return res, err
}

// The keys of a version, of one of its rooms, or one key: $1 user, $2
// version, then $3 room and $4 session.
const (
	backupKeyColumns   = `SELECT room_id, session_id, first_message_index, forwarded_count, is_verified, session_data FROM backup_keys `
	backupKeysAll      = `WHERE user_id = $1 AND version = $2`
	backupKeysRoom     = `WHERE user_id = $1 AND version = $2 AND room_id = $3`
	backupKeysSession  = `WHERE user_id = $1 AND version = $2 AND room_id = $3 AND session_id = $4`
	backupKeysOrdering = ` ORDER BY room_id, session_id`
)

// backupKeysWhere picks the condition and its parameters for the keys of
// a version (roomID empty), of a room (sessionID empty), or one key.
func backupKeysWhere(userID string, version int64, roomID, sessionID string) (string, []any) {
	switch {
	case roomID == "":
		return backupKeysAll, []any{userID, version}
	case sessionID == "":
		return backupKeysRoom, []any{userID, version, roomID}
	default:
		return backupKeysSession, []any{userID, version, roomID, sessionID}
	}
}

// BackupKeys returns the keys of a version (roomID empty), of one of its
// rooms (sessionID empty) or one of them, ordered by room and session; an
// unknown version is storage.ErrNotFound.
func (s *Store) BackupKeys(ctx context.Context, userID string, version int64, roomID, sessionID string) (_ []storage.BackupKey, err error) {
	defer named("BackupKeys", &err)
	var n int
	if err := s.q.QueryRowContext(ctx, `SELECT COUNT(*) FROM backup_versions WHERE user_id = $1 AND version = $2`,
		userID, version).Scan(&n); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, storage.ErrNotFound
	}
	where, params := backupKeysWhere(userID, version, roomID, sessionID)
	rows, err := s.q.QueryContext(ctx, backupKeyColumns+where+backupKeysOrdering, params...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var keys []storage.BackupKey
	for rows.Next() {
		var k storage.BackupKey
		var data string
		if err := rows.Scan(&k.RoomID, &k.SessionID, &k.FirstMessageIndex, &k.ForwardedCount, &k.IsVerified, &data); err != nil {
			return nil, err
		}
		k.SessionData = []byte(data)
		keys = append(keys, k)
	}
	return keys, rows.Err()
}

// DeleteBackupKeys deletes the keys of a version (roomID empty), of one
// of its rooms (sessionID empty) or one of them, from any version of the
// user's, current or not; the etag is bumped when a key was deleted. An
// unknown version is storage.ErrNotFound.
func (s *Store) DeleteBackupKeys(ctx context.Context, userID string, version int64, roomID, sessionID string) (_ storage.BackupKeysResult, err error) {
	defer named("DeleteBackupKeys", &err)
	var res storage.BackupKeysResult
	err = s.write(ctx, func(tx *txn) error {
		var err error
		if res, err = s.lockedVersion(ctx, tx, userID, version); err != nil {
			return err
		}
		where, params := backupKeysWhere(userID, version, roomID, sessionID)
		r, err := tx.ExecContext(ctx, `DELETE FROM backup_keys `+where, params...)
		if err != nil {
			return err
		}
		n, err := r.RowsAffected()
		if err != nil || n == 0 {
			return err
		}
		res.ETag++
		res.Count -= n
		_, err = tx.ExecContext(ctx, `UPDATE backup_versions SET etag = $1, key_count = $2 WHERE user_id = $3 AND version = $4`,
			res.ETag, res.Count, userID, version)
		return err
	})
	return res, err
}

// DeleteUserBackups deletes every backup version of the user with its
// keys, for the deactivation of the account. The user's last version
// number is kept, so that no version number is ever given twice.
func (s *Store) DeleteUserBackups(ctx context.Context, userID string) (err error) {
	defer named("DeleteUserBackups", &err)
	return s.write(ctx, func(tx *txn) error { return s.deleteUserBackups(ctx, tx, userID) })
}

// deleteUserBackups is DeleteUserBackups in the caller's transaction (the
// deactivation of an account).
func (s *Store) deleteUserBackups(ctx context.Context, tx *txn, userID string) error {
	if _, err := s.lockBackups(ctx, tx, userID); err != nil {
		if errors.Is(err, storage.ErrNotFound) {
			return nil // never had a backup
		}
		return err
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM backup_keys WHERE user_id = $1`, userID); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `DELETE FROM backup_versions WHERE user_id = $1`, userID)
	return err
}

// lockedVersion locks the user's backups and reads a version's etag and
// key count, and which version is the current one; storage.ErrNotFound
// when the version does not exist.
func (s *Store) lockedVersion(ctx context.Context, tx *txn, userID string, version int64) (storage.BackupKeysResult, error) {
	var res storage.BackupKeysResult
	if _, err := s.lockBackups(ctx, tx, userID); err != nil {
		return res, err
	}
	if err := tx.QueryRowContext(ctx, `SELECT etag, key_count FROM backup_versions WHERE user_id = $1 AND version = $2`,
		userID, version).Scan(&res.ETag, &res.Count); err != nil {
		return res, notFound(err)
	}
	err := tx.QueryRowContext(ctx, `SELECT MAX(version) FROM backup_versions WHERE user_id = $1`, userID).Scan(&res.Current)
	return res, err
}

// lockBackups locks the user's backups until the transaction ends and
// returns the last version number given to the user; storage.ErrNotFound
// when the user never had a backup.
func (s *Store) lockBackups(ctx context.Context, tx *txn, userID string) (int64, error) {
	var last int64
	err := tx.QueryRowContext(ctx, `SELECT last_version FROM backup_users WHERE user_id = $1`+s.d.forUpdate, userID).Scan(&last)
	return last, notFound(err)
}
