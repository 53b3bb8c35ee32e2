package sqlstore

import (
	"context"
	"database/sql"

	"github.com/keyserver/keyserver/storage"
)

const mediaColumns = `origin, media_id, user_id, content_type, upload_name, sha256, size, created_ts, expires_ts, authenticated`

func scanMedia(row interface{ Scan(...any) error }) (storage.MediaRecord, error) {
	var m storage.MediaRecord
	var auth int
	err := row.Scan(&m.Origin, &m.MediaID, &m.UserID, &m.ContentType, &m.UploadName, &m.SHA256, &m.Size, &m.CreatedTS, &m.ExpiresTS, &auth)
	m.Authenticated = auth != 0
	return m, err
}

func mediaFlag(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Media returns a media record, or storage.ErrNotFound.
func (s *Store) Media(ctx context.Context, origin, mediaID string) (_ storage.MediaRecord, err error) {
	defer named("Media", &err)
	m, err := scanMedia(s.q.QueryRowContext(ctx, `SELECT `+mediaColumns+` FROM media WHERE origin = $1 AND media_id = $2`, origin, mediaID))
	return m, notFound(err)
}

// AddMedia stores a new media record: storage.ErrMediaExists when its origin and
// ID are taken.
func (s *Store) AddMedia(ctx context.Context, m storage.MediaRecord) (err error) {
	defer named("AddMedia", &err)
	return s.write(ctx, func(tx *txn) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO media (`+mediaColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
			m.Origin, m.MediaID, m.UserID, m.ContentType, m.UploadName, m.SHA256, m.Size, m.CreatedTS, m.ExpiresTS, mediaFlag(m.Authenticated))
		if err != nil && s.d.isUniqueViolation(err) {
			return storage.ErrMediaExists
		}
		return err
	})
}

// PutRemoteMedia stores (or replaces) the record of a remote file cached
// here.
func (s *Store) PutRemoteMedia(ctx context.Context, m storage.MediaRecord) (err error) {
	defer named("PutRemoteMedia", &err)
	return s.write(ctx, func(tx *txn) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO media (`+mediaColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
			ON CONFLICT (origin, media_id) DO UPDATE SET content_type = excluded.content_type, upload_name = excluded.upload_name,
				sha256 = excluded.sha256, size = excluded.size, created_ts = excluded.created_ts`,
			m.Origin, m.MediaID, m.UserID, m.ContentType, m.UploadName, m.SHA256, m.Size, m.CreatedTS, m.ExpiresTS, mediaFlag(m.Authenticated))
		return err
	})
}

// ReserveMedia stores a reserved media ID of userID (m, its SHA256
// empty) unless the user already holds max reserved IDs not yet expired
// at now; it removes every reserved ID expired at now first. It returns
// whether the ID was stored and, when it was not, when the user's
// earliest reservation expires.
func (s *Store) ReserveMedia(ctx context.Context, m storage.MediaRecord, max int, now int64) (ok bool, earliest int64, err error) {
	defer named("ReserveMedia", &err)
	err = s.write(ctx, func(tx *txn) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM media WHERE sha256 = '' AND expires_ts <= $1`, now); err != nil {
			return err
		}
		var n int
		var first sql.NullInt64
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*), MIN(expires_ts) FROM media WHERE user_id = $1 AND sha256 = ''`,
			m.UserID).Scan(&n, &first); err != nil {
			return err
		}
		if n >= max {
			earliest = first.Int64
			return nil
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO media (`+mediaColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
			m.Origin, m.MediaID, m.UserID, m.ContentType, m.UploadName, m.SHA256, m.Size, m.CreatedTS, m.ExpiresTS, mediaFlag(m.Authenticated))
		if err != nil && s.d.isUniqueViolation(err) {
			return storage.ErrMediaExists
		}
		ok = err == nil
		return err
	})
	return ok, earliest, err
}

// FillMedia gives a reserved media ID its content: storage.ErrNotFound
// when the ID is unknown or expired at now (or belongs to another user:
// callers check the owner first), storage.ErrMediaNotPending when it already has
// content.
func (s *Store) FillMedia(ctx context.Context, m storage.MediaRecord, now int64) (err error) {
	defer named("FillMedia", &err)
	return s.write(ctx, func(tx *txn) error {
		res, err := tx.ExecContext(ctx, `UPDATE media SET content_type = $1, upload_name = $2, sha256 = $3, size = $4, expires_ts = 0
			WHERE origin = $5 AND media_id = $6 AND user_id = $7 AND sha256 = '' AND expires_ts > $8`,
			m.ContentType, m.UploadName, m.SHA256, m.Size, m.Origin, m.MediaID, m.UserID, now)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 1 {
			return err
		}
		var sha string
		err = tx.QueryRowContext(ctx, `SELECT sha256 FROM media WHERE origin = $1 AND media_id = $2 AND user_id = $3`,
			m.Origin, m.MediaID, m.UserID).Scan(&sha)
		if err == nil && sha != "" {
			return storage.ErrMediaNotPending
		}
		return storage.ErrNotFound
	})
}

// MediaThumbnail returns a stored thumbnail, or storage.ErrNotFound.
func (s *Store) MediaThumbnail(ctx context.Context, origin, mediaID string, width, height int, method string) (_ storage.MediaThumbnail, err error) {
	defer named("MediaThumbnail", &err)
	t := storage.MediaThumbnail{Origin: origin, MediaID: mediaID, Width: width, Height: height, Method: method}
	err = s.q.QueryRowContext(ctx, `SELECT content_type, sha256, size FROM media_thumbnails
		WHERE origin = $1 AND media_id = $2 AND width = $3 AND height = $4 AND method = $5`,
		origin, mediaID, width, height, method).Scan(&t.ContentType, &t.SHA256, &t.Size)
	return t, notFound(err)
}

// PutMediaThumbnail stores (or replaces) a thumbnail's record.
func (s *Store) PutMediaThumbnail(ctx context.Context, t storage.MediaThumbnail) (err error) {
	defer named("PutMediaThumbnail", &err)
	return s.write(ctx, func(tx *txn) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO media_thumbnails (origin, media_id, width, height, method, content_type, sha256, size)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
			ON CONFLICT (origin, media_id, width, height, method) DO UPDATE SET
				content_type = excluded.content_type, sha256 = excluded.sha256, size = excluded.size`,
			t.Origin, t.MediaID, t.Width, t.Height, t.Method, t.ContentType, t.SHA256, t.Size)
		return err
	})
}
