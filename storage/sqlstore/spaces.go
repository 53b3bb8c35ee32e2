package sqlstore

import (
	"context"

	"github.com/keyserver/keyserver/storage"
)

// The reads of space hierarchies and room summaries (package spaces).

// RoomStateOfType returns the events of a room's current state of one
// type, whatever their state keys (a space's m.space.child events).
func (s *Store) RoomStateOfType(ctx context.Context, roomID, eventType string) (_ []storage.RoomEvent, err error) {
	defer named("RoomStateOfType", &err)
	return s.roomEvents(ctx, `SELECT `+roomEventColumns+` FROM room_current_state c JOIN room_events e ON e.event_nid = c.event_nid
		WHERE c.room_id = $1 AND c.event_type = $2 ORDER BY e.event_nid`, roomID, eventType)
}

// RoomJoinedCount returns the number of users joined to a room in its
// current state.
func (s *Store) RoomJoinedCount(ctx context.Context, roomID string) (_ int, err error) {
	defer named("RoomJoinedCount", &err)
	var n int
	err = s.q.QueryRowContext(ctx, `SELECT COUNT(*) FROM room_current_state
		WHERE room_id = $1 AND event_type = 'm.room.member' AND membership = 'join'`, roomID).Scan(&n)
	return n, err
}
