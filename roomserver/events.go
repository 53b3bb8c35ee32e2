package roomserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"sort"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/streamtoken"
	"github.com/keyserver/keyserver/storage"
)

// ClientEvent is an event as the client API shows it.
type ClientEvent struct {
	Content        json.RawMessage `json:"content"`
	EventID        string          `json:"event_id"`
	OriginServerTS int64           `json:"origin_server_ts"`
	RoomID         string          `json:"room_id"`
	Sender         string          `json:"sender"`
	StateKey       *string         `json:"state_key,omitempty"`
	Type           string          `json:"type"`
	Redacts        string          `json:"redacts,omitempty"`
	Unsigned       json.RawMessage `json:"unsigned,omitempty"`
}

// clientEvent formats a PDU for clients.
func clientEvent(ev gomatrixserverlib.PDU) ClientEvent {
	ce := ClientEvent{
		Content: json.RawMessage(ev.Content()), EventID: ev.EventID(), OriginServerTS: int64(ev.OriginServerTS()),
		RoomID: ev.RoomID().String(), Sender: string(ev.SenderID()), StateKey: ev.StateKey(), Type: ev.Type(), Redacts: ev.Redacts(),
	}
	if u := ev.Unsigned(); len(u) > 0 && string(u) != "{}" {
		ce.Unsigned = u
	}
	return ce
}

func clientEvents(evs []storage.RoomEvent) ([]ClientEvent, error) {
	out := make([]ClientEvent, 0, len(evs))
	for _, ev := range evs {
		p, err := pdu(ev)
		if err != nil {
			return nil, err
		}
		out = append(out, clientEvent(p))
	}
	return out, nil
}

// Send sends a message event (PUT /rooms/{roomId}/send/...): a retried
// request of the same device on the same path gets the same event ID.
func (s *Service) Send(ctx context.Context, sender, deviceID, roomID, evType, txnID string, content json.RawMessage) (string, error) {
	if !isObject(content) {
		return "", mxerr.BadJSON("the content must be a JSON object")
	}
	if evType == "" {
		return "", mxerr.BadJSON("the event type is empty")
	}
	if evType == spec.MRoomRedaction {
		var r struct {
			Redacts string `json:"redacts"`
		}
		if json.Unmarshal(content, &r) != nil || r.Redacts == "" {
			return "", mxerr.BadJSON("a redaction needs the ID of the event it redacts in content.redacts")
		}
		if err := s.checkLocalRedaction(ctx, sender, roomID, r.Redacts); err != nil {
			return "", err
		}
	}
	path, _ := json.Marshal([]string{"send", roomID, evType, txnID}) // unambiguous, whatever the parts hold
	txn := &storage.RoomTxn{UserID: sender, DeviceID: deviceID, Path: string(path)}
	ev, err := s.send(ctx, roomID, sender, evType, nil, content, txn)
	if err != nil {
		return "", err
	}
	return ev.EventID(), nil
}

// SendState sets a piece of state (PUT /rooms/{roomId}/state/...).
func (s *Service) SendState(ctx context.Context, sender, roomID, evType, stateKey string, content json.RawMessage) (string, error) {
	if !isObject(content) {
		return "", mxerr.BadJSON("the content must be a JSON object")
	}
	if evType == "" || len(evType) > 255 || len(stateKey) > 255 {
		return "", mxerr.BadJSON("the type and state key must be 1 to 255 and 0 to 255 bytes")
	}
	if evType == spec.MRoomCreate {
		return "", mxerr.BadJSON("a room has one create event")
	}
	// The same content set again by the same sender makes no new event:
	// its answer is the event that set it (as Synapse does).
	if same, err := s.sameState(ctx, roomID, sender, evType, stateKey, content); err != nil || same != "" {
		return same, err
	}
	ev, err := s.send(ctx, roomID, sender, evType, &stateKey, content, nil)
	if err != nil {
		return "", err
	}
	return ev.EventID(), nil
}

// sameState returns the ID of the room's current state event of that
// type and key when sender sent it with content equal to content
// (compared as canonical JSON); "" otherwise.
func (s *Service) sameState(ctx context.Context, roomID, sender, evType, stateKey string, content json.RawMessage) (string, error) {
	stored, err := s.db.RoomStateEvents(ctx, roomID, []storage.StateKey{{Type: evType, StateKey: stateKey}})
	if err != nil || len(stored) != 1 || stored[0].Sender != sender {
		return "", err
	}
	old, err := pdu(stored[0])
	if err != nil {
		return "", err
	}
	a, errA := gomatrixserverlib.CanonicalJSON(old.Content())
	b, errB := gomatrixserverlib.CanonicalJSON(content)
	if errA != nil || errB != nil || !bytes.Equal(a, b) {
		return "", nil
	}
	return old.EventID(), nil
}

// visible checks that the user may read a room now: a member (joined).
func (s *Service) joined(ctx context.Context, roomID, userID string) error {
	if _, err := s.db.Room(ctx, roomID); errors.Is(err, storage.ErrNotFound) {
		return errNoRoom(roomID)
	} else if err != nil {
		return err
	}
	m, err := s.db.RoomMembership(ctx, roomID, userID)
	if err != nil {
		return err
	}
	if m != spec.Join {
		return mxerr.Forbidden("you are not in room %s", roomID)
	}
	return nil
}

// State returns a room's current state; a user who left or was banned
// gets the state as it was when they left.
func (s *Service) State(ctx context.Context, userID, roomID string) ([]ClientEvent, error) {
	err := s.joined(ctx, roomID, userID)
	var mx *mxerr.Error
	if errors.As(err, &mx) && mx.Code == "M_FORBIDDEN" {
		return s.stateWhenLeft(ctx, userID, roomID, err)
	}
	if err != nil {
		return nil, err
	}
	evs, err := s.db.RoomCurrentState(ctx, roomID)
	if err != nil {
		return nil, err
	}
	return clientEvents(evs)
}

// stateWhenLeft is the state of a room after the user's leave (or ban),
// as Synapse answers it; a user who never had one gets notIn.
func (s *Service) stateWhenLeft(ctx context.Context, userID, roomID string, notIn error) ([]ClientEvent, error) {
	member, err := s.db.RoomStateEvents(ctx, roomID, []storage.StateKey{{Type: spec.MRoomMember, StateKey: userID}})
	if err != nil {
		return nil, err
	}
	if len(member) != 1 || (member[0].Membership != spec.Leave && member[0].Membership != spec.Ban) {
		// Anyone may read a world-readable room's current state (as
		// Synapse lets them peek).
		if r, err := s.historyReader(ctx, userID, roomID); err == nil && r.upTo == math.MaxInt64 {
			evs, err := s.db.RoomCurrentState(ctx, roomID)
			if err != nil {
				return nil, err
			}
			return clientEvents(evs)
		}
		return nil, notIn
	}
	before, err := s.db.RoomStateBefore(ctx, member[0].EventID)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, notIn // an invite to a room this server is not in, rejected
	} else if err != nil {
		return nil, err
	}
	var after []storage.RoomEvent
	for _, ev := range before {
		if ev.Type != spec.MRoomMember || ev.StateKey == nil || *ev.StateKey != userID {
			after = append(after, ev)
		}
	}
	return clientEvents(append(after, member[0]))
}

// StateEvent returns one piece of a room's state (GET
// /rooms/{roomId}/state/{type}/{key}, whose answer is its content, or the
// whole event with format=event).
func (s *Service) StateEvent(ctx context.Context, userID, roomID, evType, stateKey string) (ClientEvent, error) {
	state, err := s.State(ctx, userID, roomID)
	if err != nil {
		return ClientEvent{}, err
	}
	for _, ev := range state {
		if ev.Type == evType && ev.StateKey != nil && *ev.StateKey == stateKey {
			return ev, nil
		}
	}
	return ClientEvent{}, mxerr.NotFound("no state of type %q and key %q", evType, stateKey)
}

// MembersRequest is a /members request: At, a stream token, asks for the
// members as they were at that point (a /sync next_batch); Membership
// keeps the members with that membership and NotMembership those
// without it; given both, a member either keeps passes.
type MembersRequest struct {
	UserID, RoomID            string
	At                        string
	Membership, NotMembership string
}

// Members returns a room's member events (GET /rooms/{roomId}/members),
// at the point the user left for one who left.
func (s *Service) Members(ctx context.Context, req MembersRequest) ([]ClientEvent, error) {
	for _, m := range []string{req.Membership, req.NotMembership} {
		if _, known := membershipRank[m]; m != "" && !known {
			return nil, mxerr.InvalidParam("unknown membership %q", m)
		}
	}
	var state []ClientEvent
	var err error
	if req.At == "" {
		state, err = s.State(ctx, req.UserID, req.RoomID)
	} else {
		var at storage.StreamPos
		if at, err = streamtoken.ParsePage("at", req.At); err != nil {
			return nil, err
		}
		state, err = s.stateAt(ctx, req.UserID, req.RoomID, at)
	}
	if err != nil {
		return nil, err
	}
	out := []ClientEvent{}
	for _, ev := range state {
		if ev.Type != spec.MRoomMember {
			continue
		}
		m := contentField(ev.Content, "membership")
		keep := req.Membership == "" && req.NotMembership == "" ||
			req.Membership != "" && m == req.Membership || req.NotMembership != "" && m != req.NotMembership
		if keep {
			out = append(out, ev)
		}
	}
	return out, nil
}

// stateAt returns a room's state after the events up to position at (see
// stateAfter). One who left gets at most the state when they left.
func (s *Service) stateAt(ctx context.Context, userID, roomID string, at storage.StreamPos) ([]ClientEvent, error) {
	r, err := s.historyReader(ctx, userID, roomID)
	if err != nil {
		return nil, err
	}
	if !r.joinedNow && (at >= r.upTo || r.upTo == math.MaxInt64) {
		// One who left, asking from their leave on, gets the state as it
		// was then; one never in the room, what State answers them.
		return s.State(ctx, userID, roomID)
	}
	return s.stateAfter(ctx, roomID, at)
}

// stateAfter returns a room's state after its events up to position at:
// the state before its next event, or its current state when there is
// none.
func (s *Service) stateAfter(ctx context.Context, roomID string, at storage.StreamPos) ([]ClientEvent, error) {
	evs, err := s.stateAfterEvents(ctx, roomID, at)
	if err != nil {
		return nil, err
	}
	return clientEvents(evs)
}

// stateAfterEvents is stateAfter as stored events.
func (s *Service) stateAfterEvents(ctx context.Context, roomID string, at storage.StreamPos) ([]storage.RoomEvent, error) {
	next, err := s.db.RoomMessages(ctx, roomID, at, math.MaxInt64, 1, true)
	if err != nil {
		return nil, err
	}
	if len(next) == 0 {
		return s.db.RoomCurrentState(ctx, roomID)
	}
	return s.db.RoomStateBefore(ctx, next[0].EventID)
}

// JoinedMember is an entry of /joined_members.
type JoinedMember struct {
	DisplayName *string `json:"display_name"`
	AvatarURL   *string `json:"avatar_url"`
}

// JoinedMembers returns a room's joined members with their profiles, to
// a joined member only (as Synapse: one who left gets 403).
func (s *Service) JoinedMembers(ctx context.Context, userID, roomID string) (map[string]JoinedMember, error) {
	if err := s.joined(ctx, roomID, userID); err != nil {
		return nil, err
	}
	members, err := s.Members(ctx, MembersRequest{UserID: userID, RoomID: roomID})
	if err != nil {
		return nil, err
	}
	out := map[string]JoinedMember{}
	for _, ev := range members {
		var c struct {
			Membership  string  `json:"membership"`
			DisplayName *string `json:"displayname"`
			AvatarURL   *string `json:"avatar_url"`
		}
		if json.Unmarshal(ev.Content, &c) == nil && c.Membership == spec.Join {
			out[*ev.StateKey] = JoinedMember{DisplayName: c.DisplayName, AvatarURL: c.AvatarURL}
		}
	}
	return out, nil
}

// JoinedRooms lists the rooms the user is joined to.
func (s *Service) JoinedRooms(ctx context.Context, userID string) ([]string, error) {
	ms, err := s.db.UserRoomMemberships(ctx, userID)
	if err != nil {
		return nil, err
	}
	out := []string{}
	for _, m := range ms {
		if m.Membership == spec.Join {
			out = append(out, m.RoomID)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Event returns one event of a room, if the user may see it: 404 for an
// event they may not, as for one that does not exist.
func (s *Service) Event(ctx context.Context, userID, roomID, eventID string) (ClientEvent, error) {
	r, err := s.historyReader(ctx, userID, roomID)
	if err != nil {
		return ClientEvent{}, err
	}
	ev, err := s.db.RoomEvent(ctx, eventID)
	if errors.Is(err, storage.ErrNotFound) || (err == nil && (ev.RoomID != roomID || ev.Pos == 0 || ev.Pos > r.upTo)) {
		return ClientEvent{}, mxerr.NotFound("unknown event %s", eventID)
	}
	if err != nil {
		return ClientEvent{}, err
	}
	if ok, err := s.visible(ctx, r.viewer, ev); err != nil {
		return ClientEvent{}, err
	} else if !ok {
		return ClientEvent{}, mxerr.NotFound("unknown event %s", eventID)
	}
	p, err := pdu(ev)
	if err != nil {
		return ClientEvent{}, err
	}
	return clientEvent(p), nil
}
