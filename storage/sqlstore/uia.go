package sqlstore

import (
	"context"

	"github.com/keyserver/keyserver/storage"
)

// CreateUIASession stores a new user-interactive auth session, and deletes
// the sessions that have expired: they are few, and nothing else would.
func (s *Store) CreateUIASession(ctx context.Context, sess storage.UIASession, now int64) (err error) {
	defer named("CreateUIASession", &err)
	return s.write(ctx, func(tx *txn) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM uia_sessions WHERE expires_ts <= $1`, now); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx,
			`INSERT INTO uia_sessions (session_id, user_id, request_hash, expires_ts) VALUES ($1, $2, $3, $4)`,
			sess.ID, sess.UserID, sess.RequestHash, sess.ExpiresTS)
		return err
	})
}

// UIASession returns a session that has not expired at now.
func (s *Store) UIASession(ctx context.Context, sessionID string, now int64) (_ storage.UIASession, err error) {
	defer named("UIASession", &err)
	sess := storage.UIASession{ID: sessionID}
	err = s.q.QueryRowContext(ctx,
		`SELECT user_id, request_hash, expires_ts FROM uia_sessions WHERE session_id = $1 AND expires_ts > $2`,
		sessionID, now).Scan(&sess.UserID, &sess.RequestHash, &sess.ExpiresTS)
	return sess, notFound(err)
}

// ConsumeUIASession deletes a completed session. Of two requests completing
// the same session at once, only one deletes it.
func (s *Store) ConsumeUIASession(ctx context.Context, sessionID string) (_ bool, err error) {
	defer named("ConsumeUIASession", &err)
	var n int64
	err = s.writeStatements(ctx, func(q querier) error {
		r, err := q.ExecContext(ctx, `DELETE FROM uia_sessions WHERE session_id = $1`, sessionID)
		if err != nil {
			return err
		}
		n, err = r.RowsAffected()
		return err
	})
	return n > 0, err
}
