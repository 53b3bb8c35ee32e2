package sqlstore

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/storage"
)

// Profile returns a local user's profile: storage.ErrNotFound when the
// user has no account or it is deactivated; the default profile (the
// localpart as display name) when the user never set one.
func (s *Store) Profile(ctx context.Context, userID string) (_ storage.Profile, err error) {
	defer named("Profile", &err)
	var deactivated int64
	var row sql.NullString // profiles.user_id: NULL when the user has no row
	var name, avatar sql.NullString
	err = s.q.QueryRowContext(ctx, `SELECT a.deactivated_ts, p.user_id, p.displayname, p.avatar_url
		FROM accounts a LEFT JOIN profiles p ON p.user_id = a.user_id WHERE a.user_id = $1`, userID).
		Scan(&deactivated, &row, &name, &avatar)
	if err != nil {
		return storage.Profile{}, notFound(err)
	}
	if deactivated != 0 {
		return storage.Profile{}, storage.ErrNotFound
	}
	if !row.Valid {
		return storage.Profile{DisplayName: matrixid.Localpart(userID)}, nil
	}
	return storage.Profile{DisplayName: name.String, AvatarURL: avatar.String}, nil
}

// SetProfileField sets one field of a local user's profile (value "":
// none) and returns the profile; storage.ErrNotFound when the user has no
// account or it is deactivated. Only that field's column is written, so
// two fields set at once both stay; a user's first change keeps the
// default display name unless it is the display name that changes.
func (s *Store) SetProfileField(ctx context.Context, userID, field, value string) (_ storage.Profile, err error) {
	defer named("SetProfileField", &err)
	var query string
	var params []any
	switch field {
	case "displayname":
		query = `INSERT INTO profiles (user_id, displayname, avatar_url) VALUES ($1, $2, NULL)
			ON CONFLICT (user_id) DO UPDATE SET displayname = excluded.displayname`
		params = []any{userID, nullIfEmpty(value)}
	case "avatar_url":
		query = `INSERT INTO profiles (user_id, displayname, avatar_url) VALUES ($1, $2, $3)
			ON CONFLICT (user_id) DO UPDATE SET avatar_url = excluded.avatar_url`
		params = []any{userID, matrixid.Localpart(userID), nullIfEmpty(value)}
	default:
		return storage.Profile{}, fmt.Errorf("unknown profile field %q", field)
	}
	err = s.write(ctx, func(tx *txn) error {
		var deactivated int64
		err := tx.QueryRowContext(ctx, `SELECT deactivated_ts FROM accounts WHERE user_id = $1`, userID).Scan(&deactivated)
		if err != nil {
			return notFound(err)
		}
		if deactivated != 0 {
			return storage.ErrNotFound
		}
		_, err = tx.ExecContext(ctx, query, params...)
		return err
	})
	if err != nil {
		return storage.Profile{}, err
	}
	return s.Profile(ctx, userID)
}

func nullIfEmpty(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }
