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
	err = s.write(ctx, func(tx *txn) error {
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
	return res, err
}

// AccountExists reports whether the user has an account.
func (s *Store) AccountExists(ctx context.Context, userID string) (_ bool, err error) {
	defer named("AccountExists", &err)
	var n int
	err = s.q.QueryRowContext(ctx, `SELECT COUNT(*) FROM accounts WHERE user_id = $1`, userID).Scan(&n)
	return n > 0, err
}

// PasswordHash returns the user's password hash, or storage.ErrNotFound.
func (s *Store) PasswordHash(ctx context.Context, userID string) (_ string, err error) {
	defer named("PasswordHash", &err)
	var h string
	err = s.q.QueryRowContext(ctx, `SELECT password_hash FROM accounts WHERE user_id = $1`, userID).Scan(&h)
	return h, notFound(err)
}
