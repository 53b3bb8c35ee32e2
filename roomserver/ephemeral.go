package roomserver

import "encoding/json"

// EphemeralEvents are a joined room's ephemeral events in /sync (typing,
// receipts), as their packages make them: {"type", "content"}.
type EphemeralEvents struct {
	Events []json.RawMessage `json:"events"`
}

// WantsRoom reports whether the filter lets a room into /sync's rooms.
func (f Filter) WantsRoom(roomID string) bool { return f.wants(roomID) }

// NewJoinedRoom is a joined room of /sync with nothing in it yet: for a
// room that has only ephemeral events to show.
func NewJoinedRoom() *JoinedRoom {
	return &JoinedRoom{State: Events{Events: []ClientEvent{}}, Timeline: Timeline{Events: []ClientEvent{}},
		AccountData: AccountDataEvents{Events: []AccountDataEvent{}}, Ephemeral: EphemeralEvents{Events: []json.RawMessage{}}}
}
