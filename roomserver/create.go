package roomserver

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"math/big"
	"slices"
	"strings"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/roomversion"
	"github.com/keyserver/keyserver/storage"
)

// CreateRoomRequest is the body of POST /createRoom.
type CreateRoomRequest struct {
	Visibility                string                     `json:"visibility"`
	RoomAliasName             string                     `json:"room_alias_name"`
	Name                      *string                    `json:"name"`
	Topic                     *string                    `json:"topic"`
	Invite                    []string                   `json:"invite"`
	RoomVersion               string                     `json:"room_version"`
	CreationContent           map[string]json.RawMessage `json:"creation_content"`
	InitialState              []StateEvent               `json:"initial_state"`
	Preset                    string                     `json:"preset"`
	IsDirect                  bool                       `json:"is_direct"`
	PowerLevelContentOverride map[string]json.RawMessage `json:"power_level_content_override"`
}

// StateEvent is an entry of initial_state.
type StateEvent struct {
	Type     string          `json:"type"`
	StateKey string          `json:"state_key"`
	Content  json.RawMessage `json:"content"`
}

// presets are the join rule, history visibility and guest access of each
// preset.
var presets = map[string][3]string{
	"private_chat":         {"invite", "shared", "can_join"},
	"trusted_private_chat": {"invite", "shared", "can_join"},
	"public_chat":          {"public", "shared", "forbidden"},
}

const idChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

func randomString(n int) string {
	b := make([]byte, n)
	for i := range b {
		k, _ := rand.Int(rand.Reader, big.NewInt(int64(len(idChars))))
		b[i] = idChars[k.Int64()]
	}
	return string(b)
}

func ptr(s string) *string { return &s }

// CreateRoom creates a room with its initial events, in the order the
// spec gives, each authorised against the state before it, and writes
// them in one transaction. It returns the room ID.
func (s *Service) CreateRoom(ctx context.Context, creator string, req CreateRoomRequest) (string, error) {
	return s.createRoom(ctx, creator, req)
}

func (s *Service) createRoom(ctx context.Context, creator string, req CreateRoomRequest) (string, error) {
	version := DefaultRoomVersion
	if req.RoomVersion != "" {
		version = gomatrixserverlib.RoomVersion(req.RoomVersion)
	}
	if _, ok := RoomVersions()[string(version)]; !ok {
		return "", mxerr.New(400, "M_UNSUPPORTED_ROOM_VERSION", "room version %q is not supported", req.RoomVersion)
	}
	impl := gomatrixserverlib.MustGetRoomVersion(version)
	preset := req.Preset
	switch {
	case preset == "" && req.Visibility == "public":
		preset = "public_chat"
	case preset == "":
		preset = "private_chat"
	}
	rules, ok := presets[preset]
	if !ok {
		return "", mxerr.BadJSON("unknown preset %q", req.Preset)
	}
	if req.Visibility != "" && req.Visibility != "public" && req.Visibility != "private" {
		return "", mxerr.BadJSON("visibility must be public or private")
	}
	for _, u := range req.Invite {
		if _, err := spec.NewUserID(u, true); err != nil {
			return "", mxerr.BadJSON("%q is not a valid user ID", u)
		}
	}
	for _, st := range req.InitialState {
		if st.Type == "" || !isObject(st.Content) {
			return "", mxerr.BadJSON("each initial_state entry needs a type and a content object")
		}
	}
	var alias string
	if req.RoomAliasName != "" {
		if strings.ContainsAny(req.RoomAliasName, ":# \t\n") {
			return "", mxerr.InvalidParam("room_alias_name must be the alias' localpart")
		}
		alias = "#" + req.RoomAliasName + ":" + s.opts.ServerName
		if _, err := s.db.RoomAlias(ctx, alias); err == nil {
			return "", mxerr.New(400, "M_ROOM_IN_USE", "the alias %s is taken", alias)
		}
	}

	// A version 12 room's ID is the hash of its create event, known once
	// that is built.
	roomID := ""
	if !roomversion.Is12(version) {
		roomID = "!" + randomString(18) + ":" + s.opts.ServerName
	}
	c := s.newChain(impl, roomID, nil, nil, 0)

	create := map[string]any{}
	for k, v := range req.CreationContent {
		create[k] = v
	}
	create["room_version"] = string(version)
	if version == gomatrixserverlib.RoomVersionV11 || roomversion.Is12(version) {
		delete(create, "creator")
	} else {
		create["creator"] = creator
	}
	users := map[string]int64{creator: 100}
	tombstoneLevel := 100
	if roomversion.Is12(version) {
		given, err := checkAdditionalCreators(req.CreationContent["additional_creators"])
		if err != nil {
			return "", err
		}
		// Upgrading (a tombstone) is for the creators alone by default,
		// as Synapse sets up version 12 rooms.
		tombstoneLevel = 150
		// Creators are above every power level and are not listed in
		// the power levels (MSC4289): trusted invitees become creators.
		users = map[string]int64{}
		if preset == "trusted_private_chat" && len(req.Invite) > 0 {
			create["additional_creators"] = additionalCreators(given, req.Invite, creator)
		}
	}
	pl := map[string]any{
		"users":          users,
		"users_default":  0,
		"events_default": 0,
		"state_default":  50,
		"ban":            50,
		"kick":           50,
		"redact":         50,
		"invite":         0,
		"events": map[string]int64{
			"m.room.name": 50, "m.room.avatar": 50, "m.room.canonical_alias": 50,
			"m.room.power_levels": 100, "m.room.history_visibility": 100, "m.room.tombstone": int64(tombstoneLevel),
			"m.room.server_acl": 100, "m.room.encryption": 100,
		},
		"notifications": map[string]int64{"room": 50},
	}
	if preset == "trusted_private_chat" && !roomversion.Is12(version) {
		for _, u := range req.Invite {
			users[u] = 100
		}
	}
	for k, v := range req.PowerLevelContentOverride {
		pl[k] = v
	}
	creatorJoin, err := s.withProfile(ctx, creator, map[string]any{"membership": spec.Join})
	if err != nil {
		return "", err
	}
	steps := []struct {
		evType, stateKey string
		content          any
	}{
		{spec.MRoomCreate, "", create},
		{spec.MRoomMember, creator, creatorJoin},
		{spec.MRoomPowerLevels, "", pl},
	}
	if alias != "" {
		steps = append(steps, struct {
			evType, stateKey string
			content          any
		}{"m.room.canonical_alias", "", map[string]any{"alias": alias}})
	}
	steps = append(steps, []struct {
		evType, stateKey string
		content          any
	}{
		{spec.MRoomJoinRules, "", map[string]any{"join_rule": rules[0]}},
		{spec.MRoomHistoryVisibility, "", map[string]any{"history_visibility": rules[1]}},
		{"m.room.guest_access", "", map[string]any{"guest_access": rules[2]}},
	}...)
	for _, st := range req.InitialState {
		// name and topic win over the same types in initial_state.
		if (st.Type == "m.room.name" && req.Name != nil) || (st.Type == "m.room.topic" && req.Topic != nil) {
			continue
		}
		steps = append(steps, struct {
			evType, stateKey string
			content          any
		}{st.Type, st.StateKey, st.Content})
	}
	if req.Name != nil {
		steps = append(steps, struct {
			evType, stateKey string
			content          any
		}{"m.room.name", "", map[string]any{"name": *req.Name}})
	}
	if req.Topic != nil {
		steps = append(steps, struct {
			evType, stateKey string
			content          any
		}{"m.room.topic", "", topicContent(*req.Topic)})
	}
	var remoteInvites []string
	for _, u := range req.Invite {
		if !s.isLocalUser(u) {
			remoteInvites = append(remoteInvites, u) // once the room exists: their servers sign them
			continue
		}
		content, err := s.withProfile(ctx, u, inviteContent(req.IsDirect))
		if err != nil {
			return "", err
		}
		steps = append(steps, struct {
			evType, stateKey string
			content          any
		}{spec.MRoomMember, u, content})
	}
	for _, st := range steps {
		ev, err := c.add(creator, st.evType, ptr(st.stateKey), st.content)
		if err != nil {
			var mx *mxerr.Error
			if errors.As(err, &mx) && mx.Code == "M_FORBIDDEN" {
				return "", mxerr.New(400, "M_INVALID_ROOM_STATE", "the initial state is not allowed: %s", mx.Message)
			}
			return "", err
		}
		if roomID == "" {
			roomID = ev.RoomID().String()
			c.roomID = roomID
		}
	}
	res, err := s.db.WriteRoomEvents(ctx, storage.RoomWrite{
		Create: &storage.Room{RoomID: roomID, RoomVersion: string(version), Creator: creator, Published: req.Visibility == "public"},
		RoomID: roomID, Events: c.records, Alias: alias, Federate: s.opts.Federated, Now: s.opts.Now().UnixMilli(),
	})
	if errors.Is(err, storage.ErrExists) {
		return "", mxerr.New(400, "M_ROOM_IN_USE", "the alias %s is taken", alias)
	}
	if err != nil {
		return "", err
	}
	s.written(res)
	// The room exists either way; a failed invite is the caller's answer
	// (as Synapse answers it), the first one the others are tried after.
	var inviteErr error
	for _, u := range remoteInvites {
		if err := s.invite(ctx, creator, roomID, u, inviteContent(req.IsDirect)); err != nil {
			s.opts.Logger.WithField("room_id", roomID).WithField("invitee", u).WithError(err).Info("an invite of a new room failed")
			if inviteErr == nil {
				inviteErr = err
			}
		}
	}
	return roomID, inviteErr
}

// checkAdditionalCreators reads creation_content.additional_creators: a
// list of valid user IDs (400 M_BAD_JSON otherwise).
func checkAdditionalCreators(raw json.RawMessage) ([]string, error) {
	if raw == nil {
		return nil, nil
	}
	var ids []string
	if err := json.Unmarshal(raw, &ids); err != nil {
		return nil, mxerr.BadJSON("creation_content.additional_creators must be a list of user IDs")
	}
	for _, u := range ids {
		if _, err := spec.NewUserID(u, true); err != nil {
			return nil, mxerr.BadJSON("%q in creation_content.additional_creators is not a valid user ID", u)
		}
	}
	return ids, nil
}

// additionalCreators is a version 12 create event's additional_creators:
// those of creation_content, then the invitees of a trusted private chat,
// once each and without the creator.
func additionalCreators(given, invitees []string, creator string) []string {
	out := slices.Clone(given)
	for _, u := range invitees {
		if u != creator && !slices.Contains(out, u) {
			out = append(out, u)
		}
	}
	return out
}

// topicContent is an m.room.topic's content: the plain topic, and the
// same as the rich m.topic clients of the current spec read.
func topicContent(topic string) map[string]any {
	return map[string]any{"topic": topic,
		"m.topic": map[string]any{"m.text": []any{map[string]any{"body": topic, "mimetype": "text/plain"}}}}
}

func inviteContent(direct bool) map[string]any {
	content := map[string]any{"membership": spec.Invite}
	if direct {
		content["is_direct"] = true
	}
	return content
}

// isObject says whether raw is one JSON object: valid JSON whose first
// byte past any white space opens an object (one scan, no decoding).
func isObject(raw json.RawMessage) bool {
	t := bytes.TrimLeft(raw, " \t\r\n")
	return len(t) > 0 && t[0] == '{' && json.Valid(raw)
}

func (s *Service) isLocalUser(userID string) bool {
	return strings.HasSuffix(userID, ":"+s.opts.ServerName)
}
