package sqlstore

import (
	"context"

	"github.com/keyserver/keyserver/storage"
)

// CreateAccount creates an account and, when login is not nil, logs in its
// first device, in one transaction.
func (s *Store) CreateAccount(ctx context.Context, userID, passwordHash string, login *storage.NewLogin) (_ storage.LoginResult, err error) {
	defer named("CreateAccount", &err)
	var res storage.LoginResult
	ch, err := s.writeChange(ctx, func(tx *txn) error {
		var ts int64
		if login != nil {
			ts = login.TS
		}
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO accounts (user_id, password_hash, created_ts) VALUES ($1, $2, $3)`,
			userID, passwordHash, ts); err != nil {
			if s.d.isUniqueViolation(err) {
				return storage.ErrUserExists
			}
			return err
		}
		if login == nil {
			return nil
		}
		var err error
		res, err = s.login(ctx, tx, *login)
		return err
	})
	res.Change = ch
	return res, err
}

// AccountExists reports whether the user has an account.
func (s *Store) AccountExists(ctx context.Context, userID string) (_ bool, err error) {
	defer named("AccountExists", &err)
	var n int
	err = s.q.QueryRowContext(ctx, `SELECT COUNT(*) FROM accounts WHERE user_id = $1`, userID).Scan(&n)
	return n > 0, err
}

// PasswordHash returns the user's password hash, storage.ErrNotFound or
// storage.ErrDeactivated.
func (s *Store) PasswordHash(ctx context.Context, userID string) (_ string, err error) {
	defer named("PasswordHash", &err)
	var h string
	var deactivated int64
	err = s.q.QueryRowContext(ctx, `SELECT password_hash, deactivated_ts FROM accounts WHERE user_id = $1`, userID).
		Scan(&h, &deactivated)
	if err == nil && deactivated != 0 {
		return "", storage.ErrDeactivated
	}
	return h, notFound(err)
}

// ChangePassword sets a password and, with logoutOthers, logs out every
// device but keepDevice.
func (s *Store) ChangePassword(ctx context.Context, userID, passwordHash, keepDevice string, logoutOthers bool) (_ storage.Change, err error) {
	defer named("ChangePassword", &err)
	return s.writeChange(ctx, func(tx *txn) error {
		r, err := tx.ExecContext(ctx, `UPDATE accounts SET password_hash = $1 WHERE user_id = $2 AND deactivated_ts = 0`,
			passwordHash, userID)
		if err != nil {
			return err
		}
		if n, _ := r.RowsAffected(); n == 0 {
			return storage.ErrNotFound
		}
		if !logoutOthers {
			return nil
		}
		others, err := s.txUserList(ctx, tx, `SELECT device_id FROM devices WHERE user_id = $1 AND device_id <> $2`, userID, keepDevice)
		if err != nil || len(others) == 0 {
			return err
		}
		_, _, err = s.deleteDevices(ctx, tx, userID, others)
		return err
	})
}

// DeactivateAccount deletes everything of a user and keeps the account row,
// marked deactivated, so that the user ID is never registered again.
func (s *Store) DeactivateAccount(ctx context.Context, userID string, now int64) (_ storage.Change, err error) {
	defer named("DeactivateAccount", &err)
	return s.writeChange(ctx, func(tx *txn) error {
		r, err := tx.ExecContext(ctx,
			`UPDATE accounts SET password_hash = '', deactivated_ts = $1 WHERE user_id = $2 AND deactivated_ts = 0`,
			max(now, 1), userID)
		if err != nil {
			return err
		}
		if n, _ := r.RowsAffected(); n == 0 {
			return storage.ErrNotFound
		}
		// Every device with its tokens and keys, each deletion queued for
		// the servers sharing a room with the user.
		if _, _, err = s.deleteDevices(ctx, tx, userID, nil); err != nil {
			return err
		}
		// A token always has its device; still, none may outlive the account.
		if _, err := tx.ExecContext(ctx, `DELETE FROM access_tokens WHERE user_id = $1`, userID); err != nil {
			return err
		}
		if err := s.revokeTokens(ctx, tx, userID); err != nil {
			return err
		}
		// Cross-signing keys and the signatures on them. Signatures the
		// user made on others' master keys stay with their targets.
		if _, err := tx.ExecContext(ctx, `DELETE FROM cross_signing_keys WHERE user_id = $1`, userID); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM cross_signing_signatures WHERE target_user_id = $1`, userID); err != nil {
			return err
		}
		if err := s.revokeUserKeys(ctx, tx, userID); err != nil {
			return err
		}
		// Key backups, account data (the secret storage among it), the
		// profile and to-device messages go too. The devices' inboxes went with them;
		// this also covers any left without a device.
		if err := s.deleteUserBackups(ctx, tx, userID); err != nil {
			return err
		}
		if err := deleteUserInboxes(ctx, tx, userID); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM account_data WHERE user_id = $1`, userID); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM profiles WHERE user_id = $1`, userID); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM uia_sessions WHERE user_id = $1`, userID)
		return err
	})
}

// JoinedRooms lists the rooms a user is joined to or invited into.
func (s *Store) JoinedRooms(ctx context.Context, userID string) (_ []string, err error) {
	defer named("JoinedRooms", &err)
	return s.userList(ctx, `SELECT room_id FROM memberships WHERE user_id = $1 AND membership IN ('join', 'invite')`, userID)
}
