package accountdata

import (
	"encoding/json"
	"slices"

	"github.com/keyserver/keyserver/storage"
)

// Account data in /sync.
//
// Account data changes take their positions from the same stream as
// device-list and membership changes: the counter of storage.StreamPos,
// allocated in the transaction of the change. A /sync token "s<pos>"
// therefore stands for "every change up to pos", account data included,
// and tokens handed out before account data existed stay valid (they come
// before any account data change). A change wakes the waiting /sync
// requests as any stream advance does, on every daemon sharing the
// database; each checks whether the change is its user's.
//
// Room account data is stored with the same positions. With rooms, /sync
// (package syncapi) puts the entries with a RoomID under
// rooms.join.{roomId}.account_data.events, from the same range, and they
// end a waiting /sync too when the room is one the user is joined to.

// SyncSection is the account_data part of a /sync answer.
type SyncSection struct {
	Events []SyncEvent `json:"events"`
}

// SyncEvent is one type of account data with its newest content.
type SyncEvent struct {
	Type    string          `json:"type"`
	Content json.RawMessage `json:"content"`
}

// SyncSection returns the account_data part of a /sync answer: the
// user's global account data of changes (those of the answer's range).
func (s *Service) SyncSection(changes []storage.AccountData) any {
	section := &SyncSection{Events: []SyncEvent{}}
	for _, d := range changes {
		if d.RoomID == "" {
			section.Events = append(section.Events, SyncEvent{Type: d.Type, Content: d.Content})
		}
	}
	return section
}

// SyncNews reports whether the user's account data read in d changed,
// globally or, when /sync shows rooms, in a room the user is joined to:
// news that ends a waiting /sync.
func (s *Service) SyncNews(d *storage.SyncData, withRooms bool) bool {
	for _, a := range d.AccountData {
		if a.RoomID == "" {
			return true
		}
		// A room's account data is news when /sync shows it: in a
		// room the user is joined to.
		if withRooms && slices.ContainsFunc(d.RoomMemberships, func(m storage.RoomMember) bool {
			return m.RoomID == a.RoomID && m.Membership == storage.MembershipJoin
		}) {
			return true
		}
	}
	return false
}
