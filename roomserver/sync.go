package roomserver

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// The rooms part of /sync.
//
// Room events take their positions from the stream /sync tokens are made
// of ("s<pos>"), so a token stands for every room event up to it as well,
// and tokens handed out before rooms existed stay valid. A room write
// names the room's local members (joined and invited) in its
// storage.Change, whose waiting /sync requests wake.

// SyncStore is what /sync, /messages and filters read and write of rooms.
type SyncStore interface {
	RoomTimeline(ctx context.Context, roomID string, from, to storage.StreamPos, limit int) ([]storage.RoomEvent, bool, error)
	RoomMessages(ctx context.Context, roomID string, from, to storage.StreamPos, limit int, forward bool) ([]storage.RoomEvent, error)
	CurrentPos(ctx context.Context) (storage.StreamPos, error)
	PutSyncFilter(ctx context.Context, userID string, filter []byte) (int64, error)
	SyncFilter(ctx context.Context, userID string, id int64) ([]byte, error)
}

// Filter is the part of a /sync filter this server applies; other fields
// are accepted and ignored.
type Filter struct {
	Room struct {
		Rooms        *[]string   `json:"rooms"`
		NotRooms     []string    `json:"not_rooms"`
		IncludeLeave bool        `json:"include_leave"`
		Timeline     EventFilter `json:"timeline"`
		State        StateFilter `json:"state"`
	} `json:"room"`
}

// EventFilter is the part of an event filter this server applies: the
// timeline's length, and which events it shows (as /messages does).
type EventFilter struct {
	Limit *int `json:"limit"`
	RoomEventFilter
}

// DefaultTimelineLimit is the timeline's length without a filter's limit;
// MaxTimelineLimit caps a filter's.
const (
	DefaultTimelineLimit = 10
	MaxTimelineLimit     = 100
)

func (f Filter) timelineLimit() int {
	if f.Room.Timeline.Limit == nil {
		return DefaultTimelineLimit
	}
	return min(max(*f.Room.Timeline.Limit, 1), MaxTimelineLimit)
}

func (f Filter) wants(roomID string) bool {
	if slices.Contains(f.Room.NotRooms, roomID) {
		return false
	}
	return f.Room.Rooms == nil || slices.Contains(*f.Room.Rooms, roomID)
}

// parseFilter reads a filter's JSON: an object whose known fields have
// the right types.
func parseFilter(raw []byte) (Filter, error) {
	var f Filter
	if !isObject(raw) {
		return f, mxerr.BadJSON("the filter must be a JSON object")
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return f, mxerr.BadJSON("invalid filter: %v", err)
	}
	return f, nil
}

// PutFilter stores a filter of the caller's (POST /user/{userId}/filter).
func (s *Service) PutFilter(ctx context.Context, callerID, userID string, raw json.RawMessage) (string, error) {
	if userID != callerID {
		return "", mxerr.Forbidden("cannot create filters for other users")
	}
	if _, err := parseFilter(raw); err != nil {
		return "", err
	}
	compact := gomatrixserverlib.CompactJSON(raw, make([]byte, 0, len(raw)))
	id, err := s.db.PutSyncFilter(ctx, userID, compact)
	if err != nil {
		return "", err
	}
	return strconv.FormatInt(id, 10), nil
}

// GetFilter returns a stored filter of the caller's.
func (s *Service) GetFilter(ctx context.Context, callerID, userID, filterID string) (json.RawMessage, error) {
	if userID != callerID {
		return nil, mxerr.Forbidden("cannot read the filters of other users")
	}
	id, err := strconv.ParseInt(filterID, 10, 64)
	if err != nil {
		return nil, mxerr.NotFound("unknown filter %q", filterID)
	}
	raw, err := s.db.SyncFilter(ctx, userID, id)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, mxerr.NotFound("unknown filter %q", filterID)
	}
	return raw, err
}

// ResolveFilter reads /sync's filter parameter: inline JSON when it
// starts with "{", else the ID of a stored filter; empty: no filter.
func (s *Service) ResolveFilter(ctx context.Context, userID, param string) (Filter, error) {
	switch {
	case param == "":
		return Filter{}, nil
	case strings.HasPrefix(param, "{"):
		return parseFilter([]byte(param))
	}
	raw, err := s.GetFilter(ctx, userID, userID, param)
	if err != nil {
		var mx *mxerr.Error
		if errors.As(err, &mx) && mx.Code == "M_NOT_FOUND" {
			return Filter{}, mxerr.BadJSON("unknown filter %q", param)
		}
		return Filter{}, err
	}
	return parseFilter(raw)
}

// SyncRequest asks for the rooms part of a /sync answer.
type SyncRequest struct {
	UserID    string
	DeviceID  string            // whose lazy-loaded members are remembered
	From, To  storage.StreamPos // From 0: an initial sync
	FullState bool
	Filter    Filter
	// AccountData are the user's account data changes in the range; the
	// per-room ones go under their joined rooms.
	AccountData []storage.AccountData
	// Token formats a stream position as a /sync token (prev_batch).
	Token func(storage.StreamPos) string
	// Memberships are the user's memberships (UserRoomMemberships) and
	// RoomsWithEvents the rooms among them with an event in the range,
	// sorted, when HaveMemberships: read with the rest of the answer,
	// they are not read again, and a joined room without events in the
	// range has no timeline to read.
	Memberships     []storage.RoomMember
	RoomsWithEvents []string
	HaveMemberships bool
}

// SyncRooms is the rooms part of a /sync answer.
type SyncRooms struct {
	Join   map[string]*JoinedRoom  `json:"join"`
	Invite map[string]*InvitedRoom `json:"invite"`
	Leave  map[string]*LeftRoom    `json:"leave"`
	// Knock holds the rooms the user knocked on (knock.go).
	Knock map[string]*KnockedRoom `json:"knock"`
}

// Events is a list of client events.
type Events struct {
	Events []ClientEvent `json:"events"`
}

// Timeline is a room's timeline in /sync.
type Timeline struct {
	Events    []ClientEvent `json:"events"`
	Limited   bool          `json:"limited"`
	PrevBatch string        `json:"prev_batch,omitempty"`
}

// AccountDataEvents is a room's account data in /sync.
type AccountDataEvents struct {
	Events []AccountDataEvent `json:"events"`
}

// AccountDataEvent is one type of a room's account data.
type AccountDataEvent struct {
	Type    string          `json:"type"`
	Content json.RawMessage `json:"content"`
}

// JoinedRoom is an entry of rooms.join.
type JoinedRoom struct {
	Summary     *RoomSummary      `json:"summary,omitempty"`
	State       Events            `json:"state"`
	Timeline    Timeline          `json:"timeline"`
	AccountData AccountDataEvents `json:"account_data"`
	Ephemeral   EphemeralEvents   `json:"ephemeral"`
	// UnreadNotifications are the room's unread counts (package pusher).
	UnreadNotifications *UnreadNotifications `json:"unread_notifications,omitempty"`
}

// UnreadNotifications are a joined room's unread notification counts.
type UnreadNotifications struct {
	NotificationCount int `json:"notification_count"`
	HighlightCount    int `json:"highlight_count"`
}

// RoomSummary is a joined room's summary in /sync: what a client needs
// to name a room that has no name, and its member counts. It comes with
// an initial sync, a room newly joined and whenever the events in the
// answer change the members, the name or the canonical alias; it is
// left out otherwise, as unchanged.
type RoomSummary struct {
	Heroes       []string `json:"m.heroes"`
	JoinedCount  int      `json:"m.joined_member_count"`
	InvitedCount int      `json:"m.invited_member_count"`
}

// maxHeroes is how many members m.heroes names.
const maxHeroes = 5

// changesSummary reports whether events may change a room's summary.
func changesSummary(evs []ClientEvent) bool {
	for _, ev := range evs {
		if ev.Type == spec.MRoomMember || ev.Type == spec.MRoomName || ev.Type == spec.MRoomCanonicalAlias {
			return true
		}
	}
	return false
}

// summary computes a room's summary from its current state: heroes are
// the first members to have joined or been invited, in stream order, the
// user left out; when there are none, those who left or were banned.
func (s *Service) summary(ctx context.Context, roomID, userID string) (*RoomSummary, error) {
	state, err := s.db.RoomCurrentState(ctx, roomID)
	if err != nil {
		return nil, err
	}
	var members []storage.RoomEvent
	for _, ev := range state {
		if ev.Type == spec.MRoomMember && ev.StateKey != nil {
			members = append(members, ev)
		}
	}
	slices.SortFunc(members, func(a, b storage.RoomEvent) int {
		return cmp.Or(cmp.Compare(a.Pos, b.Pos), strings.Compare(*a.StateKey, *b.StateKey))
	})
	out := &RoomSummary{Heroes: []string{}}
	var gone []string
	for _, ev := range members {
		switch ev.Membership {
		case spec.Join:
			out.JoinedCount++
		case spec.Invite:
			out.InvitedCount++
		}
		if *ev.StateKey == userID {
			continue
		}
		if ev.Membership == spec.Join || ev.Membership == spec.Invite {
			if len(out.Heroes) < maxHeroes {
				out.Heroes = append(out.Heroes, *ev.StateKey)
			}
		} else if len(gone) < maxHeroes {
			gone = append(gone, *ev.StateKey)
		}
	}
	if len(out.Heroes) == 0 {
		out.Heroes = orEmpty(gone)
	}
	return out, nil
}

// InvitedRoom is an entry of rooms.invite.
type InvitedRoom struct {
	InviteState struct {
		Events []StrippedEvent `json:"events"`
	} `json:"invite_state"`
}

// StrippedEvent is an event of an invite's or a knock's stripped state:
// type, state key, sender and content, but for the room's create event,
// shown whole (with its ID, room ID and timestamp) so that clients can
// tell which room and creator an invite is for (MSC4311).
type StrippedEvent struct {
	gomatrixserverlib.InviteStrippedState
	full json.RawMessage
}

func (e StrippedEvent) MarshalJSON() ([]byte, error) {
	if e.full != nil {
		return e.full, nil
	}
	return json.Marshal(e.InviteStrippedState)
}

// strippedEvent is the stripped form of one of a room's state events.
func strippedEvent(p gomatrixserverlib.PDU) StrippedEvent {
	e := StrippedEvent{InviteStrippedState: gomatrixserverlib.NewInviteStrippedState(p)}
	if p.Type() == spec.MRoomCreate && p.StateKeyEquals("") {
		e.full, _ = json.Marshal(clientEvent(p))
	}
	return e
}

// receivedStripped is an entry of the stripped state another server gave;
// its create event is shown whole when it came as a valid PDU of the
// room (createPDU, kept from the invite).
func receivedStripped(st gomatrixserverlib.InviteStrippedState, createPDU json.RawMessage, version gomatrixserverlib.RoomVersion, roomID string) StrippedEvent {
	e := StrippedEvent{InviteStrippedState: st}
	if st.Type() != spec.MRoomCreate || createPDU == nil {
		return e
	}
	impl, err := gomatrixserverlib.GetRoomVersion(version)
	if err != nil {
		return e
	}
	if p, err := impl.NewEventFromUntrustedJSON(createPDU); err == nil && p.RoomID().String() == roomID && p.Type() == spec.MRoomCreate {
		e.full, _ = json.Marshal(clientEvent(p))
	}
	return e
}

// LeftRoom is an entry of rooms.leave.
type LeftRoom struct {
	State       Events            `json:"state"`
	Timeline    Timeline          `json:"timeline"`
	AccountData AccountDataEvents `json:"account_data"`
}

// Empty reports whether the section has no room.
func (r *SyncRooms) Empty() bool {
	return r == nil || len(r.Join)+len(r.Invite)+len(r.Leave)+len(r.Knock) == 0
}

// strippedTypes are the state an invitee is shown of the room.
var strippedTypes = []string{
	spec.MRoomCreate, spec.MRoomName, "m.room.avatar", spec.MRoomTopic, spec.MRoomJoinRules,
	spec.MRoomCanonicalAlias, spec.MRoomEncryption,
}

// Sync builds the rooms part of /sync for the range (From, To].
func (s *Service) Sync(ctx context.Context, req SyncRequest) (*SyncRooms, error) {
	out := &SyncRooms{Join: map[string]*JoinedRoom{}, Invite: map[string]*InvitedRoom{}, Leave: map[string]*LeftRoom{},
		Knock: map[string]*KnockedRoom{}}
	memberships := req.Memberships
	if !req.HaveMemberships {
		var err error
		if memberships, err = s.db.UserRoomMemberships(ctx, req.UserID); err != nil {
			return nil, err
		}
	}
	roomData := map[string][]AccountDataEvent{}
	for _, d := range req.AccountData {
		if d.RoomID != "" {
			roomData[d.RoomID] = append(roomData[d.RoomID], AccountDataEvent{Type: d.Type, Content: d.Content})
		}
	}
	limit := req.Filter.timelineLimit()
	for _, m := range memberships {
		if !req.Filter.wants(m.RoomID) || m.Pos > req.To {
			// A membership newer than the answer's token comes next time.
			continue
		}
		switch m.Membership {
		case spec.Join:
			// A user who joined in the range gets the room's whole state.
			full := req.From == 0 || req.FullState || m.Pos > req.From
			data := roomData[m.RoomID]
			if !full && len(data) == 0 && req.HaveMemberships {
				if _, events := slices.BinarySearch(req.RoomsWithEvents, m.RoomID); !events {
					continue // nothing to show: its timeline in the range is empty
				}
			}
			timeline, state, err := s.syncTimeline(ctx, m.RoomID, req, true, req.To, limit, full)
			if err != nil {
				return nil, err
			}
			if len(timeline.Events) == 0 && len(state.Events) == 0 && len(data) == 0 && !full {
				continue
			}
			room := &JoinedRoom{State: state, Timeline: timeline,
				AccountData: AccountDataEvents{Events: orEmpty(data)}, Ephemeral: EphemeralEvents{Events: []json.RawMessage{}}}
			if full || changesSummary(timeline.Events) || changesSummary(state.Events) {
				if room.Summary, err = s.summary(ctx, m.RoomID, req.UserID); err != nil {
					return nil, err
				}
				if req.Filter.Room.State.LazyLoadMembers {
					if err := s.heroMembers(ctx, req, m.RoomID, room, full); err != nil {
						return nil, err
					}
				}
			}
			out.Join[m.RoomID] = room
		case spec.Invite:
			if req.From != 0 && m.Pos <= req.From {
				continue
			}
			inv, err := s.inviteState(ctx, m.EventID)
			if err != nil {
				return nil, err
			}
			out.Invite[m.RoomID] = inv
		case spec.Knock:
			if req.From != 0 && m.Pos <= req.From {
				continue
			}
			k, err := s.knockState(ctx, m.EventID)
			if err != nil {
				return nil, err
			}
			out.Knock[m.RoomID] = k
		default: // leave, ban
			if (req.From == 0 && !req.Filter.Room.IncludeLeave) || (req.From != 0 && m.Pos <= req.From) {
				continue
			}
			full := req.From == 0 || req.FullState
			timeline, state, err := s.syncTimeline(ctx, m.RoomID, req, false, m.Pos, limit, full)
			if err != nil {
				return nil, err
			}
			out.Leave[m.RoomID] = &LeftRoom{State: state, Timeline: timeline,
				AccountData: AccountDataEvents{Events: orEmpty(roomData[m.RoomID])}}
		}
	}
	return out, nil
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// syncTimeline returns a room's timeline in (From, to] and the state
// before its first event: all of it when full, else the state that
// changed since From in a gap the timeline leaves out (limited: by the
// limit, or after a gap in the room's history, syncgaps.go); with lazy
// loading, of the members only those lazyMembers keeps. Events the user
// may not see (history visibility; joinedNow: the user is in the room)
// are left out.
func (s *Service) syncTimeline(ctx context.Context, roomID string, req SyncRequest, joinedNow bool, to storage.StreamPos, limit int, full bool) (Timeline, Events, error) {
	from := req.From
	if full {
		from = 0
	}
	v := viewer{userID: req.UserID, joinedNow: joinedNow}
	var evs []storage.RoomEvent
	var limited, dropped bool // dropped: events of the range left out by the filter or visibility
	var err error
	if f := req.Filter.Room.Timeline.RoomEventFilter; f.active() {
		evs, limited, dropped, err = s.filteredTimeline(ctx, roomID, v, f, from, to, limit)
	} else if evs, limited, err = s.db.RoomTimeline(ctx, roomID, from, to, limit); err == nil {
		read := len(evs)
		evs, err = s.visibleEvents(ctx, v, evs)
		dropped = len(evs) < read
	}
	if err != nil {
		return Timeline{}, Events{}, err
	}
	var gapped bool
	if evs, gapped, err = s.afterGap(ctx, evs); err != nil {
		return Timeline{}, Events{}, err
	}
	limited = limited || gapped
	timeline := Timeline{Limited: limited}
	if timeline.Events, err = s.bundledEvents(ctx, req.UserID, evs); err != nil {
		return Timeline{}, Events{}, err
	}
	timeline.Events = orEmpty(timeline.Events)
	state := Events{Events: []ClientEvent{}}
	if len(evs) > 0 && req.Token != nil {
		timeline.PrevBatch = req.Token(evs[0].Pos - 1)
	}
	lazy := req.Filter.Room.State.LazyLoadMembers
	if !full && !limited && !dropped && !lazy {
		return timeline, state, nil
	}
	var keep []storage.RoomEvent
	if full || limited || dropped {
		if keep, err = s.stateBeforeTimeline(ctx, roomID, req.From, to, evs, full); err != nil {
			return Timeline{}, Events{}, err
		}
	}
	if lazy {
		if keep, err = s.lazyMembers(ctx, req, roomID, evs, keep, full); err != nil {
			return Timeline{}, Events{}, err
		}
	}
	if state.Events, err = clientEvents(keep); err != nil {
		return Timeline{}, Events{}, err
	}
	state.Events = orEmpty(state.Events)
	return timeline, state, nil
}

// stateBeforeTimeline is the state of a /sync entry: the state before
// the timeline's first event (with no event, the state at its end), all
// of it when full, else what differs from the state at from (what
// changed in a gap the timeline leaves out, including state fetched from
// another server with an event that came after a gap).
func (s *Service) stateBeforeTimeline(ctx context.Context, roomID string, from, to storage.StreamPos, evs []storage.RoomEvent, full bool) ([]storage.RoomEvent, error) {
	var before []storage.RoomEvent
	var err error
	if len(evs) > 0 {
		before, err = s.db.RoomStateBefore(ctx, evs[0].EventID)
	} else {
		before, err = s.stateAfterEvents(ctx, roomID, to)
	}
	if err != nil || full {
		return before, err
	}
	known, err := s.stateAtPos(ctx, roomID, from)
	if err != nil {
		return nil, err
	}
	had := make(map[string]bool, len(known))
	for _, ev := range known {
		had[ev.EventID] = true
	}
	var keep []storage.RoomEvent
	for _, ev := range before {
		if !had[ev.EventID] {
			keep = append(keep, ev)
		}
	}
	return keep, nil
}

// filteredTimeline is the timeline in (from, to] of the events that pass
// a filter (and history visibility): up to limit of the newest, read
// backwards a page at a time (at most messagesScans pages); limited when
// more may pass before them, dropped when it read events it left out.
func (s *Service) filteredTimeline(ctx context.Context, roomID string, v viewer, f RoomEventFilter, from, to storage.StreamPos, limit int) (_ []storage.RoomEvent, limited, dropped bool, _ error) {
	var out []storage.RoomEvent
	high, truncated, read := to, false, 0
	for scan := 0; scan < messagesScans && high > from && len(out) < limit; scan++ {
		page, err := s.db.RoomMessages(ctx, roomID, from, high, limit, false)
		if err != nil {
			return nil, false, false, err
		}
		read += len(page)
		var keep []storage.RoomEvent
		for _, ev := range page {
			if f.matches(ev) {
				keep = append(keep, ev)
			}
		}
		if keep, err = s.visibleEvents(ctx, v, keep); err != nil {
			return nil, false, false, err
		}
		if room := limit - len(out); len(keep) > room {
			keep, truncated = keep[:room], true
		}
		out = append(out, keep...)
		if len(page) < limit {
			high = from // read to the start of the range
			break
		}
		high = page[len(page)-1].Pos - 1
	}
	slices.Reverse(out)
	return out, truncated || high > from, read > len(out), nil
}

// inviteState is an invitee's view of a room: stripped state after the
// invite, the invite itself included.
func (s *Service) inviteState(ctx context.Context, inviteID string) (*InvitedRoom, error) {
	invite, err := s.db.RoomEvent(ctx, inviteID)
	if err != nil {
		return nil, err
	}
	before, err := s.db.RoomStateBefore(ctx, inviteID)
	if err != nil && !errors.Is(err, storage.ErrNotFound) {
		return nil, err
	}
	inv := &InvitedRoom{}
	inv.InviteState.Events = []StrippedEvent{}
	if errors.Is(err, storage.ErrNotFound) {
		// An invite to a room this server is not in: the stripped state
		// its sender gave, kept in the event's unsigned part.
		p, err := pdu(invite)
		if err != nil {
			return nil, err
		}
		var unsigned struct {
			InviteRoomState  []gomatrixserverlib.InviteStrippedState `json:"invite_room_state"`
			InviteRoomCreate json.RawMessage                         `json:"invite_room_create"`
		}
		_ = json.Unmarshal(p.Unsigned(), &unsigned)
		for _, st := range unsigned.InviteRoomState {
			if st.Type() != spec.MRoomMember || st.StateKey() == nil || *st.StateKey() != *invite.StateKey {
				inv.InviteState.Events = append(inv.InviteState.Events,
					receivedStripped(st, unsigned.InviteRoomCreate, p.Version(), invite.RoomID))
			}
		}
		inv.InviteState.Events = append(inv.InviteState.Events, strippedEvent(p))
		return inv, nil
	}
	for _, ev := range append(before, invite) {
		if !slices.Contains(strippedTypes, ev.Type) && ev.EventID != inviteID {
			continue
		}
		p, err := pdu(ev)
		if err != nil {
			return nil, err
		}
		inv.InviteState.Events = append(inv.InviteState.Events, strippedEvent(p))
	}
	return inv, nil
}
