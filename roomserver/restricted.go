package roomserver

import (
	"cmp"
	"context"
	"encoding/json"
	"net/http"
	"slices"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// Restricted rooms (join rules restricted, room versions 8+, and
// knock_restricted, 10+): a user joined to one of the rooms the rule's
// allow list names may join without an invite. The join then names, in
// join_authorised_via_users_server, a user of the server that checked it
// who is in the room with the power to invite, and carries that server's
// signature; the auth rules (gomatrixserverlib's) check both.

// errUnableToGrantJoin is 400 M_UNABLE_TO_GRANT_JOIN: the user may join,
// but no user of this server in the room may invite (as Synapse answers;
// another resident server may).
func errUnableToGrantJoin() error {
	return mxerr.New(http.StatusBadRequest, "M_UNABLE_TO_GRANT_JOIN", "no user of this server in the room has the power to invite")
}

// errUnableToAuthoriseJoin is 400 M_UNABLE_TO_AUTHORISE_JOIN: this server
// is in none of the allowed rooms the user might be in, so it cannot tell.
func errUnableToAuthoriseJoin() error {
	return mxerr.New(http.StatusBadRequest, "M_UNABLE_TO_AUTHORISE_JOIN", "this server cannot check the room's join conditions")
}

// authoriseRestrictedJoin decides a join of userID to a room with a
// restricted join rule: it returns the local user to name in
// join_authorised_via_users_server ("" when the room is not restricted,
// its version knows no restricted rooms, or the user is invited or
// joined already, as the auth rules then need none). A user in none of
// the allowed rooms is refused with 403 M_FORBIDDEN; when this server is
// not in every allowed room and the user is in none of those it is in,
// 400 M_UNABLE_TO_AUTHORISE_JOIN; a user allowed but with no local user
// able to invite, 400 M_UNABLE_TO_GRANT_JOIN.
func (s *Service) authoriseRestrictedJoin(ctx context.Context, room storage.Room, userID string) (string, error) {
	impl, err := gomatrixserverlib.GetRoomVersion(gomatrixserverlib.RoomVersion(room.RoomVersion))
	if err != nil || impl.CheckRestrictedJoinsAllowed() != nil {
		return "", nil
	}
	state, err := s.db.RoomStateEvents(ctx, room.RoomID, []storage.StateKey{{Type: spec.MRoomJoinRules}, {Type: spec.MRoomPowerLevels},
		{Type: spec.MRoomMember, StateKey: userID}, {Type: spec.MRoomCreate}})
	if err != nil {
		return "", err
	}
	var rules gomatrixserverlib.JoinRuleContent
	var plEvent, createEvent gomatrixserverlib.PDU
	for _, ev := range state {
		switch ev.Type {
		case spec.MRoomCreate:
			if createEvent, err = pdu(ev); err != nil {
				return "", err
			}
		case spec.MRoomJoinRules:
			p, err := pdu(ev)
			if err != nil {
				return "", err
			}
			_ = json.Unmarshal(p.Content(), &rules)
		case spec.MRoomPowerLevels:
			if plEvent, err = pdu(ev); err != nil {
				return "", err
			}
		case spec.MRoomMember:
			if ev.Membership == spec.Join || ev.Membership == spec.Invite {
				return "", nil
			}
		}
	}
	if rules.JoinRule != spec.Restricted && rules.JoinRule != spec.KnockRestricted {
		return "", nil
	}
	allowed, unknown := false, false
	for _, rule := range rules.Allow {
		if rule.Type != spec.MRoomMembership || rule.RoomID == "" {
			continue
		}
		in, err := s.localServerInRoom(ctx, rule.RoomID)
		if err != nil {
			return "", err
		}
		if !in {
			unknown = true
			continue
		}
		m, err := s.db.RoomMembership(ctx, rule.RoomID, userID)
		if err != nil {
			return "", err
		}
		if m == spec.Join {
			allowed = true
			break
		}
	}
	if !allowed {
		if unknown {
			return "", errUnableToAuthoriseJoin()
		}
		return "", mxerr.Forbidden("you are not joined to any of the rooms this room's join rule allows")
	}
	var levels gomatrixserverlib.PowerLevelContent
	levels.Defaults()
	if plEvent != nil {
		pl, err := plEvent.PowerLevels()
		if err != nil {
			return "", errUnableToGrantJoin()
		}
		levels = *pl
	} else if room.Creator != "" {
		levels.Users = map[string]int64{room.Creator: 100}
	}
	levels = withCreators(levels, createEvent)
	current, err := s.db.RoomCurrentState(ctx, room.RoomID)
	if err != nil {
		return "", err
	}
	var candidates []string
	for _, ev := range current {
		if ev.Type == spec.MRoomMember && ev.StateKey != nil && ev.Membership == spec.Join && s.isLocalUser(*ev.StateKey) &&
			levels.UserLevel(spec.SenderID(*ev.StateKey)) >= levels.Invite {
			candidates = append(candidates, *ev.StateKey)
		}
	}
	if len(candidates) == 0 {
		return "", errUnableToGrantJoin()
	}
	// The most powerful, then the first by ID: the same choice each time.
	slices.SortFunc(candidates, func(a, b string) int {
		if la, lb := levels.UserLevel(spec.SenderID(a)), levels.UserLevel(spec.SenderID(b)); la != lb {
			return cmp.Compare(lb, la)
		}
		if a < b {
			return -1
		}
		return 1
	})
	return candidates[0], nil
}

// restrictedQuerier answers gomatrixserverlib's make_join check of a
// restricted room with the decision authoriseRestrictedJoin made: the
// user is in an allowed room and via, a local user in the room with the
// power to invite, authorises the join.
type restrictedQuerier struct {
	querier
	via gomatrixserverlib.PDU
}

func (q restrictedQuerier) RestrictedRoomJoinInfo(ctx context.Context, roomID spec.RoomID, senderID spec.SenderID, local spec.ServerName) (*gomatrixserverlib.RestrictedRoomJoinInfo, error) {
	if q.via == nil {
		return q.querier.RestrictedRoomJoinInfo(ctx, roomID, senderID, local)
	}
	return &gomatrixserverlib.RestrictedRoomJoinInfo{LocalServerInRoom: true, UserJoinedToRoom: true,
		JoinedUsers: []gomatrixserverlib.PDU{q.via}}, nil
}

// restrictedJoinQuerier is the room querier of a /make_join: for a
// restricted room, one that names the authorising user chosen here.
func (s *Service) restrictedJoinQuerier(ctx context.Context, room storage.Room, userID string) (gomatrixserverlib.RestrictedRoomJoinQuerier, error) {
	via, err := s.authoriseRestrictedJoin(ctx, room, userID)
	if err != nil || via == "" {
		return querier{s}, err
	}
	evs, err := s.db.RoomStateEvents(ctx, room.RoomID, []storage.StateKey{{Type: spec.MRoomMember, StateKey: via}})
	if err != nil {
		return nil, err
	}
	if len(evs) != 1 {
		return nil, errUnableToGrantJoin()
	}
	p, err := pdu(evs[0])
	if err != nil {
		return nil, err
	}
	return restrictedQuerier{querier: querier{s}, via: p}, nil
}

// authoriseLocalJoin adds join_authorised_via_users_server to the
// content of a local user's join of a restricted room this server is
// in. Unable to check the allowed rooms, this server refuses (403), as
// for a user in none of them.
func (s *Service) authoriseLocalJoin(ctx context.Context, roomID, userID string, content map[string]any) error {
	room, err := s.db.Room(ctx, roomID)
	if err != nil {
		return err
	}
	via, err := s.authoriseRestrictedJoin(ctx, room, userID)
	if e, ok := err.(*mxerr.Error); ok && e.Code == "M_UNABLE_TO_AUTHORISE_JOIN" {
		return mxerr.Forbidden("you are not joined to any of the rooms this room's join rule allows")
	} else if err != nil {
		return err
	}
	if via != "" {
		content["join_authorised_via_users_server"] = via
	}
	return nil
}

// checkAuthorisedJoin checks a join sent to /send_join that names one of
// our users as its authorising user: the joining user must be allowed by
// the room's join rule as make_join would have found (the signature this
// server adds vouches for it).
func (s *Service) checkAuthorisedJoin(ctx context.Context, room storage.Room, raw json.RawMessage) error {
	var ev struct {
		Sender  string `json:"sender"`
		Content struct {
			Via any `json:"join_authorised_via_users_server"`
		} `json:"content"`
	}
	if json.Unmarshal(raw, &ev) != nil {
		return nil // gomatrixserverlib refuses it
	}
	via, ok := ev.Content.Via.(string)
	if !ok || !s.isLocalUser(via) {
		return nil
	}
	_, err := s.authoriseRestrictedJoin(ctx, room, ev.Sender)
	return err
}
