package roomserver

import (
	"context"
	"errors"
	"strings"

	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// Membership changes, all m.room.member events built on the room's
// current state and checked by the auth rules (which decide who may
// invite, kick, ban and unban whom).

// Join joins a local room by ID or alias; it returns the room ID.
func (s *Service) Join(ctx context.Context, userID, roomIDOrAlias, reason string) (string, error) {
	roomID := roomIDOrAlias
	// via: the servers to join through, those the alias' server named.
	var via []string
	if strings.HasPrefix(roomIDOrAlias, "#") {
		var err error
		if roomID, via, err = s.resolveAlias(ctx, roomIDOrAlias); err != nil {
			return "", err
		}
	} else if !strings.HasPrefix(roomIDOrAlias, "!") {
		return "", mxerr.InvalidParam("%q is neither a room ID nor an alias", roomIDOrAlias)
	}
	if _, err := s.db.Room(ctx, roomID); errors.Is(err, storage.ErrNotFound) {
		// Rooms of other servers are joined over federation (through
		// via), to come.
		if len(via) > 0 {
			return "", mxerr.NotFound("room %s is on other servers (%s); joining it is not supported yet", roomID, strings.Join(via, ", "))
		}
		return "", errNoRoom(roomID)
	} else if err != nil {
		return "", err
	}
	// Joining again changes nothing (as in Synapse): no new event.
	if m, err := s.db.RoomMembership(ctx, roomID, userID); err != nil {
		return "", err
	} else if m == spec.Join {
		return roomID, nil
	}
	if _, err := s.member(ctx, roomID, userID, userID, spec.Join, reason); err != nil {
		return "", err
	}
	return roomID, nil
}

// Invite invites a user (local only for now).
func (s *Service) Invite(ctx context.Context, sender, roomID, target, reason string) error {
	if _, err := spec.NewUserID(target, true); err != nil {
		return mxerr.BadJSON("%q is not a valid user ID", target)
	}
	if !s.isLocalUser(target) {
		return mxerr.Forbidden("inviting users of other servers is not supported yet")
	}
	if m, err := s.db.RoomMembership(ctx, roomID, target); err != nil {
		return err
	} else if m == spec.Invite {
		return nil // inviting again succeeds and changes nothing
	}
	_, err := s.member(ctx, roomID, sender, target, spec.Invite, reason)
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
