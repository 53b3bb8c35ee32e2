package sqlstore

import (
	"context"

	"github.com/keyserver/keyserver/storage"
)

// The public room directory: which rooms are listed (rooms.published).

// SetRoomPublished lists a room in the public directory or takes it out;
// storage.ErrNotFound for a room this server does not know.
func (s *Store) SetRoomPublished(ctx context.Context, roomID string, published bool) (err error) {
	defer named("SetRoomPublished", &err)
	return s.write(ctx, func(tx *txn) error {
		r, err := tx.ExecContext(ctx, `UPDATE rooms SET published = $1 WHERE room_id = $2`, boolInt(published), roomID)
		if err != nil {
			return err
		}
		if n, _ := r.RowsAffected(); n == 0 {
			return storage.ErrNotFound
		}
		return nil
	})
}

// PublishedRooms returns the rooms listed in the public directory with
// the number of their joined members, most members first, then by room
// ID, so that pages of the list follow one order.
func (s *Store) PublishedRooms(ctx context.Context) (_ []storage.PublishedRoom, err error) {
	defer named("PublishedRooms", &err)
	rows, err := s.q.QueryContext(ctx, `SELECT r.room_id,
		(SELECT COUNT(*) FROM room_current_state c
			WHERE c.room_id = r.room_id AND c.event_type = 'm.room.member' AND c.membership = 'join') AS joined
		FROM rooms r WHERE r.published = 1
		ORDER BY joined DESC, r.room_id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.PublishedRoom
	for rows.Next() {
		var p storage.PublishedRoom
		if err := rows.Scan(&p.RoomID, &p.JoinedMembers); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}
