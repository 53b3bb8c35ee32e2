package roomserver

import (
	"encoding/json"
	"sort"
)

// EphemeralEvents are a joined room's ephemeral events in /sync (typing,
// receipts), as their packages make them: {"type", "content"}.
type EphemeralEvents struct {
	Events []json.RawMessage `json:"events"`
}

// WantsRoom reports whether the filter lets a room into /sync's rooms.
func (f Filter) WantsRoom(roomID string) bool { return f.wants(roomID) }

// What /sync adds to the rooms part after the rooms made it: the joined
// rooms' ephemeral events and unread counts (package syncapi).

// JoinedRooms lists the joined rooms of the part, sorted.
func (r *SyncRooms) JoinedRooms() []string {
	ids := make([]string, 0, len(r.Join))
	for id := range r.Join {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// SetUnreadCounts sets a joined room's unread_notifications.
func (r *SyncRooms) SetUnreadCounts(roomID string, notifications, highlights int) {
	if j := r.Join[roomID]; j != nil {
		j.UnreadNotifications = &UnreadNotifications{NotificationCount: notifications, HighlightCount: highlights}
	}
}

// AddEphemeral adds ephemeral events to a joined room; a room not in the
// part yet comes in with nothing else in it.
func (r *SyncRooms) AddEphemeral(roomID string, events []json.RawMessage) {
	j := r.Join[roomID]
	if j == nil {
		j = &JoinedRoom{State: Events{Events: []ClientEvent{}}, Timeline: Timeline{Events: []ClientEvent{}},
			AccountData: AccountDataEvents{Events: []AccountDataEvent{}}, Ephemeral: EphemeralEvents{Events: []json.RawMessage{}}}
		if r.Join == nil {
			r.Join = map[string]*JoinedRoom{}
		}
		r.Join[roomID] = j
	}
	j.Ephemeral.Events = append(j.Ephemeral.Events, events...)
}
