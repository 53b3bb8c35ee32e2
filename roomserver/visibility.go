package roomserver

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/matrixid"
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
	setting, err := s.settingAt(ctx, ev)
	if err != nil {
		return false, err
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

// settingAt is the history visibility an event is judged by: the setting
// before it, or for a change of the setting the more open of the settings
// before and after it.
func (s *Service) settingAt(ctx context.Context, ev storage.RoomEvent) (string, error) {
	setting, err := s.historyBefore(ctx, ev.StateBefore)
	if err != nil {
		return "", err
	}
	if ev.Type == spec.MRoomHistoryVisibility && ev.StateKey != nil && *ev.StateKey == "" {
		if after := historySetting(eventContentField(ev.JSON, "history_visibility")); historyOpenness[after] < historyOpenness[setting] {
			setting = after
		}
	}
	return setting, nil
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

// History visibility for other servers (backfill, missing events, single
// events): a server reads the room's events while one of its users is in
// it (mayRead); under invited and joined, an event from a time none of its
// users was joined (or, under invited, invited) is served redacted, as
// Synapse serves it, so the server keeps the room's graph and auth without
// the content. Judged by the state before the event, with the event's own
// change counted: a change of the setting, and a membership event of one
// of the server's users.

// serverView remembers, per snapshot, how a server's users stood in it.
type serverView struct {
	origin  string
	members map[int64]serverMembers
}

// serverMembers: whether the server had a user joined, or invited.
type serverMembers struct{ joined, invited bool }

// forServer returns the JSON of evs as origin may see each: whole, or
// redacted by the room version's rules.
func (s *Service) forServer(ctx context.Context, origin string, evs []storage.RoomEvent) ([]json.RawMessage, error) {
	v := serverView{origin: origin, members: map[int64]serverMembers{}}
	out := make([]json.RawMessage, 0, len(evs))
	for _, ev := range evs {
		whole, err := s.serverSees(ctx, &v, ev)
		if err != nil {
			return nil, err
		}
		if whole {
			out = append(out, json.RawMessage(ev.JSON))
			continue
		}
		impl, err := gomatrixserverlib.GetRoomVersion(gomatrixserverlib.RoomVersion(ev.RoomVersion))
		if err != nil {
			return nil, err
		}
		redacted, err := impl.RedactEventJSON(ev.JSON)
		if err != nil {
			return nil, err
		}
		out = append(out, redacted)
	}
	return out, nil
}

// serverSees reports whether the server may see an event whole.
func (s *Service) serverSees(ctx context.Context, v *serverView, ev storage.RoomEvent) (bool, error) {
	if ev.Pos == 0 {
		return true, nil // an outlier: an event other servers gave us, with no state known before it
	}
	setting, err := s.settingAt(ctx, ev)
	if err != nil {
		return false, err
	}
	if setting != historyInvited && setting != historyJoined {
		return true, nil
	}
	m, ok := v.members[ev.StateBefore]
	if !ok {
		var state []storage.RoomEvent
		if ev.StateBefore != 0 {
			if state, err = s.db.RoomStateBefore(ctx, ev.EventID); err != nil && !errors.Is(err, storage.ErrNotFound) {
				return false, err
			}
		}
		for _, st := range state {
			if st.Type == spec.MRoomMember && st.StateKey != nil && matrixid.Server(*st.StateKey) == v.origin {
				m.joined = m.joined || st.Membership == spec.Join
				m.invited = m.invited || st.Membership == spec.Invite
			}
		}
		v.members[ev.StateBefore] = m
	}
	if ev.Type == spec.MRoomMember && ev.StateKey != nil && matrixid.Server(*ev.StateKey) == v.origin {
		m.joined = m.joined || ev.Membership == spec.Join
		m.invited = m.invited || ev.Membership == spec.Invite
	}
	return m.joined || m.invited && setting == historyInvited, nil
}
