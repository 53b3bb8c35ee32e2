package roomserver

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"slices"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/remotefail"
	"github.com/keyserver/keyserver/roomversion"
	"github.com/keyserver/keyserver/storage"
)

// The membership handshakes over federation, with gomatrixserverlib
// doing each side's checks: this server as the resident of a room
// (make_join/send_join, make_leave/send_leave), as the server of an
// invited user (invite), and as the server of a user joining a room
// hosted elsewhere (PerformJoin), inviting a user of another server, or
// rejecting an invite to a room it is not in.

// Handshakes is what the handshakes ask of other servers.
type Handshakes interface {
	// MakeJoin asks for a join template, offering the room versions
	// versions.
	MakeJoin(ctx context.Context, dest, roomID, userID string, versions []string) (gomatrixserverlib.MakeJoinResponse, error)
	SendJoin(ctx context.Context, origin, dest spec.ServerName, event gomatrixserverlib.PDU) (gomatrixserverlib.SendJoinResponse, error)
	SendInvite(ctx context.Context, dest string, event gomatrixserverlib.PDU, strippedState []json.RawMessage) (json.RawMessage, error)
	MakeLeave(ctx context.Context, dest, roomID, userID string) (gomatrixserverlib.ProtoEvent, gomatrixserverlib.RoomVersion, error)
	SendLeave(ctx context.Context, dest string, event gomatrixserverlib.PDU) error
}

// joinClient is the join handshake as gomatrixserverlib.PerformJoin
// runs it: make_join offers the room versions this server supports, and
// a template in any other is refused before the join is sent.
type joinClient struct{ Handshakes }

func (c joinClient) MakeJoin(ctx context.Context, _, dest spec.ServerName, roomID, userID string) (gomatrixserverlib.MakeJoinResponse, error) {
	supported := RoomVersions()
	res, err := c.Handshakes.MakeJoin(ctx, string(dest), roomID, userID, slices.Sorted(maps.Keys(supported)))
	if err != nil {
		return nil, err
	}
	if v := string(res.GetRoomVersion()); supported[v] == "" {
		return nil, spec.IncompatibleRoomVersion(v)
	}
	return res, nil
}

// madeJoin hands gomatrixserverlib.PerformJoin the template already
// asked for (to learn the room's version) instead of asking again.
type madeJoin struct {
	joinClient
	tmpl gomatrixserverlib.MakeJoinResponse
}

func (c madeJoin) MakeJoin(context.Context, spec.ServerName, spec.ServerName, string, string) (gomatrixserverlib.MakeJoinResponse, error) {
	return c.tmpl, nil
}

// fromSpec turns gomatrixserverlib's Matrix errors into ours.
func fromSpec(err error) error {
	var irv spec.IncompatibleRoomVersionError
	if errors.As(err, &irv) {
		e := mxerr.New(http.StatusBadRequest, string(irv.ErrCode), "%s", irv.Err)
		e.Extra = map[string]any{"room_version": irv.RoomVersion}
		return e
	}
	var me spec.MatrixError
	if errors.As(err, &me) {
		status := http.StatusBadRequest
		switch me.ErrCode {
		case spec.ErrorForbidden:
			status = http.StatusForbidden
		case spec.ErrorNotFound:
			status = http.StatusNotFound
		}
		return mxerr.New(status, string(me.ErrCode), "%s", me.Err)
	}
	return err
}

// localServerInRoom reports whether a user of this server is joined.
func (s *Service) localServerInRoom(ctx context.Context, roomID string) (bool, error) {
	servers, err := s.db.RoomJoinedServers(ctx, roomID)
	if err != nil {
		return false, err
	}
	_, found := slices.BinarySearch(servers, s.opts.ServerName)
	return found, nil
}

// querier answers gomatrixserverlib's questions about rooms.
type querier struct{ s *Service }

func (q querier) CurrentMembership(ctx context.Context, roomID spec.RoomID, senderID spec.SenderID) (string, error) {
	m, err := q.s.db.RoomMembership(ctx, roomID.String(), string(senderID))
	if m == "" {
		m = spec.Leave
	}
	return m, err
}

func (q querier) CurrentStateEvent(ctx context.Context, roomID spec.RoomID, eventType, stateKey string) (gomatrixserverlib.PDU, error) {
	evs, err := q.s.db.RoomStateEvents(ctx, roomID.String(), []storage.StateKey{{Type: eventType, StateKey: stateKey}})
	if err != nil || len(evs) == 0 {
		return nil, err
	}
	return pdu(evs[0])
}

func (q querier) InvitePending(ctx context.Context, roomID spec.RoomID, senderID spec.SenderID) (bool, error) {
	m, err := q.s.db.RoomMembership(ctx, roomID.String(), string(senderID))
	return m == spec.Invite, err
}

func (q querier) RestrictedRoomJoinInfo(ctx context.Context, roomID spec.RoomID, senderID spec.SenderID, _ spec.ServerName) (*gomatrixserverlib.RestrictedRoomJoinInfo, error) {
	info := &gomatrixserverlib.RestrictedRoomJoinInfo{}
	state, err := q.s.db.RoomCurrentState(ctx, roomID.String())
	if err != nil {
		return nil, err
	}
	for _, ev := range state {
		if ev.Type != spec.MRoomMember || ev.Membership != spec.Join || ev.StateKey == nil {
			continue
		}
		if *ev.StateKey == string(senderID) {
			info.UserJoinedToRoom = true
		}
		if q.s.isLocalUser(*ev.StateKey) {
			info.LocalServerInRoom = true
			p, err := pdu(ev)
			if err != nil {
				return nil, err
			}
			info.JoinedUsers = append(info.JoinedUsers, p)
		}
	}
	return info, nil
}

func (q querier) IsKnownRoom(ctx context.Context, roomID spec.RoomID) (bool, error) {
	return q.s.localServerInRoom(ctx, roomID.String())
}

func (q querier) GetAuthEvents(ctx context.Context, event gomatrixserverlib.PDU) (gomatrixserverlib.AuthEventProvider, error) {
	stored, err := q.s.db.RoomEventsByID(ctx, authEventIDs(event))
	if err != nil {
		return nil, err
	}
	evs, err := pdus(stored)
	if err != nil {
		return nil, err
	}
	return authEventsFrom(evs)
}

func (q querier) GetState(ctx context.Context, roomID spec.RoomID, wanted []gomatrixserverlib.StateKeyTuple) ([]gomatrixserverlib.PDU, error) {
	var keys []storage.StateKey
	for _, t := range wanted {
		keys = append(keys, storage.StateKey{Type: t.EventType, StateKey: t.StateKey})
	}
	evs, err := q.s.db.RoomStateEvents(ctx, roomID.String(), keys)
	if err != nil {
		return nil, err
	}
	return pdus(evs)
}

// buildTemplate builds an event of another server's user on a room's
// current state, signed by this server only to run the auth rules on
// it: the template the user's server completes and signs.
func (s *Service) buildTemplate(ctx context.Context, room storage.Room, proto *gomatrixserverlib.ProtoEvent) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU, error) {
	impl, err := gomatrixserverlib.GetRoomVersion(gomatrixserverlib.RoomVersion(room.RoomVersion))
	if err != nil {
		return nil, nil, err
	}
	needed, err := gomatrixserverlib.StateNeededForProtoEvent(proto)
	if err != nil {
		return nil, nil, spec.BadJSON(err.Error())
	}
	var keys []storage.StateKey
	for _, t := range needed.Tuples() {
		keys = append(keys, storage.StateKey{Type: t.EventType, StateKey: t.StateKey})
	}
	stored, err := s.db.RoomStateEvents(ctx, room.RoomID, keys)
	if err != nil {
		return nil, nil, err
	}
	state, err := pdus(stored)
	if err != nil {
		return nil, nil, err
	}
	proto.PrevEvents = room.Extremities
	proto.Depth = room.Depth + 1
	if proto.AuthEvents, err = selectAuthEvents(impl.Version(), proto, stateMap(state)); err != nil {
		return nil, nil, spec.Forbidden(err.Error())
	}
	ev, err := roomversion.Build(impl.Version(), proto, s.opts.Now(), spec.ServerName(s.opts.ServerName), s.opts.KeyID, s.opts.PrivateKey)
	if err != nil {
		return nil, nil, err
	}
	return ev, state, nil
}

// knownRoom returns a room this server is joined to (404 otherwise).
func (s *Service) knownRoom(ctx context.Context, roomID string) (storage.Room, error) {
	room, err := s.db.Room(ctx, roomID)
	if errors.Is(err, storage.ErrNotFound) {
		return room, errNoRoom(roomID)
	} else if err != nil {
		return room, err
	}
	if in, err := s.localServerInRoom(ctx, roomID); err != nil {
		return room, err
	} else if !in {
		return room, errNoRoom(roomID)
	}
	return room, nil
}

// Template is the answer of /make_join and /make_leave.
type Template struct {
	RoomVersion string                       `json:"room_version"`
	Event       gomatrixserverlib.ProtoEvent `json:"event"`
}

// templateFor checks the room and user of a /make_join or /make_leave:
// a room this server is in, a valid user ID.
func (s *Service) templateFor(ctx context.Context, roomID, userID string) (storage.Room, *spec.UserID, *spec.RoomID, error) {
	room, err := s.knownRoom(ctx, roomID)
	if err != nil {
		return room, nil, nil, err
	}
	user, err := spec.NewUserID(userID, true)
	if err != nil {
		return room, nil, nil, mxerr.InvalidParam("%q is not a user ID", userID)
	}
	rid, err := roomversion.ParseRoomID(roomID)
	if err != nil {
		return room, nil, nil, mxerr.InvalidParam("%q is not a room ID", roomID)
	}
	return room, user, &rid, nil
}

// MakeJoin answers /make_join from origin for one of its users.
func (s *Service) MakeJoin(ctx context.Context, origin, roomID, userID string, versions []string) (Template, error) {
	room, user, rid, err := s.templateFor(ctx, roomID, userID)
	if err != nil {
		return Template{}, err
	}
	remote := []gomatrixserverlib.RoomVersion{}
	for _, v := range versions {
		remote = append(remote, gomatrixserverlib.RoomVersion(v))
	}
	if len(remote) == 0 {
		remote = []gomatrixserverlib.RoomVersion{gomatrixserverlib.RoomVersionV1}
	}
	rq, err := s.restrictedJoinQuerier(ctx, room, userID)
	if err != nil {
		return Template{}, err
	}
	res, err := gomatrixserverlib.HandleMakeJoin(gomatrixserverlib.HandleMakeJoinInput{
		Context: ctx, UserID: *user, SenderID: spec.SenderID(userID), RoomID: *rid,
		RoomVersion: gomatrixserverlib.RoomVersion(room.RoomVersion), RemoteVersions: remote,
		RequestOrigin: spec.ServerName(origin), LocalServerName: spec.ServerName(s.opts.ServerName), LocalServerInRoom: true,
		RoomQuerier: rq, UserIDQuerier: userIDForSender,
		BuildEventTemplate: func(p *gomatrixserverlib.ProtoEvent) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU, error) {
			return s.buildTemplate(ctx, room, p)
		},
	})
	if err != nil {
		return Template{}, fromSpec(err)
	}
	return Template{RoomVersion: string(res.RoomVersion), Event: res.JoinTemplateEvent}, nil
}

// SendJoinAnswer is the answer of /v2/send_join.
type SendJoinAnswer struct {
	Origin         string            `json:"origin"`
	State          []json.RawMessage `json:"state"`
	AuthChain      []json.RawMessage `json:"auth_chain"`
	Event          json.RawMessage   `json:"event"`
	MembersOmitted bool              `json:"members_omitted"`
	ServersInRoom  []string          `json:"servers_in_room"`
}

// SendJoin accepts the join of origin's user into a room this server is
// in, sends it on to the room's other servers, and answers with the state
// before it and the auth chain.
func (s *Service) SendJoin(ctx context.Context, origin, roomID, eventID string, raw json.RawMessage) (SendJoinAnswer, error) {
	room, err := s.knownRoom(ctx, roomID)
	if err != nil {
		return SendJoinAnswer{}, err
	}
	rid, err := roomversion.ParseRoomID(roomID)
	if err != nil {
		return SendJoinAnswer{}, mxerr.InvalidParam("%q is not a room ID", roomID)
	}
	if err := s.checkAuthorisedJoin(ctx, room, raw); err != nil {
		return SendJoinAnswer{}, err
	}
	res, err := gomatrixserverlib.HandleSendJoin(gomatrixserverlib.HandleSendJoinInput{
		Context: ctx, RoomID: rid, EventID: eventID, JoinEvent: spec.RawJSON(raw),
		RoomVersion: gomatrixserverlib.RoomVersion(room.RoomVersion), RequestOrigin: spec.ServerName(origin),
		LocalServerName: spec.ServerName(s.opts.ServerName), KeyID: s.opts.KeyID, PrivateKey: s.opts.PrivateKey,
		Verifier: s.opts.KeyRing, MembershipQuerier: querier{s}, UserIDQuerier: userIDForSender,
		StoreSenderIDFromPublicID: func(context.Context, spec.SenderID, string, spec.RoomID) error { return nil },
	})
	if err != nil {
		return SendJoinAnswer{}, fromSpec(err)
	}
	join := res.JoinEvent
	if err := s.receiveResident(ctx, origin, join); err != nil {
		return SendJoinAnswer{}, err
	}
	before, err := s.db.RoomStateBefore(ctx, join.EventID())
	if err != nil {
		return SendJoinAnswer{}, err
	}
	state, err := pdus(before)
	if err != nil {
		return SendJoinAnswer{}, err
	}
	chain, _, err := s.authChain(ctx, append(slices.Clone(state), join))
	if err != nil {
		return SendJoinAnswer{}, err
	}
	servers, err := s.db.RoomJoinedServers(ctx, roomID)
	if err != nil {
		return SendJoinAnswer{}, err
	}
	out := SendJoinAnswer{Origin: s.opts.ServerName, Event: json.RawMessage(join.JSON()), ServersInRoom: servers,
		State: rawEvents(state), AuthChain: rawEvents(chain)}
	return out, nil
}

func rawEvents(evs []gomatrixserverlib.PDU) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(evs))
	for _, e := range evs {
		out = append(out, json.RawMessage(e.JSON()))
	}
	return out
}

// receiveResident places a join or leave this server is the resident
// for, sending it on to the room's other servers; one the room's state
// does not allow is refused (403).
func (s *Service) receiveResident(ctx context.Context, origin string, ev gomatrixserverlib.PDU) error {
	unlock := s.lock(ev.RoomID().String())
	budget := maxFetched
	err := s.receiveAs(ctx, origin, ev, &budget, true, &federate{skip: []string{origin}})
	unlock()
	var rej errRejected
	if errors.As(err, &rej) {
		return mxerr.Forbidden("%s", rej.reason)
	}
	if err != nil {
		return err
	}
	stored, err := s.db.RoomEventsByID(ctx, []string{ev.EventID()})
	if err != nil {
		return err
	}
	if len(stored) != 1 || stored[0].Rejected || stored[0].SoftFailed || stored[0].Outlier {
		return mxerr.Forbidden("the room's current state does not allow the event")
	}
	return nil
}

// MakeLeave answers /make_leave from origin for one of its users.
func (s *Service) MakeLeave(ctx context.Context, origin, roomID, userID string) (Template, error) {
	room, user, rid, err := s.templateFor(ctx, roomID, userID)
	if err != nil {
		return Template{}, err
	}
	res, err := gomatrixserverlib.HandleMakeLeave(gomatrixserverlib.HandleMakeLeaveInput{
		UserID: *user, SenderID: spec.SenderID(userID), RoomID: *rid, RoomVersion: gomatrixserverlib.RoomVersion(room.RoomVersion),
		RequestOrigin: spec.ServerName(origin), LocalServerName: spec.ServerName(s.opts.ServerName), LocalServerInRoom: true,
		UserIDQuerier: userIDForSender,
		BuildEventTemplate: func(p *gomatrixserverlib.ProtoEvent) (gomatrixserverlib.PDU, []gomatrixserverlib.PDU, error) {
			return s.buildTemplate(ctx, room, p)
		},
	})
	if err != nil {
		return Template{}, fromSpec(err)
	}
	return Template{RoomVersion: string(res.RoomVersion), Event: res.LeaveTemplateEvent}, nil
}

// SendLeave accepts the leave of origin's user (the rejection of an
// invite, usually) and sends it on to the room's other servers.
func (s *Service) SendLeave(ctx context.Context, origin, roomID, eventID string, raw json.RawMessage) error {
	room, err := s.knownRoom(ctx, roomID)
	if err != nil {
		return err
	}
	impl, err := gomatrixserverlib.GetRoomVersion(gomatrixserverlib.RoomVersion(room.RoomVersion))
	if err != nil {
		return err
	}
	ev, err := impl.NewEventFromUntrustedJSON(raw)
	if err != nil {
		return mxerr.BadJSON("invalid event: %v", err)
	}
	m, _ := ev.Membership()
	switch {
	case ev.RoomID().String() != roomID || ev.EventID() != eventID:
		return mxerr.InvalidParam("the event's room or ID differs from the path's")
	case ev.Type() != spec.MRoomMember || m != spec.Leave:
		return mxerr.InvalidParam("the event is not a leave")
	case ev.StateKey() == nil || *ev.StateKey() != string(ev.SenderID()):
		return mxerr.InvalidParam("the state key is not the sender")
	case matrixid.Server(string(ev.SenderID())) != origin:
		return mxerr.InvalidParam("the sender is not a user of the requesting server")
	}
	return s.receiveResident(ctx, origin, ev)
}

// checkInviteRoomState checks the invite_room_state of a version 12
// room (MSC4311): every entry a PDU of the room signed by its sender's
// server, the create event among them, whose hash is the room ID. An
// invite that does not show what room it is for is refused with 400
// M_MISSING_PARAM.
func (s *Service) checkInviteRoomState(ctx context.Context, roomID string, state []json.RawMessage) error {
	impl := gomatrixserverlib.MustGetRoomVersion(roomversion.V12)
	create := false
	for _, raw := range state {
		ev, err := impl.NewEventFromUntrustedJSON(raw)
		if err != nil {
			return mxerr.New(http.StatusBadRequest, "M_MISSING_PARAM", "invite_room_state holds an entry that is not a PDU of the room: %v", err)
		}
		if ev.RoomID().String() != roomID {
			return mxerr.New(http.StatusBadRequest, "M_MISSING_PARAM", "invite_room_state holds an event of another room")
		}
		if err := gomatrixserverlib.VerifyEventSignatures(ctx, ev, s.opts.KeyRing, userIDForSender); err != nil {
			return mxerr.New(http.StatusBadRequest, "M_MISSING_PARAM", "invite_room_state holds an event without a valid signature")
		}
		if ev.Type() == spec.MRoomCreate && ev.StateKeyEquals("") {
			create = true // its room ID is its hash: checked above
		}
	}
	if !create {
		return mxerr.New(http.StatusBadRequest, "M_MISSING_PARAM", "invite_room_state lacks the room's create event")
	}
	return nil
}

// InviteRequest is the body of /v2/invite.
type InviteRequest struct {
	RoomVersion     string            `json:"room_version"`
	Event           json.RawMessage   `json:"event"`
	InviteRoomState []json.RawMessage `json:"invite_room_state"`
}

// ReceiveInvite signs the invite of a user of this server by origin's
// user and keeps it: the invitee sees it in /sync with the stripped state
// that came with it.
func (s *Service) ReceiveInvite(ctx context.Context, origin, roomID, eventID string, req InviteRequest) (json.RawMessage, error) {
	version := gomatrixserverlib.RoomVersion(req.RoomVersion)
	if _, ok := RoomVersions()[req.RoomVersion]; !ok {
		// As Synapse answers (MSC1866): the inviting server's client is
		// told this server does not support the room's version.
		e := mxerr.New(http.StatusBadRequest, "M_UNSUPPORTED_ROOM_VERSION", "room version %q is not supported", req.RoomVersion)
		e.Extra = map[string]any{"room_version": req.RoomVersion}
		return nil, e
	}
	impl := gomatrixserverlib.MustGetRoomVersion(version)
	ev, err := impl.NewEventFromUntrustedJSON(req.Event)
	if err != nil {
		return nil, mxerr.BadJSON("invalid event: %v", err)
	}
	m, _ := ev.Membership()
	switch {
	case ev.RoomID().String() != roomID || ev.EventID() != eventID:
		return nil, mxerr.InvalidParam("the event's room or ID differs from the path's")
	case ev.Type() != spec.MRoomMember || m != spec.Invite || ev.StateKey() == nil:
		return nil, mxerr.InvalidParam("the event is not an invite")
	case !s.isLocalUser(*ev.StateKey()):
		return nil, mxerr.InvalidParam("the invited user is not a user of this server")
	case matrixid.Server(string(ev.SenderID())) != origin:
		return nil, mxerr.InvalidParam("the sender is not a user of the requesting server")
	}
	invitee, err := spec.NewUserID(*ev.StateKey(), true)
	if err != nil {
		return nil, mxerr.InvalidParam("the invited user's ID is invalid")
	}
	if roomversion.Is12(version) {
		if err := s.checkInviteRoomState(ctx, roomID, req.InviteRoomState); err != nil {
			return nil, err
		}
	}
	var stripped []gomatrixserverlib.InviteStrippedState
	for _, raw := range req.InviteRoomState {
		var st gomatrixserverlib.InviteStrippedState
		if json.Unmarshal(raw, &st) == nil {
			stripped = append(stripped, st)
		}
	}
	signed, err := gomatrixserverlib.HandleInvite(ctx, gomatrixserverlib.HandleInviteInput{
		RoomID: ev.RoomID(), RoomVersion: version, InvitedUser: *invitee, InvitedSenderID: spec.SenderID(invitee.String()),
		InviteEvent: ev, StrippedState: stripped, KeyID: s.opts.KeyID, PrivateKey: s.opts.PrivateKey, Verifier: s.opts.KeyRing,
		RoomQuerier: querier{s}, MembershipQuerier: querier{s}, StateQuerier: querier{s}, UserIDQuerier: userIDForSender,
	})
	if err != nil {
		return nil, fromSpec(err)
	}
	defer s.lock(roomID)()
	r := record(signed)
	in := storage.RoomIngest{RoomID: roomID, Outliers: []storage.RoomEvent{r}, Now: s.opts.Now().UnixMilli()}
	// In a room this server is in, the invite comes again in /send and is
	// placed then; otherwise it is all there is of the room.
	if joined, err := s.localServerInRoom(ctx, roomID); err != nil {
		return nil, err
	} else if !joined {
		in.Create = &storage.Room{RoomVersion: string(version), Creator: string(ev.SenderID())}
		in.PutState = []string{r.EventID}
	}
	res, err := s.db.IngestRoomEvents(ctx, in)
	if err != nil {
		return nil, err
	}
	s.written(res)
	return json.RawMessage(signed.JSON()), nil
}

// joinRemote joins a room hosted elsewhere through the first of servers
// that lets it: make_join and v2 send_join with gomatrixserverlib's
// checks of the state and auth chain returned, which are stored as
// outliers with the join placed on that state, in one transaction.
// Nothing is stored when every server fails.
func (s *Service) joinRemote(ctx context.Context, userID, roomID string, servers []string, content map[string]any) error {
	if s.opts.Handshakes == nil || s.opts.KeyRing == nil {
		return errNoRoom(roomID)
	}
	user, err := spec.NewUserID(userID, true)
	if err != nil {
		return mxerr.InvalidParam("%q is not a user ID", userID)
	}
	rid, err := roomversion.ParseRoomID(roomID)
	if err != nil {
		return mxerr.InvalidParam("%q is not a room ID", roomID)
	}
	var lastErr error
	tried := 0
	for _, server := range servers {
		if server == "" || server == s.opts.ServerName {
			continue
		}
		tried++
		tmpl, err := joinClient{s.opts.Handshakes}.MakeJoin(ctx, spec.ServerName(s.opts.ServerName), spec.ServerName(server), roomID, userID)
		if err != nil {
			lastErr = err
			s.opts.Logger.WithField("server", server).WithField("room_id", roomID).WithError(err).Info("joining through a server failed")
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				break
			}
			continue
		}
		if roomversion.Is12(tmpl.GetRoomVersion()) {
			res, err := s.performJoin12(ctx, server, tmpl, userID, roomID, content)
			if err != nil {
				lastErr = err
				s.opts.Logger.WithField("server", server).WithField("room_id", roomID).WithError(err).Info("joining through a server failed")
				continue
			}
			return s.storeJoin(ctx, res)
		}
		res, ferr := gomatrixserverlib.PerformJoin(ctx, madeJoin{joinClient{s.opts.Handshakes}, tmpl}, gomatrixserverlib.PerformJoinInput{
			UserID: user, RoomID: &rid, ServerName: spec.ServerName(server), Content: content,
			PrivateKey: s.opts.PrivateKey, KeyID: s.opts.KeyID, KeyRing: s.opts.KeyRing,
			EventProvider: func(_ gomatrixserverlib.RoomVersion, ids []string) ([]gomatrixserverlib.PDU, error) {
				stored, err := s.db.RoomEventsByID(ctx, ids)
				if err != nil {
					return nil, err
				}
				return pdus(stored)
			},
			UserIDQuerier: userIDForSender,
			GetOrCreateSenderID: func(_ context.Context, u spec.UserID, _ spec.RoomID, _ string) (spec.SenderID, ed25519.PrivateKey, error) {
				return spec.SenderID(u.String()), s.opts.PrivateKey, nil
			},
			StoreSenderIDFromPublicID: func(context.Context, spec.SenderID, string, spec.RoomID) error { return nil },
		})
		if ferr != nil {
			lastErr = ferr.Err
			s.opts.Logger.WithField("server", server).WithField("room_id", roomID).WithError(ferr.Err).Info("joining through a server failed")
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				break
			}
			continue
		}
		return s.storeJoin(ctx, res)
	}
	if tried == 0 {
		return errNoRoom(roomID)
	}
	return remoteJoinError(ctx, lastErr)
}

// remoteJoinError reports the failure of every server a join was tried
// through: their refusals as they gave them, else 502 (504 when they did
// not answer in time).
func remoteJoinError(ctx context.Context, err error) error {
	var irv spec.IncompatibleRoomVersionError
	if errors.As(err, &irv) {
		return fromSpec(irv) // a room this server cannot join
	}
	var status statusError
	if errors.As(err, &status) {
		switch status.StatusCode() {
		case http.StatusForbidden:
			return mxerr.Forbidden("the room's server refused: %s", status.ErrMessage())
		case http.StatusNotFound:
			return mxerr.NotFound("the room's server does not know the room")
		case http.StatusBadRequest:
			code := status.ErrCode()
			if code == "" {
				code = "M_UNKNOWN"
			}
			return mxerr.New(http.StatusBadRequest, code, "the room's server refused: %s", status.ErrMessage())
		}
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return mxerr.New(http.StatusGatewayTimeout, "M_UNKNOWN", "the room's servers did not answer in time")
	}
	return mxerr.New(http.StatusBadGateway, "M_UNKNOWN", "the room's servers could not be joined through")
}

// statusError is a remote server's error answer.
type statusError = remotefail.StatusError

// storeJoin writes a join made over federation: the auth chain and state
// as outliers, the join placed on that state as the room's new current
// state and only extremity.
func (s *Service) storeJoin(ctx context.Context, res *gomatrixserverlib.PerformJoinResponse) error {
	join := res.JoinEvent
	roomID := join.RoomID().String()
	version := join.Version()
	defer s.lock(roomID)()
	var outliers []storage.RoomEvent
	for _, ev := range res.StateSnapshot.GetAuthEvents().UntrustedEvents(version) {
		outliers = append(outliers, record(ev))
	}
	seen := map[gomatrixserverlib.StateKeyTuple]string{}
	var stateIDs []string
	for _, ev := range res.StateSnapshot.GetStateEvents().UntrustedEvents(version) {
		if ev.StateKey() == nil || ev.RoomID().String() != roomID {
			continue
		}
		k := gomatrixserverlib.StateKeyTuple{EventType: ev.Type(), StateKey: *ev.StateKey()}
		if _, dup := seen[k]; dup {
			return mxerr.New(http.StatusBadGateway, "M_UNKNOWN", "the room's server answered with two state events for one key")
		}
		seen[k] = ev.EventID()
		outliers = append(outliers, record(ev))
		stateIDs = append(stateIDs, ev.EventID())
	}
	for attempt := 0; ; attempt++ {
		var extremities []string
		room, err := s.db.Room(ctx, roomID)
		if err == nil {
			extremities = room.Extremities
		} else if !errors.Is(err, storage.ErrNotFound) {
			return err
		}
		r := record(join)
		wr, err := s.db.IngestRoomEvents(ctx, storage.RoomIngest{
			RoomID: roomID, Create: &storage.Room{RoomVersion: string(version), Creator: createSender(outliers)},
			Outliers: outliers, Event: &r, StateBefore: stateIDs,
			Extremities: nonNilStrings(extremities), NewExtremities: []string{join.EventID()}, CurrentAfterEvent: true,
			Now: s.opts.Now().UnixMilli(),
		})
		if errors.Is(err, storage.ErrRoomMoved) && attempt < maxAttempts {
			continue
		}
		if err != nil {
			return err
		}
		s.written(wr)
		return nil
	}
}

func nonNilStrings(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// createSender is the sender of a room's create event among evs.
func createSender(evs []storage.RoomEvent) string {
	for _, ev := range evs {
		if ev.Type == spec.MRoomCreate {
			return ev.Sender
		}
	}
	return ""
}

// inviteRemote completes an invite of another server's user: that
// server signs it (v2 /invite) before it is written.
func (s *Service) inviteRemote(ctx context.Context, ev gomatrixserverlib.PDU) (gomatrixserverlib.PDU, error) {
	if s.opts.Handshakes == nil {
		return nil, mxerr.Forbidden("this server does not federate")
	}
	stripped, err := s.strippedState(ctx, ev.RoomID().String())
	if err != nil {
		return nil, err
	}
	target := matrixid.Server(*ev.StateKey())
	raw, err := s.opts.Handshakes.SendInvite(ctx, target, ev, stripped)
	if err != nil {
		s.opts.Logger.WithField("server", target).WithError(err).Info("a remote invite failed")
		var status statusError
		if errors.As(err, &status) && status.StatusCode() == http.StatusForbidden {
			return nil, mxerr.Forbidden("the invited user's server refused the invite")
		}
		return nil, mxerr.New(http.StatusBadGateway, "M_UNKNOWN", "the invited user's server could not be reached")
	}
	signed, err := gomatrixserverlib.MustGetRoomVersion(ev.Version()).NewEventFromUntrustedJSON(raw)
	if err != nil || signed.EventID() != ev.EventID() {
		return nil, mxerr.New(http.StatusBadGateway, "M_UNKNOWN", "the invited user's server answered with another event")
	}
	if err := gomatrixserverlib.VerifyEventSignatures(ctx, signed, s.opts.KeyRing, userIDForSender); err != nil {
		return nil, mxerr.New(http.StatusBadGateway, "M_UNKNOWN", "the invited user's server did not sign the invite")
	}
	return signed, nil
}

func strippedKeys() []storage.StateKey {
	var keys []storage.StateKey
	for _, t := range strippedTypes {
		keys = append(keys, storage.StateKey{Type: t})
	}
	return keys
}

// rejectRemoteInvite leaves a room this server is not in, where a user
// was invited: make_leave and send_leave through the inviter's server,
// then the leave is kept as the user's membership.
func (s *Service) rejectRemoteInvite(ctx context.Context, userID, roomID string) error {
	invite, err := s.db.RoomStateEvents(ctx, roomID, []storage.StateKey{{Type: spec.MRoomMember, StateKey: userID}})
	if err != nil {
		return err
	}
	if len(invite) == 0 || s.opts.Handshakes == nil {
		return errNoRoom(roomID)
	}
	return s.leaveThrough(ctx, matrixid.Server(invite[0].Sender), userID, roomID)
}

// leaveThrough leaves a room this server is not in through server
// (make_leave, send_leave), then keeps the leave as the user's
// membership.
func (s *Service) leaveThrough(ctx context.Context, server, userID, roomID string) error {
	if s.opts.Handshakes == nil {
		return errNoRoom(roomID)
	}
	proto, version, err := s.opts.Handshakes.MakeLeave(ctx, server, roomID, userID)
	if err != nil {
		return remoteJoinError(ctx, err)
	}
	impl, err := gomatrixserverlib.GetRoomVersion(version)
	if err != nil {
		return mxerr.New(http.StatusBadGateway, "M_UNKNOWN", "the room's server uses an unsupported room version")
	}
	m, _ := proto.Content.MarshalJSON()
	var content struct {
		Membership string `json:"membership"`
	}
	if json.Unmarshal(m, &content) != nil || content.Membership != spec.Leave || proto.Type != spec.MRoomMember ||
		proto.StateKey == nil || *proto.StateKey != userID || proto.SenderID != userID || proto.RoomID != roomID {
		return mxerr.New(http.StatusBadGateway, "M_UNKNOWN", "the room's server answered with a wrong template")
	}
	ev, err := roomversion.Build(impl.Version(), &proto, s.opts.Now(), spec.ServerName(s.opts.ServerName), s.opts.KeyID, s.opts.PrivateKey)
	if err != nil {
		return mxerr.New(http.StatusBadGateway, "M_UNKNOWN", "the room's template cannot be built: %v", err)
	}
	if err := s.opts.Handshakes.SendLeave(ctx, server, ev); err != nil {
		return remoteJoinError(ctx, err)
	}
	defer s.lock(roomID)()
	r := record(ev)
	res, err := s.db.IngestRoomEvents(ctx, storage.RoomIngest{RoomID: roomID, Outliers: []storage.RoomEvent{r},
		PutState: []string{r.EventID}, Now: s.opts.Now().UnixMilli()})
	if err != nil {
		return err
	}
	s.written(res)
	return nil
}
