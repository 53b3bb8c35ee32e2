package keyserver

import (
	"context"
	"encoding/json"
	"slices"

	"github.com/keyserver/keyserver/storage"
)

// Account data in /sync.
//
// Account data changes (package accountdata) take their positions from
// the same stream as device-list and membership changes: the counter of
// storage.StreamPos, allocated in the transaction of the change. A /sync
// token "s<pos>" therefore stands for "every change up to pos", account
// data included, and tokens handed out before account data existed stay
// valid (they come before any account data change). A change wakes the
// waiting /sync requests as any stream advance does, on every daemon
// sharing the database; each checks whether the change is its user's.
//
// Room account data is stored with the same positions. With rooms (see
// syncrooms.go) the entries of AccountDataChanges with a RoomID go under
// rooms.join.{roomId}.account_data.events, from the same range, and end
// a waiting /sync too when the room is one the user is joined to.

// AccountDataSource gives /sync a user's account data changes (the store).
type AccountDataSource interface {
	// AccountDataChanges returns the user's account data whose last change
	// is in (from, to], in the order of the changes; from 0: all of it.
	AccountDataChanges(ctx context.Context, userID string, from, to storage.StreamPos) ([]storage.AccountData, error)
}

// AccountDataSection is the account_data part of a /sync answer.
type AccountDataSection struct {
	Events []AccountDataEvent `json:"events"`
}

// AccountDataEvent is one type of account data with its newest content.
type AccountDataEvent struct {
	Type    string          `json:"type"`
	Content json.RawMessage `json:"content"`
}

// accountDataSection returns the user's global account data of changes
// (those of the answer's range), nil when the service shows no account
// data.
func (s *Service) accountDataSection(changes []storage.AccountData) *AccountDataSection {
	if s.opts.AccountData == nil {
		return nil
	}
	section := &AccountDataSection{Events: []AccountDataEvent{}}
	for _, d := range changes {
		if d.RoomID == "" {
			section.Events = append(section.Events, AccountDataEvent{Type: d.Type, Content: d.Content})
		}
	}
	return section
}

// accountDataNews reports whether the user's account data read in d
// changed, globally or in a joined room: news that ends a waiting /sync.
func (s *Service) accountDataNews(d storage.SyncData) bool {
	for _, a := range d.AccountData {
		if a.RoomID == "" {
			return true
		}
		// A room's account data is news when /sync shows it: in a
		// room the user is joined to.
		if s.rooms != nil && slices.ContainsFunc(d.RoomMemberships, func(m storage.RoomMember) bool {
			return m.RoomID == a.RoomID && m.Membership == storage.MembershipJoin
		}) {
			return true
		}
	}
	return false
}
