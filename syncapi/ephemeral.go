package syncapi

import (
	"encoding/json"
	"slices"

	"github.com/keyserver/keyserver/storage"
)

// Ephemeral is a source of the joined rooms' ephemeral events in /sync
// (typing.Service, receipts.Service), made from what the stream read
// holds: nothing is read again.
type Ephemeral interface {
	// SyncEphemeral returns the events d holds for userID, by room; the
	// rooms are ones userID is joined to.
	SyncEphemeral(userID string, d *storage.SyncData) map[string][]json.RawMessage
}

// ephemeral gathers the sources' events of an answer, by room, of the
// rooms the filter lets in.
func (s *Service) ephemeral(userID string, d *storage.SyncData, f RoomFilter) map[string][]json.RawMessage {
	var out map[string][]json.RawMessage
	for _, src := range s.opts.Ephemeral {
		for room, evs := range src.SyncEphemeral(userID, d) {
			if !f.WantsRoom(room) {
				continue
			}
			if out == nil {
				out = map[string][]json.RawMessage{}
			}
			out[room] = append(out[room], evs...)
		}
	}
	return out
}

// addEphemeral puts the ephemeral events into the rooms part: a joined
// room without anything else to show comes in for them when the user is
// joined to it as of the answer (the events are of rooms the filter lets
// in).
func addEphemeral(rooms RoomsSection, eph map[string][]json.RawMessage, d *storage.SyncData) {
	shown := rooms.JoinedRooms()
	for room, evs := range eph {
		if !slices.Contains(shown, room) && !slices.ContainsFunc(d.RoomMemberships, func(m storage.RoomMember) bool {
			return m.RoomID == room && m.Membership == storage.MembershipJoin && m.Pos <= d.Pos
		}) {
			continue
		}
		rooms.AddEphemeral(room, evs)
	}
}
