// Package publicrooms is the public room directory: the rooms their
// members chose to list (PUT /directory/list/room, or createRoom with
// "visibility": "public"), served to clients (/publicRooms) and to other
// servers (federation /publicRooms), with each room's name, topic, alias,
// avatar, join rule and member count as its current state gives them;
// and, for a client naming another server, that server's directory.
package publicrooms

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"strconv"
	"strings"

	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/remotefail"
	"github.com/keyserver/keyserver/storage"

	"github.com/sirupsen/logrus"
)

// Store is what the directory reads and writes (package sqlstore).
type Store interface {
	storage.RoomDirectory
	storage.Rooms
}

// entryKeys are the pieces of a room's state its entry is read from (not
// its members: a big room's entry costs no more than a small one's).
var entryKeys = []storage.StateKey{{Type: spec.MRoomName}, {Type: spec.MRoomTopic}, {Type: spec.MRoomCanonicalAlias},
	{Type: "m.room.avatar"}, {Type: spec.MRoomJoinRules}, {Type: spec.MRoomHistoryVisibility},
	{Type: "m.room.guest_access"}, {Type: spec.MRoomCreate}}

// Rooms decides who may change a room's entry (package roomserver).
type Rooms interface {
	CheckDirectoryChange(ctx context.Context, userID, roomID string) error
}

// Remote asks another server for its directory (package fedclient):
// POST with body when it is not nil, else GET with query.
type Remote interface {
	PublicRooms(ctx context.Context, server string, body any, query url.Values) (json.RawMessage, error)
}

// Service serves the directory.
type Service struct {
	db         Store
	rooms      Rooms
	remote     Remote
	serverName string
	log        logrus.FieldLogger
}

// New makes a Service; remote may be nil (other servers' directories are
// then not asked for).
func New(db Store, rooms Rooms, remote Remote, serverName string, log logrus.FieldLogger) *Service {
	return &Service{db: db, rooms: rooms, remote: remote, serverName: serverName, log: log}
}

// Visibility answers a room's entry: "public" when listed, else
// "private"; 404 for a room this server does not know.
func (s *Service) Visibility(ctx context.Context, roomID string) (string, error) {
	r, err := s.db.Room(ctx, roomID)
	if errors.Is(err, storage.ErrNotFound) {
		return "", mxerr.NotFound("unknown room %s", roomID)
	} else if err != nil {
		return "", err
	}
	if r.Published {
		return "public", nil
	}
	return "private", nil
}

// SetVisibility lists a room ("public") or takes it out ("private").
func (s *Service) SetVisibility(ctx context.Context, userID, roomID, visibility string) error {
	if visibility != "public" && visibility != "private" {
		return mxerr.InvalidParam("visibility must be public or private")
	}
	if err := s.rooms.CheckDirectoryChange(ctx, userID, roomID); err != nil {
		return err
	}
	err := s.db.SetRoomPublished(ctx, roomID, visibility == "public")
	if errors.Is(err, storage.ErrNotFound) {
		return mxerr.NotFound("unknown room %s", roomID)
	}
	return err
}

// Request is a page of the directory asked for: the query of GET
// /publicRooms, or the body of POST.
type Request struct {
	Limit  int    `json:"limit,omitempty"`
	Since  string `json:"since,omitempty"`
	Filter Filter `json:"filter,omitempty"`
	// IncludeAllNetworks and ThirdPartyInstanceID are about bridged
	// networks, which this server has none of: accepted and passed on.
	IncludeAllNetworks   bool   `json:"include_all_networks,omitempty"`
	ThirdPartyInstanceID string `json:"third_party_instance_id,omitempty"`
}

// Filter narrows the rooms listed.
type Filter struct {
	// GenericSearchTerm is matched, without regard to case, against each
	// room's name, topic and canonical alias.
	GenericSearchTerm string `json:"generic_search_term,omitempty"`
	// RoomTypes keeps the rooms of these types; a null in the list means
	// rooms without a type. Empty: every room.
	RoomTypes []*string `json:"room_types,omitempty"`
}

// Chunk is one room of the directory as the spec describes it.
type Chunk struct {
	RoomID           string `json:"room_id"`
	Name             string `json:"name,omitempty"`
	Topic            string `json:"topic,omitempty"`
	CanonicalAlias   string `json:"canonical_alias,omitempty"`
	AvatarURL        string `json:"avatar_url,omitempty"`
	JoinRule         string `json:"join_rule,omitempty"`
	RoomType         string `json:"room_type,omitempty"`
	NumJoinedMembers int    `json:"num_joined_members"`
	WorldReadable    bool   `json:"world_readable"`
	GuestCanJoin     bool   `json:"guest_can_join"`
}

// Response is a page of the directory.
type Response struct {
	Chunk     []Chunk `json:"chunk"`
	NextBatch string  `json:"next_batch,omitempty"`
	PrevBatch string  `json:"prev_batch,omitempty"`
	// TotalRoomCountEstimate counts every listed room, filter or not.
	TotalRoomCountEstimate int `json:"total_room_count_estimate"`
}

// DefaultLimit and MaxLimit bound a page.
const (
	DefaultLimit = 100
	MaxLimit     = 500
)

// Remote reports whether server names another server than this one.
func (s *Service) Remote(server string) bool {
	return server != "" && server != s.serverName
}

// List answers a page of a directory: this server's, or (server naming
// another) that server's, asked over federation.
func (s *Service) List(ctx context.Context, server string, req Request) (any, error) {
	if s.Remote(server) {
		if _, _, ok := spec.ParseAndValidateServerName(spec.ServerName(server)); !ok {
			return nil, mxerr.InvalidParam("%q is not a server name", server)
		}
		if s.remote == nil {
			return nil, mxerr.NotFound("the directories of other servers are not served")
		}
		var body any
		query := url.Values{}
		if req.Filter.GenericSearchTerm != "" || len(req.Filter.RoomTypes) > 0 {
			body = req
		} else {
			if req.Limit > 0 {
				query.Set("limit", strconv.Itoa(req.Limit))
			}
			if req.Since != "" {
				query.Set("since", req.Since)
			}
			if req.IncludeAllNetworks {
				query.Set("include_all_networks", "true")
			}
			if req.ThirdPartyInstanceID != "" {
				query.Set("third_party_instance_id", req.ThirdPartyInstanceID)
			}
		}
		raw, err := s.remote.PublicRooms(ctx, server, body, query)
		if err != nil {
			return nil, remotefail.ForClient(s.log, server, err, "no public rooms of "+server)
		}
		var page struct {
			Chunk []json.RawMessage `json:"chunk"`
		}
		if json.Unmarshal(raw, &page) != nil || page.Chunk == nil {
			return nil, mxerr.New(502, "M_UNKNOWN", "%s answered something that is not a room directory", server)
		}
		return raw, nil
	}
	return s.Local(ctx, req)
}

// Local answers a page of this server's directory.
func (s *Service) Local(ctx context.Context, req Request) (Response, error) {
	limit := req.Limit
	if limit <= 0 {
		limit = DefaultLimit
	}
	limit = min(limit, MaxLimit)
	offset := 0
	if req.Since != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(req.Since, "o"))
		if err != nil || !strings.HasPrefix(req.Since, "o") || n < 0 {
			return Response{}, mxerr.InvalidParam("since is not a token this server gave")
		}
		offset = n
	}
	published, err := s.db.PublishedRooms(ctx)
	if err != nil {
		return Response{}, err
	}
	term := strings.ToLower(req.Filter.GenericSearchTerm)
	var matching []Chunk
	for _, p := range published {
		if p.JoinedMembers == 0 {
			continue // a room nobody here is in any more has no current entry
		}
		c, err := s.chunk(ctx, p)
		if err != nil {
			return Response{}, err
		}
		if term != "" && !strings.Contains(strings.ToLower(c.Name), term) &&
			!strings.Contains(strings.ToLower(c.Topic), term) && !strings.Contains(strings.ToLower(c.CanonicalAlias), term) {
			continue
		}
		if !wantedType(req.Filter.RoomTypes, c.RoomType) {
			continue
		}
		matching = append(matching, c)
	}
	out := Response{Chunk: []Chunk{}, TotalRoomCountEstimate: len(published)}
	if offset < len(matching) {
		end := min(offset+limit, len(matching))
		out.Chunk = matching[offset:end]
		if end < len(matching) {
			out.NextBatch = "o" + strconv.Itoa(end)
		}
	}
	if offset > 0 {
		out.PrevBatch = "o" + strconv.Itoa(max(offset-limit, 0))
	}
	return out, nil
}

func wantedType(types []*string, roomType string) bool {
	if len(types) == 0 {
		return true
	}
	for _, t := range types {
		if (t == nil && roomType == "") || (t != nil && *t == roomType) {
			return true
		}
	}
	return false
}

// chunk reads a room's entry from its current state.
func (s *Service) chunk(ctx context.Context, p storage.PublishedRoom) (Chunk, error) {
	state, err := s.db.RoomStateEvents(ctx, p.RoomID, entryKeys)
	if err != nil {
		return Chunk{}, err
	}
	c := Chunk{RoomID: p.RoomID, NumJoinedMembers: p.JoinedMembers}
	for _, ev := range state {
		if ev.StateKey == nil || *ev.StateKey != "" {
			continue
		}
		var content struct {
			Name        string `json:"name"`
			Topic       string `json:"topic"`
			Alias       string `json:"alias"`
			URL         string `json:"url"`
			JoinRule    string `json:"join_rule"`
			HistoryVis  string `json:"history_visibility"`
			GuestAccess string `json:"guest_access"`
			Type        string `json:"type"`
		}
		var pdu struct {
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(ev.JSON, &pdu) != nil || json.Unmarshal(pdu.Content, &content) != nil {
			continue // content of the wrong shape says nothing
		}
		switch ev.Type {
		case spec.MRoomName:
			c.Name = content.Name
		case spec.MRoomTopic:
			c.Topic = content.Topic
		case spec.MRoomCanonicalAlias:
			c.CanonicalAlias = content.Alias
		case "m.room.avatar":
			c.AvatarURL = content.URL
		case spec.MRoomJoinRules:
			c.JoinRule = content.JoinRule
		case spec.MRoomHistoryVisibility:
			c.WorldReadable = content.HistoryVis == "world_readable"
		case "m.room.guest_access":
			c.GuestCanJoin = content.GuestAccess == "can_join"
		case spec.MRoomCreate:
			c.RoomType = content.Type
		}
	}
	return c, nil
}

// RequestFromQuery reads the query of GET /publicRooms: limit, since,
// include_all_networks, third_party_instance_id.
func RequestFromQuery(q url.Values) (Request, error) {
	req := Request{Since: q.Get("since"), ThirdPartyInstanceID: q.Get("third_party_instance_id"),
		IncludeAllNetworks: q.Get("include_all_networks") == "true"}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 0 {
			return Request{}, mxerr.InvalidParam("limit must be a non-negative integer")
		}
		req.Limit = n
	}
	return req, nil
}
