package roomserver

import (
	"context"
	"encoding/json"

	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/storage"
)

// History visibility: which of a room's events a user may read, by the
// room's m.room.history_visibility and the user's membership in the state
// before each event, as the client-server specification gives it and
// Synapse applies it:
//
//  1. world_readable: anyone may read the event;
//  2. a user whose membership was join may;
//  3. shared: a user joined now may (the whole history is theirs once they
//     join; one who joined and left keeps what they saw while joined);
//  4. invited: a user whose membership was invite may;
//  5. no one else.
//
// A user always sees their own membership events (their join under
// joined, their leave), and a change of the setting is judged by the more
// open of the settings before and after it, so the change itself shows.
// A missing or unknown setting counts as shared, the default.

const (
	historyWorldReadable = "world_readable"
	historyShared        = "shared"
	historyInvited       = "invited"
	historyJoined        = "joined"
)

// historyOpenness orders the settings, the most open first.
var historyOpenness = map[string]int{historyWorldReadable: 0, historyShared: 1, historyInvited: 2, historyJoined: 3}

// membershipRank orders memberships, the one that sees most first.
var membershipRank = map[string]int{spec.Join: 0, spec.Invite: 1, spec.Knock: 2, spec.Leave: 3, spec.Ban: 4}

var historyKey = storage.StateKey{Type: spec.MRoomHistoryVisibility}

// viewer is a user reading a room's history; joinedNow: their membership
// in the room's current state is join (rule 3).
type viewer struct {
	userID    string
	joinedNow bool
}

// visibleEvents returns the events of evs the viewer may read, in order.
// The state each is judged by comes from the state cache: a room's
// messages share their snapshot, so a page reads it once.
func (s *Service) visibleEvents(ctx context.Context, v viewer, evs []storage.RoomEvent) ([]storage.RoomEvent, error) {
	out := evs[:0:0]
	for _, ev := range evs {
		ok, err := s.visible(ctx, v, ev)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, ev)
		}
	}
	return out, nil
}

// visible reports whether the viewer may read one event.
func (s *Service) visible(ctx context.Context, v viewer, ev storage.RoomEvent) (bool, error) {
	if ev.Pos == 0 {
		return false, nil // an outlier: not in the room's timeline
	}
	setting, err := s.historyBefore(ctx, ev.StateBefore)
	if err != nil {
		return false, err
	}
	if ev.Type == spec.MRoomHistoryVisibility && ev.StateKey != nil && *ev.StateKey == "" {
		if after := historySetting(eventContentField(ev.JSON, "history_visibility")); historyOpenness[after] < historyOpenness[setting] {
			setting = after
		}
	}
	if setting == historyWorldReadable {
		return true, nil
	}
	if setting == historyShared && v.joinedNow {
		return true, nil
	}
	membership, err := s.membershipBefore(ctx, ev.StateBefore, v.userID)
	if err != nil {
		return false, err
	}
	if ev.Type == spec.MRoomMember && ev.StateKey != nil && *ev.StateKey == v.userID {
		// Their own membership event: leaving (or being removed) shows
		// to one who was in or invited, else the better of before and
		// after counts.
		if (ev.Membership == spec.Leave || ev.Membership == spec.Ban) && (membership == spec.Join || membership == spec.Invite) {
			return true, nil
		}
		if r, ok := membershipRank[ev.Membership]; ok && r < rank(membership) {
			membership = ev.Membership
		}
	}
	switch membership {
	case spec.Join:
		return true, nil
	case spec.Invite:
		return setting == historyInvited, nil
	}
	return false, nil
}

// rank is a membership's place in membershipRank; none ranks last.
func rank(membership string) int {
	if r, ok := membershipRank[membership]; ok {
		return r
	}
	return len(membershipRank)
}

// historyBefore is the history visibility setting of a snapshot (0: the
// empty state before a room's create event).
func (s *Service) historyBefore(ctx context.Context, snapshot int64) (string, error) {
	if snapshot == 0 {
		return historyShared, nil
	}
	evs, err := s.snapshotState(ctx, snapshot, []storage.StateKey{historyKey})
	if err != nil || len(evs) == 0 {
		return historyShared, err
	}
	return historySetting(contentField(evs[0].Content(), "history_visibility")), nil
}

// membershipBefore is a user's membership in a snapshot ("" if none).
func (s *Service) membershipBefore(ctx context.Context, snapshot int64, userID string) (string, error) {
	if snapshot == 0 {
		return "", nil
	}
	evs, err := s.snapshotState(ctx, snapshot, []storage.StateKey{{Type: spec.MRoomMember, StateKey: userID}})
	if err != nil || len(evs) == 0 {
		return "", err
	}
	return contentField(evs[0].Content(), "membership"), nil
}

// historySetting maps a setting as written to one of the four.
func historySetting(v string) string {
	if _, ok := historyOpenness[v]; ok {
		return v
	}
	return historyShared
}

// contentField reads a string field of an event's content ("" if
// absent or not a string).
func contentField(content []byte, field string) string {
	var fields map[string]json.RawMessage
	var v string
	if json.Unmarshal(content, &fields) != nil || json.Unmarshal(fields[field], &v) != nil {
		return ""
	}
	return v
}

// eventContentField is contentField of a whole event's JSON.
func eventContentField(eventJSON []byte, field string) string {
	var ev struct {
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(eventJSON, &ev) != nil {
		return ""
	}
	return contentField(ev.Content, field)
}
