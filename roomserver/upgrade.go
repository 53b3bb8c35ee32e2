package roomserver

import (
	"context"
	"encoding/json"
	"errors"
	"slices"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/roomversion"
	"github.com/keyserver/keyserver/storage"
)

// UpgradeFollower hears of a local user joining a room that replaced
// another (package pushrules copies the user's rules of the old room).
type UpgradeFollower interface {
	JoinedUpgradedRoom(ctx context.Context, userID, oldRoomID, newRoomID string) error
}

// upgradedStateTypes are the state events a room upgrade carries over to
// the new room, as Synapse copies them (power levels apart: see Upgrade).
var upgradedStateTypes = []string{
	spec.MRoomJoinRules, "m.room.name", "m.room.topic", spec.MRoomHistoryVisibility,
	"m.room.guest_access", "m.room.avatar", "m.room.encryption", "m.room.server_acl",
	"m.room.canonical_alias",
}

// Upgrade replaces a room by a new one of another version (POST
// /rooms/{roomId}/upgrade), as Synapse does: the new room's create event
// names the old room as its predecessor and keeps its creation content;
// its state is the old room's join rules, name, topic, history
// visibility, guest access, avatar, encryption, server ACL, canonical
// alias, bans, the children of a space, and power levels (the upgrading
// user holds the power to set them up, and the old levels are restored
// after); the room stays in the public directory if the old one was
// there; this server's aliases of the old room move to the new one. The
// old room then gets a tombstone naming the new room, and its power
// levels are raised so that ordinary members can no longer talk or
// invite. The user needs the power to send a tombstone in the old room.
// It returns the new room's ID.
//
// In a new room of version 12 the upgrading user and additionalCreators
// are its creators (MSC4289): they hold every power without being listed
// in the power levels, so they are left out of the levels carried over.
func (s *Service) Upgrade(ctx context.Context, userID, roomID, newVersion string, additionalCreators []string) (string, error) {
	if _, ok := RoomVersions()[newVersion]; !ok {
		return "", mxerr.New(400, "M_UNSUPPORTED_ROOM_VERSION", "room version %q is not supported", newVersion)
	}
	to12 := roomversion.Is12(gomatrixserverlib.RoomVersion(newVersion))
	if len(additionalCreators) > 0 && !to12 {
		return "", mxerr.InvalidParam("additional_creators is only for room versions with creators (12)")
	}
	for _, u := range additionalCreators {
		if _, err := spec.NewUserID(u, true); err != nil {
			return "", mxerr.InvalidParam("%q in additional_creators is not a user ID", u)
		}
	}
	if err := s.joined(ctx, roomID, userID); err != nil {
		return "", err
	}
	pl, err := s.powerLevels(ctx, roomID)
	if err != nil {
		return "", err
	}
	if pl == nil || pl.UserLevel(spec.SenderID(userID)) < pl.EventLevel("m.room.tombstone", true) {
		return "", mxerr.Forbidden("you may not upgrade room %s", roomID)
	}
	room, err := s.db.Room(ctx, roomID)
	if err != nil {
		return "", err
	}
	state, err := s.db.RoomCurrentState(ctx, roomID)
	if err != nil {
		return "", err
	}
	contents := map[storage.StateKey]json.RawMessage{}
	for _, ev := range state {
		if ev.StateKey == nil {
			continue
		}
		var pdu struct {
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(ev.JSON, &pdu) != nil || !isObject(pdu.Content) {
			continue
		}
		contents[storage.StateKey{Type: ev.Type, StateKey: *ev.StateKey}] = pdu.Content
	}

	req := CreateRoomRequest{RoomVersion: newVersion, Preset: "private_chat", CreationContent: map[string]json.RawMessage{}}
	if room.Published {
		req.Visibility = "public"
	}
	var create map[string]json.RawMessage
	_ = json.Unmarshal(contents[storage.StateKey{Type: spec.MRoomCreate}], &create)
	for k, v := range create {
		if k != "creator" && k != "room_version" && k != "predecessor" && k != "additional_creators" {
			req.CreationContent[k] = v
		}
	}
	creators := map[string]bool{}
	if to12 {
		creators[userID] = true
		if len(additionalCreators) > 0 {
			extra, _ := json.Marshal(additionalCreators)
			req.CreationContent["additional_creators"] = extra
			for _, u := range additionalCreators {
				creators[u] = true
			}
		}
	}
	var last string
	if len(room.Extremities) > 0 {
		last = room.Extremities[0]
	}
	pred, _ := json.Marshal(map[string]string{"room_id": roomID, "event_id": last})
	req.CreationContent["predecessor"] = pred
	var roomType string
	_ = json.Unmarshal(create["type"], &roomType)

	for _, t := range upgradedStateTypes {
		if c, ok := contents[storage.StateKey{Type: t}]; ok {
			req.InitialState = append(req.InitialState, StateEvent{Type: t, Content: c})
		}
	}
	keys := make([]storage.StateKey, 0, len(contents))
	for k := range contents {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b storage.StateKey) int {
		if a.Type != b.Type {
			return compareStrings(a.Type, b.Type)
		}
		return compareStrings(a.StateKey, b.StateKey)
	})
	for _, k := range keys {
		switch {
		case k.Type == "m.space.child" && roomType == "m.space":
			req.InitialState = append(req.InitialState, StateEvent{Type: k.Type, StateKey: k.StateKey, Content: contents[k]})
		case k.Type == spec.MRoomMember && k.StateKey != userID && membershipOf(contents[k]) == spec.Ban:
			req.InitialState = append(req.InitialState, StateEvent{Type: k.Type, StateKey: k.StateKey,
				Content: json.RawMessage(`{"membership":"ban"}`)})
		}
	}

	// The power levels: the old room's, with the upgrading user able to
	// set up the new room's state; the old levels follow once it is.
	oldPL := contents[storage.StateKey{Type: spec.MRoomPowerLevels}]
	var plFields map[string]json.RawMessage
	if oldPL != nil {
		_ = json.Unmarshal(oldPL, &plFields)
	}
	// The users of the old levels as written there: the creators of a
	// version 12 room are not, and those of the new room must not be.
	var users map[string]json.RawMessage
	newPL := plFields
	if plFields != nil {
		_ = json.Unmarshal(plFields["users"], &users)
		if to12 {
			for u := range creators {
				delete(users, u)
			}
			b, _ := json.Marshal(users)
			newPL = withField(plFields, "users", b)
		}
	}
	raised := false
	if newPL != nil {
		needed := max(pl.StateDefault, pl.Ban)
		for _, l := range pl.Events {
			needed = max(needed, l)
		}
		if !to12 && pl.UserLevel(spec.SenderID(userID)) < needed {
			raisedUsers := map[string]json.RawMessage{}
			for u, l := range users {
				raisedUsers[u] = l
			}
			raisedUsers[userID], _ = json.Marshal(needed)
			b, _ := json.Marshal(raisedUsers)
			req.PowerLevelContentOverride = withField(newPL, "users", b)
			raised = true
		} else {
			req.PowerLevelContentOverride = newPL
		}
	}

	newRoomID, err := s.createRoom(ctx, userID, req)
	if err != nil {
		return "", err
	}
	log := s.opts.Logger.WithFields(logrus.Fields{"room_id": roomID, "replacement_room": newRoomID})
	if raised {
		if _, err := s.SendState(ctx, userID, newRoomID, spec.MRoomPowerLevels, "", oldPL); err != nil {
			log.WithError(err).Warn("could not restore the power levels in an upgraded room")
		}
	}

	// This server's aliases of the old room now name the new one.
	aliases, err := s.db.RoomAliases(ctx, roomID)
	if err != nil {
		return "", err
	}
	for _, a := range aliases {
		old, err := s.db.RoomAlias(ctx, a)
		if err != nil {
			continue
		}
		if err := s.db.DeleteRoomAlias(ctx, a); err != nil {
			return "", err
		}
		if err := s.db.PutRoomAlias(ctx, storage.RoomAlias{Alias: a, RoomID: newRoomID, Creator: old.Creator}); err != nil && !errors.Is(err, storage.ErrExists) {
			return "", err
		}
	}
	if room.Published {
		if err := s.db.SetRoomPublished(ctx, roomID, false); err != nil {
			return "", err
		}
	}

	tombstone, _ := json.Marshal(map[string]string{"body": "This room has been replaced", "replacement_room": newRoomID})
	if _, err := s.SendState(ctx, userID, roomID, "m.room.tombstone", "", tombstone); err != nil {
		return "", err
	}
	if _, ok := contents[storage.StateKey{Type: "m.room.canonical_alias"}]; ok {
		if _, err := s.SendState(ctx, userID, roomID, "m.room.canonical_alias", "", json.RawMessage(`{}`)); err != nil {
			log.WithError(err).Info("could not clear the old room's canonical alias")
		}
	}
	if restricted := restrictedLevels(plFields, pl); restricted != nil {
		if _, err := s.SendState(ctx, userID, roomID, spec.MRoomPowerLevels, "", restricted); err != nil {
			log.WithError(err).Info("could not restrict the old room's power levels")
		}
	}
	s.followUpgrade(ctx, userID, newRoomID)
	return newRoomID, nil
}

// withField returns a copy of an object's fields with one replaced.
func withField(fields map[string]json.RawMessage, key string, value json.RawMessage) map[string]json.RawMessage {
	out := make(map[string]json.RawMessage, len(fields)+1)
	for k, v := range fields {
		out[k] = v
	}
	out[key] = value
	return out
}

// restrictedLevels are the old room's power levels with events_default and
// invite raised to at least 50 and above users_default (Synapse's rule),
// nil when they are that already.
func restrictedLevels(fields map[string]json.RawMessage, pl *gomatrixserverlib.PowerLevelContent) json.RawMessage {
	if fields == nil {
		return nil
	}
	level := max(pl.UsersDefault+1, 50)
	out := map[string]json.RawMessage{}
	for k, v := range fields {
		out[k] = v
	}
	changed := false
	for k, cur := range map[string]int64{"events_default": pl.EventsDefault, "invite": pl.Invite} {
		if cur < level {
			b, _ := json.Marshal(level)
			out[k], changed = b, true
		}
	}
	if !changed {
		return nil
	}
	b, _ := json.Marshal(out)
	return b
}

// followUpgrade tells the upgrade follower of a local user in a room that
// replaced another (one whose create event names a predecessor).
func (s *Service) followUpgrade(ctx context.Context, userID, roomID string) {
	if s.opts.Upgrades == nil || !s.isLocalUser(userID) {
		return
	}
	create, err := s.db.RoomStateEvents(ctx, roomID, []storage.StateKey{{Type: spec.MRoomCreate}})
	if err != nil || len(create) != 1 {
		return
	}
	var ev struct {
		Content struct {
			Predecessor struct {
				RoomID string `json:"room_id"`
			} `json:"predecessor"`
		} `json:"content"`
	}
	if json.Unmarshal(create[0].JSON, &ev) != nil || ev.Content.Predecessor.RoomID == "" {
		return
	}
	if err := s.opts.Upgrades.JoinedUpgradedRoom(ctx, userID, ev.Content.Predecessor.RoomID, roomID); err != nil {
		s.opts.Logger.WithFields(logrus.Fields{"room_id": roomID, "user_id": userID}).WithError(err).
			Warn("could not carry a user's settings over to an upgraded room")
	}
}

func membershipOf(content json.RawMessage) string {
	var c struct {
		Membership string `json:"membership"`
	}
	_ = json.Unmarshal(content, &c)
	return c.Membership
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
