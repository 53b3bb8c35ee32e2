package sqlstore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/keyserver/keyserver/storage"
)

// SetAccountData stores a user's account data of a type, global when
// roomID is empty, at a new stream position (returned), so that /sync
// hands it out once: waiting /sync requests on every daemon sharing the
// database are woken by the position (see nextPos).
func (s *Store) SetAccountData(ctx context.Context, userID, roomID, dataType string, content []byte) (_ storage.Change, err error) {
	defer named("SetAccountData", &err)
	return s.updateAccountData(ctx, userID, roomID, dataType, func([]byte) ([]byte, error) { return content, nil })
}

// AccountData returns a user's account data of a type (global when
// roomID is empty), or storage.ErrNotFound.
func (s *Store) AccountData(ctx context.Context, userID, roomID, dataType string) (_ []byte, err error) {
	defer named("AccountData", &err)
	var content string
	err = s.q.QueryRowContext(ctx, `SELECT content FROM account_data WHERE user_id = $1 AND room_id = $2 AND data_type = $3`,
		userID, roomID, dataType).Scan(&content)
	if err != nil {
		return nil, notFound(err)
	}
	return []byte(content), nil
}

// AccountDataChanges returns the account data of a user, global and per
// room, whose last change is in (from, to], in the order of the changes;
// from 0 returns all of it up to to. Only the newest content of each type
// is kept, so a type changed twice in the range comes once.
func (s *Store) AccountDataChanges(ctx context.Context, userID string, from, to storage.StreamPos) (_ []storage.AccountData, err error) {
	defer named("AccountDataChanges", &err)
	if to <= from {
		return nil, nil
	}
	rows, err := s.q.QueryContext(ctx, `SELECT room_id, data_type, content, pos FROM account_data
		WHERE user_id = $1 AND pos > $2 AND pos <= $3 ORDER BY pos`, userID, from, to)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.AccountData
	for rows.Next() {
		var d storage.AccountData
		var content string
		if err := rows.Scan(&d.RoomID, &d.Type, &content, &d.Pos); err != nil {
			return nil, err
		}
		d.Content = []byte(content)
		out = append(out, d)
	}
	return out, rows.Err()
}

// UpdateAccountData replaces a type of a user's account data by what
// update makes of its content (nil when there is none), in one
// transaction: the stream's counter, taken first, keeps two updates of
// the same data from both reading the old content.
func (s *Store) UpdateAccountData(ctx context.Context, userID, roomID, dataType string, update func(old []byte) ([]byte, error)) (_ storage.Change, err error) {
	defer named("UpdateAccountData", &err)
	return s.updateAccountData(ctx, userID, roomID, dataType, update)
}

func (s *Store) updateAccountData(ctx context.Context, userID, roomID, dataType string, update func(old []byte) ([]byte, error)) (storage.Change, error) {
	return s.writeChange(ctx, func(tx *txn) error {
		pos, err := s.nextPos(ctx, tx)
		if err != nil {
			return err
		}
		var old []byte
		var content string
		switch err := tx.QueryRowContext(ctx, `SELECT content FROM account_data WHERE user_id = $1 AND room_id = $2 AND data_type = $3`,
			userID, roomID, dataType).Scan(&content); {
		case err == nil:
			old = []byte(content)
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		updated, err := update(old)
		if err != nil {
			return err
		}
		tx.concern(userID) // only the owner's /sync hands it out
		_, err = tx.ExecContext(ctx, `
			INSERT INTO account_data (user_id, room_id, data_type, content, pos) VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (user_id, room_id, data_type) DO UPDATE SET content = excluded.content, pos = excluded.pos`,
			userID, roomID, dataType, string(updated), pos)
		return err
	})
}
