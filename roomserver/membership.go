package roomserver

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/roomversion"
	"github.com/keyserver/keyserver/storage"
)

// Membership changes, all m.room.member events built on the room's
// current state and checked by the auth rules (which decide who may
// invite, kick, ban and unban whom).

// Join joins a room by ID or alias; it returns the room ID. A room this
// server is in is joined with a local event; any other is joined over
// federation through via (the client's server_name), the servers an
// alias named, the inviter's server, and the room ID's server, in turn.
//
// extra is the rest of the request's body (reason and any other field):
// it goes into the join event's content, as in Synapse, under the
// membership this server sets; the user's profile fills displayname and
// avatar_url where extra has none.
func (s *Service) Join(ctx context.Context, userID, roomIDOrAlias string, extra map[string]json.RawMessage, via []string) (string, error) {
	roomID, err := s.join(ctx, userID, roomIDOrAlias, extra, via)
	if err == nil {
		s.followUpgrade(ctx, userID, roomID)
	}
	return roomID, err
}

func (s *Service) join(ctx context.Context, userID, roomIDOrAlias string, extra map[string]json.RawMessage, via []string) (string, error) {
	roomID := roomIDOrAlias
	servers := slices.Clone(via)
	if strings.HasPrefix(roomIDOrAlias, "#") {
		a, aliasServers, err := s.resolveAlias(ctx, roomIDOrAlias)
		if err != nil {
			return "", err
		}
		roomID = a
		servers = append(servers, aliasServers...)
	} else if !strings.HasPrefix(roomIDOrAlias, "!") {
		return "", mxerr.InvalidParam("%q is neither a room ID nor an alias", roomIDOrAlias)
	}
	local, err := s.joinsLocally(ctx, roomID)
	if err != nil {
		return "", err
	}
	// Joining again changes nothing (as in Synapse): no new event.
	m, err := s.db.RoomMembership(ctx, roomID, userID)
	if err != nil {
		return "", err
	}
	if m == spec.Join && local {
		return roomID, nil
	}
	content := map[string]any{}
	for k, v := range extra {
		if k != "third_party_signed" && k != "join_authorised_via_users_server" {
			content[k] = v
		}
	}
	content["membership"] = spec.Join
	if content, err = s.withProfile(ctx, userID, content); err != nil {
		return "", err
	}
	if local {
		if err := s.authoriseLocalJoin(ctx, roomID, userID, content); err != nil {
			return "", err
		}
		if _, err := s.send(ctx, roomID, userID, spec.MRoomMember, &userID, content, nil); err != nil {
			return "", err
		}
		return roomID, nil
	}
	if m == spec.Invite {
		if inv, err := s.db.RoomStateEvents(ctx, roomID, []storage.StateKey{{Type: spec.MRoomMember, StateKey: userID}}); err != nil {
			return "", err
		} else if len(inv) == 1 {
			servers = append(servers, matrixid.Server(inv[0].Sender))
		}
	}
	servers = append(servers, s.roomServer(ctx, roomID))
	var unique []string
	for _, srv := range servers {
		if srv != "" && !slices.Contains(unique, srv) {
			unique = append(unique, srv)
		}
	}
	if err := s.joinRemote(ctx, userID, roomID, unique, content); err != nil {
		return "", err
	}
	return roomID, nil
}

// roomServer is the server a room's ID points at: the server name of a
// room ID of versions 1 to 11, and for a version 12 room ID (which has
// none) the server of the create event's sender, when this server holds
// the create event (from an invite, a knock or an earlier stay); "" when
// there is none to tell.
func (s *Service) roomServer(ctx context.Context, roomID string) string {
	if server := matrixid.Server(roomID); server != "" {
		return server
	}
	create, err := s.db.RoomEventsByID(ctx, []string{roomversion.CreateEventID(roomID)})
	if err != nil || len(create) != 1 || create[0].RoomID != roomID || create[0].Type != spec.MRoomCreate {
		return ""
	}
	return matrixid.Server(create[0].Sender)
}

// joinsLocally reports whether a join of a room is a local event: the
// room is known and a user of this server is in it, or it was created
// here and no other server is in it.
func (s *Service) joinsLocally(ctx context.Context, roomID string) (bool, error) {
	if _, err := s.db.Room(ctx, roomID); errors.Is(err, storage.ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	if in, err := s.localServerInRoom(ctx, roomID); err != nil || in {
		return in, err
	}
	servers, err := s.db.RoomJoinedServers(ctx, roomID)
	if err != nil {
		return false, err
	}
	return len(servers) == 0 && s.roomServer(ctx, roomID) == s.opts.ServerName, nil
}

// Invite invites a user; a user of another server is invited through
// their server, which signs the invite first.
func (s *Service) Invite(ctx context.Context, sender, roomID, target, reason string) error {
	content := map[string]any{"membership": spec.Invite}
	if reason != "" {
		content["reason"] = reason
	}
	return s.invite(ctx, sender, roomID, target, content)
}

func (s *Service) invite(ctx context.Context, sender, roomID, target string, content map[string]any) error {
	if _, err := spec.NewUserID(target, true); err != nil {
		return mxerr.BadJSON("%q is not a valid user ID", target)
	}
	if m, err := s.db.RoomMembership(ctx, roomID, target); err != nil {
		return err
	} else if m == spec.Invite {
		return nil // inviting again succeeds and changes nothing
	}
	content, err := s.withProfile(ctx, target, content)
	if err != nil {
		return err
	}
	var finish func(gomatrixserverlib.PDU) (gomatrixserverlib.PDU, error)
	if !s.isLocalUser(target) {
		finish = func(ev gomatrixserverlib.PDU) (gomatrixserverlib.PDU, error) { return s.inviteRemote(ctx, ev) }
	}
	_, err = s.sendFinished(ctx, roomID, sender, spec.MRoomMember, &target, content, nil, finish)
	return err
}

// Leave leaves a room, or rejects an invite.
func (s *Service) Leave(ctx context.Context, userID, roomID, reason string) error {
	// gomatrixserverlib lets a leave follow a leave (Synapse accepted
	// them once); a user who is not in the room has nothing to leave.
	if m, err := s.db.RoomMembership(ctx, roomID, userID); err != nil {
		return err
	} else if m != spec.Join && m != spec.Invite && m != "knock" {
		if _, err := s.db.Room(ctx, roomID); errors.Is(err, storage.ErrNotFound) {
			return errNoRoom(roomID)
		}
		return mxerr.Forbidden("you are not in room %s", roomID)
	} else if m == spec.Invite || m == spec.Knock {
		// An invite to a room this server is not in is rejected through
		// the inviter's server; a knock on one is withdrawn through the
		// room's servers.
		if in, err := s.localServerInRoom(ctx, roomID); err != nil {
			return err
		} else if !in && m == spec.Invite {
			return s.rejectRemoteInvite(ctx, userID, roomID)
		} else if !in {
			return s.withdrawRemoteKnock(ctx, userID, roomID)
		}
	}
	_, err := s.member(ctx, roomID, userID, userID, spec.Leave, reason)
	return err
}

// Kick makes another user leave.
func (s *Service) Kick(ctx context.Context, sender, roomID, target, reason string) error {
	if err := checkTarget(target); err != nil {
		return err
	}
	if m, err := s.db.RoomMembership(ctx, roomID, target); err != nil {
		return err
	} else if m != spec.Join && m != spec.Invite && m != "knock" {
		return mxerr.Forbidden("%s is not in the room", target)
	}
	_, err := s.member(ctx, roomID, sender, target, spec.Leave, reason)
	return err
}

// Ban bans a user.
func (s *Service) Ban(ctx context.Context, sender, roomID, target, reason string) error {
	if err := checkTarget(target); err != nil {
		return err
	}
	_, err := s.member(ctx, roomID, sender, target, spec.Ban, reason)
	return err
}

// Unban lifts a ban.
func (s *Service) Unban(ctx context.Context, sender, roomID, target, reason string) error {
	if err := checkTarget(target); err != nil {
		return err
	}
	if m, err := s.db.RoomMembership(ctx, roomID, target); err != nil {
		return err
	} else if m != spec.Ban {
		return mxerr.Forbidden("%s is not banned", target)
	}
	_, err := s.member(ctx, roomID, sender, target, spec.Leave, reason)
	return err
}

// Forget hides a room the user is no longer in from their list of rooms.
func (s *Service) Forget(ctx context.Context, userID, roomID string) error {
	if _, err := s.db.Room(ctx, roomID); errors.Is(err, storage.ErrNotFound) {
		return errNoRoom(roomID)
	} else if err != nil {
		return err
	}
	m, err := s.db.RoomMembership(ctx, roomID, userID)
	if err != nil {
		return err
	}
	switch m {
	case spec.Join, spec.Invite:
		return mxerr.New(400, "M_UNKNOWN", "leave the room before forgetting it")
	case "":
		return mxerr.NotFound("you were never in room %s", roomID)
	}
	return s.db.ForgetRoom(ctx, userID, roomID)
}

func checkTarget(target string) error {
	if _, err := spec.NewUserID(target, true); err != nil {
		return mxerr.BadJSON("%q is not a valid user ID", target)
	}
	return nil
}

// member sends an m.room.member event, keeping the target's profile
// fields (none are kept yet) and adding the reason.
func (s *Service) member(ctx context.Context, roomID, sender, target, membership, reason string) (string, error) {
	content := map[string]any{"membership": membership}
	if reason != "" {
		content["reason"] = reason
	}
	ev, err := s.send(ctx, roomID, sender, spec.MRoomMember, &target, content, nil)
	if err != nil {
		return "", err
	}
	return ev.EventID(), nil
}
