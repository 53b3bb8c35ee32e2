package storage

import "encoding/json"

// Pusher is a device's registration for push notifications
// (POST /pushers/set), unique per user, app ID and pushkey. It lives as
// long as its device has an access token: a device logged out, deleted,
// or logged out by a password change takes its pushers with it.
type Pusher struct {
	UserID, DeviceID  string
	Kind              string // "http"
	AppID             string
	Pushkey           string
	AppDisplayName    string
	DeviceDisplayName string
	ProfileTag        string
	Lang              string
	Data              json.RawMessage // a JSON object (url, format, ...)
	PushkeyTS         int64           // milliseconds: when the pushkey was set
}

// PushEvent is a room event the push side evaluates: one with a stream
// position, neither rejected nor soft-failed.
type PushEvent struct {
	EventID, RoomID, Sender string
	JSON                    []byte // the PDU as stored
	Pos                     StreamPos
}

// PushRoomState is what rules are evaluated with in a room: its joined
// members with their member events, its power levels (nil: none) and its
// create event (whose creators hold every power in room version 12).
type PushRoomState struct {
	Members     map[string][]byte // user ID -> the m.room.member PDU
	PowerLevels []byte
	Create      []byte
}

// PushNotification is an event that notified a user.
type PushNotification struct {
	UserID, RoomID, EventID string
	Pos                     StreamPos
	Highlight               bool
	TS                      int64 // milliseconds
}

// PushRead is a user's having read a room up to a position (their own
// event there); the notifications at or before it stop counting.
type PushRead struct {
	UserID, RoomID string
	Pos            StreamPos
}

// UnreadCount is a room's unread notifications for a user.
type UnreadCount struct {
	Notifications, Highlights int
}
