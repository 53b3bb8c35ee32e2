package roomserver

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/roomversion"
	"github.com/keyserver/keyserver/storage"
)

// Knocking (room versions 7+, join rules knock and, from version 10,
// knock_restricted): a user asks to be let in with a member event of
// membership knock, which the room's members see; an invite accepts it,
// a kick rejects it, and the knocker's leave withdraws it. A room this
// server is not in is knocked on over federation (make_knock and
// send_knock, whose answer is the room's stripped state); the knocker
// sees the room in /sync under rooms.knock with that state.

// Knocks is what knocking on a room of another server asks of it; the
// Handshakes of Options that also implement it knock over federation.
type Knocks interface {
	MakeKnock(ctx context.Context, dest, roomID, userID string, versions []string) (gomatrixserverlib.ProtoEvent, gomatrixserverlib.RoomVersion, error)
	// SendKnock returns the knock_room_state of the answer.
	SendKnock(ctx context.Context, dest string, event gomatrixserverlib.PDU) ([]json.RawMessage, error)
}

// KnockedRoom is an entry of rooms.knock in /sync.
type KnockedRoom struct {
	KnockState struct {
		Events []StrippedEvent `json:"events"`
	} `json:"knock_state"`
}

// knockStateKey is where the stripped state a remote room's server
// answered a knock with is kept: the knock event's unsigned part.
const knockStateKey = "knock_room_state"

// Knock knocks on a room by ID or alias for userID and returns the room
// ID. A room this server is in gets a local event; any other is knocked
// on through via, the servers an alias named, and the room ID's server.
func (s *Service) Knock(ctx context.Context, userID, roomIDOrAlias, reason string, via []string) (string, error) {
	roomID := roomIDOrAlias
	servers := slices.Clone(via)
	if strings.HasPrefix(roomIDOrAlias, "#") {
		a, aliasServers, err := s.resolveAlias(ctx, roomIDOrAlias)
		if err != nil {
			return "", err
		}
		roomID = a
		servers = append(servers, aliasServers...)
	} else if !matrixid.ValidRoomID(roomIDOrAlias) {
		return "", mxerr.InvalidParam("%q is neither a room ID nor an alias", roomIDOrAlias)
	}
	content := map[string]any{"membership": spec.Knock}
	if reason != "" {
		content["reason"] = reason
	}
	content, err := s.withProfile(ctx, userID, content)
	if err != nil {
		return "", err
	}
	local, err := s.joinsLocally(ctx, roomID)
	if err != nil {
		return "", err
	}
	if local {
		if _, err := s.send(ctx, roomID, userID, spec.MRoomMember, &userID, content, nil); err != nil {
			return "", err
		}
		return roomID, nil
	}
	servers = append(servers, s.roomServer(ctx, roomID))
	var unique []string
	for _, srv := range servers {
		if srv != "" && srv != s.opts.ServerName && !slices.Contains(unique, srv) {
			unique = append(unique, srv)
		}
	}
	if err := s.knockRemote(ctx, userID, roomID, unique, content); err != nil {
		return "", err
	}
	return roomID, nil
}

// knockRemote knocks on a room this server is not in through the first
// of servers that answers: make_knock, the template checked, completed
// with content and signed, send_knock; the knock is then kept with the
// stripped state of the answer as the user's membership of the room.
func (s *Service) knockRemote(ctx context.Context, userID, roomID string, servers []string, content map[string]any) error {
	knocks, ok := s.opts.Handshakes.(Knocks)
	if !ok || len(servers) == 0 {
		return errNoRoom(roomID)
	}
	supported := RoomVersions()
	var lastErr error
	for _, server := range servers {
		ev, stripped, err := s.knockThrough(ctx, knocks, server, userID, roomID, supported, content)
		if err != nil {
			lastErr = err
			s.opts.Logger.WithField("server", server).WithField("room_id", roomID).WithError(err).Info("knocking through a server failed")
			var me *mxerr.Error
			if errors.As(err, &me) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
				break // a refusal of the room's rules, or no time left
			}
			continue
		}
		return s.storeRemoteKnock(ctx, ev, stripped)
	}
	var me *mxerr.Error
	if errors.As(lastErr, &me) {
		return me
	}
	return remoteJoinError(ctx, lastErr)
}

func (s *Service) knockThrough(ctx context.Context, knocks Knocks, server, userID, roomID string, supported map[string]string, content map[string]any) (gomatrixserverlib.PDU, []json.RawMessage, error) {
	proto, version, err := knocks.MakeKnock(ctx, server, roomID, userID, slices.Sorted(mapsKeys(supported)))
	if err != nil {
		var status statusError
		if errors.As(err, &status) && status.StatusCode() == http.StatusBadRequest && status.ErrCode() == "M_INCOMPATIBLE_ROOM_VERSION" {
			return nil, nil, mxerr.New(http.StatusBadRequest, "M_INCOMPATIBLE_ROOM_VERSION", "this server does not support the room's version")
		}
		if errors.As(err, &status) && status.StatusCode() == http.StatusForbidden {
			return nil, nil, mxerr.Forbidden("the room's server refused: %s", status.ErrMessage())
		}
		return nil, nil, err
	}
	if supported[string(version)] == "" {
		return nil, nil, mxerr.New(http.StatusBadRequest, "M_INCOMPATIBLE_ROOM_VERSION", "this server does not support room version %q", version)
	}
	impl := gomatrixserverlib.MustGetRoomVersion(version)
	var tmpl struct {
		Membership string `json:"membership"`
	}
	if json.Unmarshal(proto.Content, &tmpl) != nil || tmpl.Membership != spec.Knock || proto.Type != spec.MRoomMember ||
		proto.StateKey == nil || *proto.StateKey != userID || proto.SenderID != userID || proto.RoomID != roomID {
		return nil, nil, errors.New("the room's server answered with a wrong template")
	}
	if err := proto.SetContent(content); err != nil {
		return nil, nil, err
	}
	ev, err := roomversion.Build(impl.Version(), &proto, s.opts.Now(), spec.ServerName(s.opts.ServerName), s.opts.KeyID, s.opts.PrivateKey)
	if err != nil {
		return nil, nil, errors.New("the room's template cannot be built: " + err.Error())
	}
	stripped, err := knocks.SendKnock(ctx, server, ev)
	if err != nil {
		var status statusError
		if errors.As(err, &status) && status.StatusCode() == http.StatusForbidden {
			return nil, nil, mxerr.Forbidden("the room's server refused: %s", status.ErrMessage())
		}
		return nil, nil, err
	}
	return ev, stripped, nil
}

func mapsKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// storeRemoteKnock keeps a knock on a room this server is not in: the
// event, with the stripped state its server answered with in its
// unsigned part, as the user's membership.
func (s *Service) storeRemoteKnock(ctx context.Context, ev gomatrixserverlib.PDU, stripped []json.RawMessage) error {
	var state []gomatrixserverlib.InviteStrippedState
	creator := ""
	for _, raw := range stripped {
		var st gomatrixserverlib.InviteStrippedState
		if json.Unmarshal(raw, &st) != nil || st.Type() == "" {
			continue
		}
		if st.Type() == spec.MRoomCreate {
			creator = st.Sender()
		}
		state = append(state, st)
	}
	if err := ev.SetUnsignedField(knockStateKey, orEmpty(state)); err != nil {
		return err
	}
	roomID := ev.RoomID().String()
	defer s.lock(roomID)()
	r := record(ev)
	res, err := s.db.IngestRoomEvents(ctx, storage.RoomIngest{RoomID: roomID, Outliers: []storage.RoomEvent{r},
		Create:   &storage.Room{RoomVersion: string(ev.Version()), Creator: creator},
		PutState: []string{r.EventID}, Now: s.opts.Now().UnixMilli()})
	if err != nil {
		return err
	}
	s.written(res)
	return nil
}

// knockState is the knocker's view of a room in /sync: the stripped
// state after the knock, the knock itself included; for a room this
// server is not in, the state its server answered the knock with.
func (s *Service) knockState(ctx context.Context, knockID string) (*KnockedRoom, error) {
	knock, err := s.db.RoomEvent(ctx, knockID)
	if err != nil {
		return nil, err
	}
	p, err := pdu(knock)
	if err != nil {
		return nil, err
	}
	out := &KnockedRoom{}
	out.KnockState.Events = []StrippedEvent{}
	before, err := s.db.RoomStateBefore(ctx, knockID)
	if errors.Is(err, storage.ErrNotFound) {
		var unsigned map[string][]gomatrixserverlib.InviteStrippedState
		_ = json.Unmarshal(p.Unsigned(), &unsigned)
		for _, st := range unsigned[knockStateKey] {
			if slices.Contains(strippedTypes, st.Type()) {
				out.KnockState.Events = append(out.KnockState.Events, StrippedEvent{InviteStrippedState: st})
			}
		}
		out.KnockState.Events = append(out.KnockState.Events, strippedEvent(p))
		return out, nil
	} else if err != nil {
		return nil, err
	}
	for _, ev := range before {
		if !slices.Contains(strippedTypes, ev.Type) {
			continue
		}
		sp, err := pdu(ev)
		if err != nil {
			return nil, err
		}
		out.KnockState.Events = append(out.KnockState.Events, strippedEvent(sp))
	}
	out.KnockState.Events = append(out.KnockState.Events, strippedEvent(p))
	return out, nil
}

// strippedState is the stripped state of a room this server is in, as
// an invite or a knock carries it over federation: the events as full
// PDUs, the create event among them, so that the receiving server can
// check them against the room (MSC4311).
func (s *Service) strippedState(ctx context.Context, roomID string) ([]json.RawMessage, error) {
	stored, err := s.db.RoomStateEvents(ctx, roomID, strippedKeys())
	if err != nil {
		return nil, err
	}
	out := []json.RawMessage{}
	for _, st := range stored {
		out = append(out, json.RawMessage(st.JSON))
	}
	return out, nil
}

// MakeKnock answers /make_knock from origin for one of its users: a
// knock template on the room's current state, refused (403) when the
// room's version or join rule does not let the user knock, and
// M_INCOMPATIBLE_ROOM_VERSION when the user's server does not support
// the room's version (ver).
func (s *Service) MakeKnock(ctx context.Context, origin, roomID, userID string, versions []string) (Template, error) {
	room, user, _, err := s.templateFor(ctx, roomID, userID)
	if err != nil {
		return Template{}, err
	}
	if string(user.Domain()) != origin {
		return Template{}, mxerr.Forbidden("the knock must be asked for by the server of the user")
	}
	if !slices.Contains(versions, room.RoomVersion) {
		e := mxerr.New(http.StatusBadRequest, "M_INCOMPATIBLE_ROOM_VERSION", "the room's version %q is not among those offered", room.RoomVersion)
		e.Extra = map[string]any{"room_version": room.RoomVersion}
		return Template{}, e
	}
	if !knockingAllowed(room.RoomVersion) {
		return Template{}, mxerr.Forbidden("room version %q does not support knocking", room.RoomVersion)
	}
	proto := gomatrixserverlib.ProtoEvent{SenderID: userID, RoomID: roomID, Type: spec.MRoomMember, StateKey: &userID}
	if err := proto.SetContent(map[string]string{"membership": spec.Knock}); err != nil {
		return Template{}, err
	}
	ev, state, err := s.buildTemplate(ctx, room, &proto)
	if err != nil {
		return Template{}, fromSpec(err)
	}
	provider, err := authEventsFrom(state)
	if err != nil {
		return Template{}, err
	}
	if err := allowed(ev, provider); err != nil {
		return Template{}, mxerr.Forbidden("%v", err)
	}
	return Template{RoomVersion: room.RoomVersion, Event: proto}, nil
}

// knockingAllowed reports whether a room version has knocking (7 and
// later).
func knockingAllowed(version string) bool {
	switch version {
	case "1", "2", "3", "4", "5", "6":
		return false
	}
	return true
}

// SendKnockAnswer is the answer of /send_knock.
type SendKnockAnswer struct {
	KnockRoomState []json.RawMessage `json:"knock_room_state"`
}

// SendKnock accepts the knock of origin's user on a room this server is
// in, sends it on to the room's other servers and answers with the
// room's stripped state.
func (s *Service) SendKnock(ctx context.Context, origin, roomID, eventID string, raw json.RawMessage) (SendKnockAnswer, error) {
	room, err := s.knownRoom(ctx, roomID)
	if err != nil {
		return SendKnockAnswer{}, err
	}
	impl, err := gomatrixserverlib.GetRoomVersion(gomatrixserverlib.RoomVersion(room.RoomVersion))
	if err != nil {
		return SendKnockAnswer{}, err
	}
	if !knockingAllowed(room.RoomVersion) {
		return SendKnockAnswer{}, mxerr.Forbidden("room version %q does not support knocking", room.RoomVersion)
	}
	ev, err := impl.NewEventFromUntrustedJSON(raw)
	if err != nil {
		return SendKnockAnswer{}, mxerr.BadJSON("invalid event: %v", err)
	}
	m, _ := ev.Membership()
	switch {
	case ev.RoomID().String() != roomID || ev.EventID() != eventID:
		return SendKnockAnswer{}, mxerr.InvalidParam("the event's room or ID differs from the path's")
	case ev.Type() != spec.MRoomMember || m != spec.Knock:
		return SendKnockAnswer{}, mxerr.InvalidParam("the event is not a knock")
	case ev.StateKey() == nil || *ev.StateKey() != string(ev.SenderID()):
		return SendKnockAnswer{}, mxerr.InvalidParam("the state key is not the sender")
	case matrixid.Server(string(ev.SenderID())) != origin:
		return SendKnockAnswer{}, mxerr.InvalidParam("the sender is not a user of the requesting server")
	}
	if err := s.receiveResident(ctx, origin, ev); err != nil {
		var me *mxerr.Error
		if errors.As(err, &me) {
			return SendKnockAnswer{}, err
		}
		// A bad signature or unusable auth events: the knock is refused.
		return SendKnockAnswer{}, mxerr.Forbidden("the knock cannot be accepted: %v", err)
	}
	stripped, err := s.strippedState(ctx, roomID)
	if err != nil {
		return SendKnockAnswer{}, err
	}
	return SendKnockAnswer{KnockRoomState: stripped}, nil
}

// withdrawRemoteKnock withdraws a knock on a room this server is not in:
// make_leave and send_leave through the room's servers (those of the
// senders of the state the knock was answered with, then the room ID's),
// then the leave is kept as the user's membership.
func (s *Service) withdrawRemoteKnock(ctx context.Context, userID, roomID string) error {
	knock, err := s.db.RoomStateEvents(ctx, roomID, []storage.StateKey{{Type: spec.MRoomMember, StateKey: userID}})
	if err != nil {
		return err
	}
	if len(knock) == 0 {
		return errNoRoom(roomID)
	}
	p, err := pdu(knock[0])
	if err != nil {
		return err
	}
	var unsigned map[string][]gomatrixserverlib.InviteStrippedState
	_ = json.Unmarshal(p.Unsigned(), &unsigned)
	var servers []string
	for _, st := range unsigned[knockStateKey] {
		servers = append(servers, matrixid.Server(st.Sender()))
	}
	servers = append(servers, s.roomServer(ctx, roomID))
	var lastErr error
	var tried []string
	for _, server := range servers {
		if server == "" || server == s.opts.ServerName || slices.Contains(tried, server) {
			continue
		}
		tried = append(tried, server)
		if lastErr = s.leaveThrough(ctx, server, userID, roomID); lastErr == nil {
			return nil
		}
	}
	if lastErr == nil {
		return errNoRoom(roomID)
	}
	return lastErr
}

// receiveKnockAnswer keeps the leave (or ban) a room this server is not
// in sends for a local user who knocked on it (the knock rejected), as
// the user's membership: the event must come from its sender's server,
// be signed by it, and follow the user's knock. It reports whether ev
// was such an event.
func (s *Service) receiveKnockAnswer(ctx context.Context, origin string, ev gomatrixserverlib.PDU) (bool, error) {
	m, _ := ev.Membership()
	if ev.Type() != spec.MRoomMember || ev.StateKey() == nil || !s.isLocalUser(*ev.StateKey()) || (m != spec.Leave && m != spec.Ban) {
		return false, nil
	}
	roomID := ev.RoomID().String()
	defer s.lock(roomID)()
	current, err := s.db.RoomMembership(ctx, roomID, *ev.StateKey())
	if err != nil || current != spec.Knock {
		return false, err
	}
	if matrixid.Server(string(ev.SenderID())) != origin {
		return true, errors.New("the sender is not a user of the sending server")
	}
	if err := gomatrixserverlib.VerifyEventSignatures(ctx, ev, s.opts.KeyRing, userIDForSender); err != nil {
		return true, errors.New("bad signature: " + err.Error())
	}
	r := record(ev)
	res, err := s.db.IngestRoomEvents(ctx, storage.RoomIngest{RoomID: roomID, Outliers: []storage.RoomEvent{r},
		PutState: []string{r.EventID}, Now: s.opts.Now().UnixMilli()})
	if err != nil {
		return true, err
	}
	s.written(res)
	return true, nil
}
