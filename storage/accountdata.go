package storage

// AccountData is a user's account data of one type: global (RoomID
// empty) or for one room. Pos is the stream position of its last change:
// account data changes take their positions from the same stream as
// device-list changes, so one /sync token covers both.
type AccountData struct {
	RoomID  string
	Type    string
	Content []byte // a JSON object
	Pos     StreamPos
}
