// Package initialsync serves the first, since replaced, way clients
// loaded their rooms: GET /initialSync (every room of the user's with its
// state and latest messages) and GET /rooms/{roomId}/initialSync (one
// room), as Synapse still serves them and the homeserver test suites
// exercise them. Both are put together from the room server's state and
// message reads, which apply membership and history visibility.
package initialsync

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strconv"

	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/streamtoken"
	"github.com/keyserver/keyserver/storage"
)

// Rooms reads rooms as a user may see them (package roomserver, through
// the server's adapter), events in the client format.
type Rooms interface {
	// State is a room's current state, or for a user who left it the
	// state when they left.
	State(ctx context.Context, userID, roomID string) ([]json.RawMessage, error)
	// LatestMessages is a page of a room's latest events, newest first,
	// as /messages pages back from the end of the room.
	LatestMessages(ctx context.Context, userID, roomID string, limit int) (Page, error)
}

// Page is a page of /messages: Start where it began, End where the
// next page back begins ("" when there is none).
type Page struct {
	Chunk      []json.RawMessage
	Start, End string
}

// MaxLimit caps the messages of a room, as /messages caps a page.
const MaxLimit = 1000

// Store is what else the answers read (package sqlstore).
type Store interface {
	storage.Memberships
	storage.AccountDataStore
	storage.Rooms
	storage.Stream
}

// Service answers the initial syncs.
type Service struct {
	rooms Rooms
	db    Store
}

// New makes a Service.
func New(rooms Rooms, db Store) *Service { return &Service{rooms: rooms, db: db} }

// DefaultLimit is how many messages of each room are answered when the
// request names no limit.
const DefaultLimit = 10

// Event is an account data event.
type Event struct {
	Type    string          `json:"type"`
	Content json.RawMessage `json:"content"`
}

// Messages are a room's latest messages, oldest first: Start pages back
// from the first (with /messages), End is where they end.
type Messages struct {
	Chunk []json.RawMessage `json:"chunk"`
	Start string            `json:"start"`
	End   string            `json:"end"`
}

// Room is one room of an answer.
type Room struct {
	RoomID      string            `json:"room_id"`
	Membership  string            `json:"membership"`
	Visibility  string            `json:"visibility"`
	Messages    *Messages         `json:"messages,omitempty"`
	State       []json.RawMessage `json:"state,omitempty"`
	AccountData []Event           `json:"account_data"`
	Presence    []any             `json:"presence"`
}

// Response is the answer of GET /initialSync.
type Response struct {
	End         string  `json:"end"`
	Rooms       []Room  `json:"rooms"`
	Presence    []any   `json:"presence"`
	AccountData []Event `json:"account_data"`
}

// ParseLimit reads the limit query parameter ("" for the default).
func ParseLimit(s string) (int, error) {
	if s == "" {
		return DefaultLimit, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, mxerr.InvalidParam("limit must be a non-negative integer")
	}
	return min(n, MaxLimit), nil
}

// All answers GET /initialSync: the rooms the user is joined or invited
// to (and, with archived, those they left or were banned from), each
// with its state and latest limit messages as the user may see them,
// and the user's account data.
func (s *Service) All(ctx context.Context, userID string, limit int, archived bool) (Response, error) {
	pos, err := s.db.CurrentPos(ctx)
	if err != nil {
		return Response{}, err
	}
	memberships, err := s.db.UserRoomMemberships(ctx, userID)
	if err != nil {
		return Response{}, err
	}
	data, err := s.db.AccountDataChanges(ctx, userID, 0, math.MaxInt64)
	if err != nil {
		return Response{}, err
	}
	out := Response{End: streamtoken.Format(pos), Rooms: []Room{}, Presence: []any{}, AccountData: []Event{}}
	for _, d := range data {
		if d.RoomID == "" {
			out.AccountData = append(out.AccountData, Event{Type: d.Type, Content: d.Content})
		}
	}
	for _, m := range memberships {
		switch m.Membership {
		case spec.Join:
		case spec.Invite:
			room, err := s.entry(ctx, m.RoomID, spec.Invite, data)
			if err != nil {
				return Response{}, err
			}
			out.Rooms = append(out.Rooms, room)
			continue
		case spec.Leave, spec.Ban:
			if !archived {
				continue
			}
		default:
			continue
		}
		room, err := s.room(ctx, userID, m.RoomID, m.Membership, limit, data)
		if err != nil {
			return Response{}, err
		}
		out.Rooms = append(out.Rooms, room)
	}
	return out, nil
}

// Room answers GET /rooms/{roomId}/initialSync: the room's state and
// latest messages as the user may see them (a member, one who left up to
// their leave, anyone for a world-readable room: the room server
// decides).
func (s *Service) Room(ctx context.Context, userID, roomID string, limit int) (Room, error) {
	membership, err := s.db.RoomMembership(ctx, roomID, userID)
	if err != nil {
		return Room{}, err
	}
	data, err := s.db.AccountDataChanges(ctx, userID, 0, math.MaxInt64)
	if err != nil {
		return Room{}, err
	}
	if membership == "" {
		membership = spec.Leave
	}
	return s.room(ctx, userID, roomID, membership, limit, data)
}

func (s *Service) room(ctx context.Context, userID, roomID, membership string, limit int, data []storage.AccountData) (Room, error) {
	out, err := s.entry(ctx, roomID, membership, data)
	if err != nil {
		return Room{}, err
	}
	msgs, err := s.rooms.LatestMessages(ctx, userID, roomID, max(limit, 1))
	if err != nil {
		return Room{}, err
	}
	chunk := slices.Clone(msgs.Chunk)
	if limit == 0 {
		chunk = nil
	}
	slices.Reverse(chunk)
	start := msgs.End
	if start == "" || limit == 0 {
		start = msgs.Start
	}
	out.Messages = &Messages{Chunk: orEmpty(chunk), Start: start, End: msgs.Start}
	if out.State, err = s.rooms.State(ctx, userID, roomID); err != nil {
		return Room{}, err
	}
	out.State = orEmpty(out.State)
	return out, nil
}

// entry is what every room of an answer has: its ID, the user's
// membership, whether it is in the public directory, the user's account
// data of the room.
func (s *Service) entry(ctx context.Context, roomID, membership string, data []storage.AccountData) (Room, error) {
	r, err := s.db.Room(ctx, roomID)
	if errors.Is(err, storage.ErrNotFound) {
		return Room{}, mxerr.NotFound("unknown room %s", roomID)
	} else if err != nil {
		return Room{}, err
	}
	out := Room{RoomID: roomID, Membership: membership, Visibility: "private", AccountData: []Event{}, Presence: []any{}}
	if r.Published {
		out.Visibility = "public"
	}
	for _, d := range data {
		if d.RoomID == roomID {
			out.AccountData = append(out.AccountData, Event{Type: d.Type, Content: d.Content})
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
