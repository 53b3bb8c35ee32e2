package syncapi

import (
	"context"
	"encoding/json"

	"github.com/keyserver/keyserver/internal/streamtoken"
	"github.com/keyserver/keyserver/storage"
)

// The rooms part of /sync comes from package roomserver, whose events
// take their positions from the same stream as device lists and account
// data: one "s<pos>" token covers all of them.

// RoomsSource gives /sync its rooms part (package roomserver, through
// the server's adapter).
type RoomsSource interface {
	Sync(ctx context.Context, req RoomsRequest) (RoomsSection, error)
	ResolveFilter(ctx context.Context, userID, param string) (RoomFilter, error)
}

// RoomFilter is /sync's filter as the rooms resolved it: passed back with
// each request, and asked here only which rooms it lets in.
type RoomFilter interface {
	WantsRoom(roomID string) bool
}

// RoomsRequest asks for the rooms part of an answer for (From, To].
type RoomsRequest struct {
	UserID    string
	DeviceID  string            // whose lazy-loaded members are remembered
	From, To  storage.StreamPos // From 0: an initial sync
	FullState bool
	Filter    RoomFilter
	// AccountData are the user's account data changes in the range; the
	// per-room ones go under their joined rooms.
	AccountData []storage.AccountData
	// Token formats a stream position as a /sync token (prev_batch).
	Token func(storage.StreamPos) string
	// Memberships are the user's memberships and RoomsWithEvents the
	// rooms among them with an event in the range, sorted, as the stream
	// read found them (they are not read again).
	Memberships     []storage.RoomMember
	RoomsWithEvents []string
}

// RoomsSection is the rooms part of an answer, encoded as it is.
type RoomsSection interface {
	// JoinedRooms lists the joined rooms the part shows.
	JoinedRooms() []string
	// SetUnreadCounts sets a joined room's unread_notifications.
	SetUnreadCounts(roomID string, notifications, highlights int)
	// AddEphemeral adds ephemeral events to a joined room, bringing the
	// room in when the part does not show it yet.
	AddEphemeral(roomID string, events []json.RawMessage)
}

// SyncOptions are the parameters of /sync beyond since and timeout.
type SyncOptions struct {
	Filter    string // a filter ID, or inline JSON
	FullState bool
	// SetPresence is set_presence: "" (online), online, unavailable or
	// offline.
	SetPresence string
}

// syncFilter resolves /sync's filter parameter (none without rooms).
func (s *Service) syncFilter(ctx context.Context, userID string, o SyncOptions) (RoomFilter, error) {
	if s.rooms == nil {
		return nil, nil
	}
	return s.rooms.ResolveFilter(ctx, userID, o.Filter)
}

// roomsSection builds the rooms part for (from, d.Pos] from what d holds
// (the memberships, the account data) and the rooms' timelines; nil
// without rooms.
func (s *Service) roomsSection(ctx context.Context, userID, deviceID string, from storage.StreamPos, d *storage.SyncData, eph map[string][]json.RawMessage, o SyncOptions, f RoomFilter) (RoomsSection, error) {
	if s.rooms == nil {
		return nil, nil
	}
	req := RoomsRequest{UserID: userID, DeviceID: deviceID, From: from, To: d.Pos, FullState: o.FullState, Filter: f, Token: streamtoken.Format,
		Memberships: d.RoomMemberships, RoomsWithEvents: d.RoomsWithEvents}
	if s.opts.AccountData != nil {
		req.AccountData = d.AccountData
	}
	rooms, err := s.rooms.Sync(ctx, req)
	if err != nil || rooms == nil {
		return nil, err
	}
	if len(eph) > 0 {
		addEphemeral(rooms, eph, d)
	}
	if s.opts.Unread != nil {
		err = s.unreadCounts(ctx, userID, d.Pos, rooms)
	}
	return rooms, err
}

// UnreadCounter gives /sync the unread notification counts of rooms
// (pusher.Service), counting events up to a position.
type UnreadCounter interface {
	UnreadCounts(ctx context.Context, userID string, roomIDs []string, upTo storage.StreamPos) (map[string]storage.UnreadCount, error)
}

// unreadCounts fills in the joined rooms' unread_notifications.
func (s *Service) unreadCounts(ctx context.Context, userID string, upTo storage.StreamPos, rooms RoomsSection) error {
	ids := rooms.JoinedRooms()
	if len(ids) == 0 {
		return nil
	}
	counts, err := s.opts.Unread.UnreadCounts(ctx, userID, ids, upTo)
	if err != nil {
		return err
	}
	for _, id := range ids {
		c := counts[id]
		rooms.SetUnreadCounts(id, c.Notifications, c.Highlights)
	}
	return nil
}
