package syncapi

import (
	"context"
	"encoding/json"

	"github.com/keyserver/keyserver/internal/streamtoken"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/storage"
)

// The rooms part of /sync comes from package roomserver, whose events
// take their positions from the same stream as device lists and account
// data: one "s<pos>" token covers all of them.

// RoomsSource gives /sync its rooms part (roomserver.Service).
type RoomsSource interface {
	Sync(ctx context.Context, req roomserver.SyncRequest) (*roomserver.SyncRooms, error)
	ResolveFilter(ctx context.Context, userID, param string) (roomserver.Filter, error)
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
func (s *Service) syncFilter(ctx context.Context, userID string, o SyncOptions) (roomserver.Filter, error) {
	if s.rooms == nil {
		return roomserver.Filter{}, nil
	}
	return s.rooms.ResolveFilter(ctx, userID, o.Filter)
}

// roomsSection builds the rooms part for (from, d.Pos] from what d holds
// (the memberships, the account data) and the rooms' timelines; nil
// without rooms.
func (s *Service) roomsSection(ctx context.Context, userID, deviceID string, from storage.StreamPos, d *storage.SyncData, eph map[string][]json.RawMessage, o SyncOptions, f roomserver.Filter) (*roomserver.SyncRooms, error) {
	if s.rooms == nil {
		return nil, nil
	}
	req := roomserver.SyncRequest{UserID: userID, DeviceID: deviceID, From: from, To: d.Pos, FullState: o.FullState, Filter: f, Token: streamtoken.Format,
		Memberships: d.RoomMemberships, RoomsWithEvents: d.RoomsWithEvents, HaveMemberships: true}
	if s.opts.AccountData != nil {
		req.AccountData = d.AccountData
	}
	rooms, err := s.rooms.Sync(ctx, req)
	if err == nil && rooms != nil && len(eph) > 0 {
		addEphemeral(rooms, eph, d, f)
	}
	if err == nil && rooms != nil && s.opts.Unread != nil && len(rooms.Join) > 0 {
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
func (s *Service) unreadCounts(ctx context.Context, userID string, upTo storage.StreamPos, rooms *roomserver.SyncRooms) error {
	ids := make([]string, 0, len(rooms.Join))
	for id := range rooms.Join {
		ids = append(ids, id)
	}
	counts, err := s.opts.Unread.UnreadCounts(ctx, userID, ids, upTo)
	if err != nil {
		return err
	}
	for id, r := range rooms.Join {
		c := counts[id]
		r.UnreadNotifications = &roomserver.UnreadNotifications{NotificationCount: c.Notifications, HighlightCount: c.Highlights}
	}
	return nil
}
