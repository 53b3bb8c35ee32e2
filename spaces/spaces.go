// Package spaces walks space hierarchies and summarises rooms for those
// who may preview them: GET /rooms/{roomId}/hierarchy for clients, the
// federation /hierarchy/{roomId} for other servers, and the room summary
// (MSC3266, GET /room_summary/{roomIdOrAlias}).
//
// A room's entry (name, topic, alias, avatar, joined members, join rule,
// world_readable, guest_can_join, type) is read from its current state.
// A space's children are its m.space.child state events with a non-empty
// "via", in the spec's order: by "order" (printable ASCII, at most 50
// characters; others count as none) with children without one last, then
// by origin_server_ts, then by room ID.
//
// Who may see a room (as Synapse decides): anyone when its join rule is
// public, knock or knock_restricted or its history is world_readable; a
// user who is joined or invited, or who is joined to one of the rooms a
// restricted join rule names; for another server, one with a user joined
// to the room or to one of those rooms. Other rooms are left out of a
// hierarchy (their children too), and the room asked for is refused.
//
// A room this server is not in is asked of the servers its m.space.child
// event names ("via", the first three) with the federation /hierarchy;
// their answers are kept for five minutes, and the entries of the
// children they include are used for rooms that are not spaces. The
// answer of another server is filtered again for the requesting user.
//
// The hierarchy is walked depth first. A page's next_batch counts the
// rooms already answered and is bound to the request's room, user,
// suggested_only and max_depth: the next page walks again (with the
// answers of other servers kept) and skips them.
package spaces

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// Store is what the hierarchy reads of rooms (package sqlstore).
type Store interface {
	Room(ctx context.Context, roomID string) (storage.Room, error)
	RoomStateEvents(ctx context.Context, roomID string, keys []storage.StateKey) ([]storage.RoomEvent, error)
	// RoomStateOfType returns the current state events of one type.
	RoomStateOfType(ctx context.Context, roomID, eventType string) ([]storage.RoomEvent, error)
	RoomJoinedCount(ctx context.Context, roomID string) (int, error)
	RoomJoinedServers(ctx context.Context, roomID string) ([]string, error)
	// RoomMembership returns a user's membership of a room ("" when none).
	RoomMembership(ctx context.Context, roomID, userID string) (string, error)
}

// Remote asks another server for a room's hierarchy (package fedclient):
// GET /_matrix/federation/v1/hierarchy/{roomId}.
type Remote interface {
	Hierarchy(ctx context.Context, server, roomID string, suggestedOnly bool) (json.RawMessage, error)
}

// The limits of a walk, as Synapse's.
const (
	// MaxLimit is the most rooms of a page, and a page's size when the
	// request names none.
	MaxLimit = 50
	// MaxChildren is the most children of a space answered to another
	// server.
	MaxChildren = 50
	// maxVia is the most servers asked for a room not known here.
	maxVia = 3
	// remoteTTL is how long another server's answer is kept.
	remoteTTL = 5 * time.Minute
	// maxCached bounds the answers kept.
	maxCached = 1000
	// maxVisited bounds the rooms one request walks through (answered,
	// skipped or left out): beyond, the walk stops without next_batch.
	maxVisited = 10000
)

const spaceChild = "m.space.child"

// ChildEvent is an m.space.child event, stripped.
type ChildEvent struct {
	Type           string          `json:"type"`
	StateKey       string          `json:"state_key"`
	Content        json.RawMessage `json:"content"`
	Sender         string          `json:"sender"`
	OriginServerTS int64           `json:"origin_server_ts"`
}

// Room is a room's entry in a hierarchy.
type Room struct {
	RoomID           string `json:"room_id"`
	Name             string `json:"name,omitempty"`
	Topic            string `json:"topic,omitempty"`
	CanonicalAlias   string `json:"canonical_alias,omitempty"`
	AvatarURL        string `json:"avatar_url,omitempty"`
	NumJoinedMembers int    `json:"num_joined_members"`
	JoinRule         string `json:"join_rule,omitempty"`
	WorldReadable    bool   `json:"world_readable"`
	GuestCanJoin     bool   `json:"guest_can_join"`
	RoomType         string `json:"room_type,omitempty"`
	// RoomVersion and Encryption (the algorithm of m.room.encryption)
	// are MSC3266's.
	RoomVersion string `json:"room_version,omitempty"`
	Encryption  string `json:"encryption,omitempty"`
	// AllowedRoomIDs are the rooms a restricted join rule names, told to
	// other servers so that they can filter for their users.
	AllowedRoomIDs []string `json:"allowed_room_ids,omitempty"`
	// ChildrenState are a space's m.space.child events (empty for a room
	// that is not a space).
	ChildrenState []ChildEvent `json:"children_state"`
}

// ChildRoom is a child's entry in a federation answer: a Room without
// its children.
type ChildRoom struct {
	Room
	ChildrenState []ChildEvent `json:"children_state,omitempty"`
}

// Response is a page of a hierarchy.
type Response struct {
	Rooms     []Room `json:"rooms"`
	NextBatch string `json:"next_batch,omitempty"`
}

// FederationResponse answers another server's /hierarchy.
type FederationResponse struct {
	Room                 Room        `json:"room"`
	Children             []ChildRoom `json:"children"`
	InaccessibleChildren []string    `json:"inaccessible_children"`
}

// Request is a client's GET /hierarchy.
type Request struct {
	RoomID        string
	From          string
	Limit         int // 0: MaxLimit
	MaxDepth      int // -1: none
	SuggestedOnly bool
}

// RequestFromQuery reads the query of GET /hierarchy.
func RequestFromQuery(roomID string, q url.Values) (Request, error) {
	req := Request{RoomID: roomID, From: q.Get("from"), MaxDepth: -1}
	if !matrixid.ValidRoomID(roomID) {
		return Request{}, mxerr.InvalidParam("%q is not a room ID", roomID)
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n <= 0 {
			return Request{}, mxerr.InvalidParam("limit must be a positive integer")
		}
		req.Limit = n
	}
	if d := q.Get("max_depth"); d != "" {
		n, err := strconv.Atoi(d)
		if err != nil || n < 0 {
			return Request{}, mxerr.InvalidParam("max_depth must be a non-negative integer")
		}
		req.MaxDepth = n
	}
	var err error
	if req.SuggestedOnly, err = ParseBool(q, "suggested_only"); err != nil {
		return Request{}, err
	}
	return req, nil
}

// ParseBool reads a boolean query parameter: "true" or "false", false
// when absent.
func ParseBool(q url.Values, name string) (bool, error) {
	switch q.Get(name) {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	}
	return false, mxerr.InvalidParam("%s must be true or false", name)
}

// Service answers hierarchies and summaries.
type Service struct {
	db         Store
	remote     Remote
	serverName string
	log        logrus.FieldLogger
	now        func() time.Time

	mu    sync.Mutex
	cache map[cacheKey]cached
}

type cacheKey struct {
	roomID    string
	suggested bool
}

type cached struct {
	at    time.Time
	entry remoteHierarchy
}

// New makes a Service; remote may be nil (rooms not known here are then
// left out).
func New(db Store, remote Remote, serverName string, log logrus.FieldLogger) *Service {
	return &Service{db: db, remote: remote, serverName: serverName, log: log, now: time.Now, cache: map[cacheKey]cached{}}
}

// local is what is read of a room this server knows.
type local struct {
	room     Room
	version  string
	joinRule string
	allow    []string
	// member is the requester's membership ("" when none).
	member string
}

// entryKeys are the pieces of state an entry is read from.
var entryKeys = []storage.StateKey{{Type: spec.MRoomName}, {Type: spec.MRoomTopic}, {Type: spec.MRoomCanonicalAlias},
	{Type: "m.room.avatar"}, {Type: spec.MRoomJoinRules}, {Type: spec.MRoomHistoryVisibility},
	{Type: "m.room.guest_access"}, {Type: spec.MRoomCreate}, {Type: "m.room.encryption"}}

// load reads a room's entry from its current state, with userID's
// membership when userID is set; ok is false for a room without state.
func (s *Service) load(ctx context.Context, roomID, userID string) (_ local, ok bool, _ error) {
	r, err := s.db.Room(ctx, roomID)
	if errors.Is(err, storage.ErrNotFound) {
		return local{}, false, nil
	} else if err != nil {
		return local{}, false, err
	}
	keys := entryKeys
	if userID != "" {
		keys = append(slices.Clone(entryKeys), storage.StateKey{Type: spec.MRoomMember, StateKey: userID})
	}
	state, err := s.db.RoomStateEvents(ctx, roomID, keys)
	if err != nil {
		return local{}, false, err
	}
	if len(state) == 0 {
		return local{}, false, nil
	}
	l := local{room: Room{RoomID: roomID, RoomVersion: r.RoomVersion, ChildrenState: []ChildEvent{}}, version: r.RoomVersion}
	for _, ev := range state {
		if ev.StateKey == nil || ev.Rejected {
			continue
		}
		if ev.Type == spec.MRoomMember {
			l.member = ev.Membership
			continue
		}
		if *ev.StateKey != "" {
			continue
		}
		var pdu struct {
			Content json.RawMessage `json:"content"`
		}
		if json.Unmarshal(ev.JSON, &pdu) != nil {
			continue
		}
		str := func(field string) string {
			var m map[string]json.RawMessage
			var v string
			if json.Unmarshal(pdu.Content, &m) != nil || json.Unmarshal(m[field], &v) != nil {
				return "" // content of the wrong shape says nothing
			}
			return v
		}
		switch ev.Type {
		case spec.MRoomName:
			l.room.Name = str("name")
		case spec.MRoomTopic:
			l.room.Topic = str("topic")
		case spec.MRoomCanonicalAlias:
			l.room.CanonicalAlias = str("alias")
		case "m.room.avatar":
			l.room.AvatarURL = str("url")
		case spec.MRoomJoinRules:
			l.joinRule = str("join_rule")
			l.room.JoinRule = l.joinRule
			l.allow = allowedRooms(pdu.Content)
		case spec.MRoomHistoryVisibility:
			l.room.WorldReadable = str("history_visibility") == "world_readable"
		case "m.room.guest_access":
			l.room.GuestCanJoin = str("guest_access") == "can_join"
		case spec.MRoomCreate:
			l.room.RoomType = str("type")
		case "m.room.encryption":
			l.room.Encryption = str("algorithm")
		}
	}
	if l.room.NumJoinedMembers, err = s.db.RoomJoinedCount(ctx, roomID); err != nil {
		return local{}, false, err
	}
	return l, true, nil
}

// allowedRooms returns the rooms of a join rule's "allow" list.
func allowedRooms(content json.RawMessage) []string {
	var c struct {
		Allow []struct {
			Type   string `json:"type"`
			RoomID string `json:"room_id"`
		} `json:"allow"`
	}
	if json.Unmarshal(content, &c) != nil {
		return nil
	}
	var out []string
	for _, a := range c.Allow {
		if a.Type == "m.room_membership" && matrixid.ValidRoomID(a.RoomID) {
			out = append(out, a.RoomID)
		}
	}
	return out
}

// restricted reports whether a join rule lets members of other rooms in,
// in the room's version.
func (l local) restricted() bool {
	old := func(n int) bool { v, err := strconv.Atoi(l.version); return err == nil && v < n }
	return (l.joinRule == "restricted" && !old(8)) || (l.joinRule == "knock_restricted" && !old(10))
}

// previewable: anyone may see a room whose join rule lets anyone ask in
// or whose history is world_readable.
func (l local) previewable() bool {
	old := func(n int) bool { v, err := strconv.Atoi(l.version); return err == nil && v < n }
	switch {
	case l.joinRule == "public", l.joinRule == "knock" && !old(7), l.joinRule == "knock_restricted" && !old(10):
		return true
	}
	return l.room.WorldReadable
}

// userMay reports whether a local user may see a room.
func (s *Service) userMay(ctx context.Context, l local, userID string) (bool, error) {
	if l.previewable() || l.member == spec.Join || l.member == spec.Invite {
		return true, nil
	}
	if userID == "" || !l.restricted() {
		return false, nil
	}
	return s.joinedToAny(ctx, userID, l.allow)
}

func (s *Service) joinedToAny(ctx context.Context, userID string, rooms []string) (bool, error) {
	for _, id := range rooms {
		m, err := s.db.RoomMembership(ctx, id, userID)
		if err != nil {
			return false, err
		}
		if m == spec.Join {
			return true, nil
		}
	}
	return false, nil
}

// serverMay reports whether another server may see a room: one of its
// users is joined to it or, for a restricted room, to one of the rooms
// its join rule names.
func (s *Service) serverMay(ctx context.Context, l local, origin string) (bool, error) {
	if l.previewable() {
		return true, nil
	}
	rooms := []string{l.room.RoomID}
	if l.restricted() {
		rooms = append(rooms, l.allow...)
	}
	for _, id := range rooms {
		servers, err := s.db.RoomJoinedServers(ctx, id)
		if err != nil {
			return false, err
		}
		if slices.Contains(servers, origin) {
			return true, nil
		}
	}
	return false, nil
}

// joinedHere reports whether a user of this server is joined to a room
// (its state here is current).
func (s *Service) joinedHere(ctx context.Context, roomID string) (bool, error) {
	servers, err := s.db.RoomJoinedServers(ctx, roomID)
	if err != nil {
		return false, err
	}
	return slices.Contains(servers, s.serverName), nil
}

// children returns a space's m.space.child events with a "via", in the
// spec's order, the suggested ones only when suggestedOnly.
func (s *Service) children(ctx context.Context, roomID string, suggestedOnly bool) ([]ChildEvent, error) {
	evs, err := s.db.RoomStateOfType(ctx, roomID, spaceChild)
	if err != nil {
		return nil, err
	}
	out := []ChildEvent{}
	for _, ev := range evs {
		if ev.StateKey == nil || ev.Rejected {
			continue
		}
		var pdu struct {
			Content        json.RawMessage `json:"content"`
			OriginServerTS int64           `json:"origin_server_ts"`
		}
		if json.Unmarshal(ev.JSON, &pdu) != nil {
			continue
		}
		out = append(out, ChildEvent{Type: ev.Type, StateKey: *ev.StateKey, Content: pdu.Content,
			Sender: ev.Sender, OriginServerTS: pdu.OriginServerTS})
	}
	return sortChildren(out, suggestedOnly), nil
}

// childContent is what is read of an m.space.child event's content.
type childContent struct {
	via       []string
	order     string
	hasOrder  bool
	suggested bool
}

func readChild(c json.RawMessage) (childContent, bool) {
	var raw struct {
		Via       []any `json:"via"`
		Order     any   `json:"order"`
		Suggested any   `json:"suggested"`
	}
	if json.Unmarshal(c, &raw) != nil || len(raw.Via) == 0 {
		return childContent{}, false // a child without via has been removed
	}
	var out childContent
	for _, v := range raw.Via {
		s, ok := v.(string)
		if !ok {
			return childContent{}, false
		}
		out.via = append(out.via, s)
	}
	if o, ok := raw.Order.(string); ok && len(o) <= 50 && !strings.ContainsFunc(o, func(r rune) bool { return r < 0x20 || r > 0x7e }) {
		out.order, out.hasOrder = o, true
	}
	out.suggested = raw.Suggested == true
	return out, true
}

// sortChildren keeps the valid m.space.child events (the suggested ones
// when suggestedOnly) in the spec's order.
func sortChildren(evs []ChildEvent, suggestedOnly bool) []ChildEvent {
	type child struct {
		ev ChildEvent
		c  childContent
	}
	var kept []child
	for _, ev := range evs {
		if ev.Type != spaceChild || !matrixid.ValidRoomID(ev.StateKey) {
			continue
		}
		c, ok := readChild(ev.Content)
		if !ok || (suggestedOnly && !c.suggested) {
			continue
		}
		kept = append(kept, child{ev, c})
	}
	slices.SortStableFunc(kept, func(a, b child) int {
		if a.c.hasOrder != b.c.hasOrder {
			if a.c.hasOrder {
				return -1
			}
			return 1
		}
		if c := strings.Compare(a.c.order, b.c.order); c != 0 {
			return c
		}
		if a.ev.OriginServerTS != b.ev.OriginServerTS {
			if a.ev.OriginServerTS < b.ev.OriginServerTS {
				return -1
			}
			return 1
		}
		return strings.Compare(a.ev.StateKey, b.ev.StateKey)
	})
	out := make([]ChildEvent, 0, len(kept))
	for _, k := range kept {
		out = append(out, k.ev)
	}
	return out
}

// summarise returns a local room's entry with its children (when it is a
// space and children is true); nil when may refuses it.
func (s *Service) summarise(ctx context.Context, roomID, userID string, may func(local) (bool, error), suggestedOnly, children bool) (*local, error) {
	l, ok, err := s.load(ctx, roomID, userID)
	if err != nil || !ok {
		return nil, err
	}
	if ok, err := may(l); err != nil || !ok {
		return nil, err
	}
	if children && l.room.RoomType == spec.MSpace {
		if l.room.ChildrenState, err = s.children(ctx, roomID, suggestedOnly); err != nil {
			return nil, err
		}
	}
	return &l, nil
}

// queued is a room waiting in a walk.
type queued struct {
	roomID string
	via    []string
	depth  int
	// remote is the entry another server's answer gave, if any.
	remote *Room
}

// Hierarchy answers a page of the hierarchy of a room for a local user.
func (s *Service) Hierarchy(ctx context.Context, userID string, req Request) (Response, error) {
	limit := req.Limit
	if limit <= 0 || limit > MaxLimit {
		limit = MaxLimit
	}
	skip := 0
	binding := s.binding(userID, req)
	if req.From != "" {
		n, bound, ok := strings.Cut(req.From, "_")
		skip, _ = strconv.Atoi(n)
		if !ok || bound != binding || skip <= 0 || strconv.Itoa(skip) != n {
			return Response{}, mxerr.InvalidParam("unknown pagination token")
		}
	}
	may := func(l local) (bool, error) { return s.userMay(ctx, l, userID) }
	root, err := s.summarise(ctx, req.RoomID, userID, may, req.SuggestedOnly, false)
	if err != nil {
		return Response{}, err
	}
	if root == nil {
		return Response{}, mxerr.Forbidden("%s may not preview room %s", userID, req.RoomID)
	}

	out := Response{Rooms: []Room{}}
	queue := []queued{{roomID: req.RoomID}}
	seen := map[string]bool{}
	answered := 0
	for len(queue) > 0 && len(out.Rooms) < limit {
		q := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		if seen[q.roomID] {
			continue
		}
		seen[q.roomID] = true
		if len(seen) > maxVisited {
			s.log.WithFields(logrus.Fields{"room_id": req.RoomID, "visited": maxVisited}).Warn("a hierarchy walk stopped at its bound")
			queue = nil
			break
		}
		var entry *Room
		var remoteChildren map[string]Room
		var inaccessible map[string]bool
		here, err := s.joinedHere(ctx, q.roomID)
		if err != nil {
			return Response{}, err
		}
		if here {
			l, err := s.summarise(ctx, q.roomID, userID, may, req.SuggestedOnly, true)
			if err != nil {
				return Response{}, err
			}
			if l != nil {
				entry = &l.room
			}
		} else {
			if q.remote != nil && (q.remote.RoomType != spec.MSpace || (req.MaxDepth >= 0 && q.depth >= req.MaxDepth)) {
				entry = q.remote
			} else if h, ok := s.fetch(ctx, q.roomID, q.via, req.SuggestedOnly); ok {
				entry, remoteChildren, inaccessible = &h.room, h.children, h.inaccessible
			}
			if entry != nil {
				if ok, err := s.userMayRemote(ctx, *entry, userID); err != nil {
					return Response{}, err
				} else if !ok {
					entry = nil
				}
			}
		}
		if entry == nil {
			continue
		}
		answered++
		if answered > skip {
			r := *entry
			r.AllowedRoomIDs = nil
			if r.ChildrenState == nil {
				r.ChildrenState = []ChildEvent{}
			}
			out.Rooms = append(out.Rooms, r)
		}
		if req.MaxDepth < 0 || q.depth < req.MaxDepth {
			for i := len(entry.ChildrenState) - 1; i >= 0; i-- {
				ev := entry.ChildrenState[i]
				if ev.Type != spaceChild || inaccessible[ev.StateKey] {
					continue
				}
				c, _ := readChild(ev.Content)
				next := queued{roomID: ev.StateKey, via: c.via, depth: q.depth + 1}
				if r, ok := remoteChildren[ev.StateKey]; ok {
					next.remote = &r
				}
				queue = append(queue, next)
			}
		}
	}
	for len(queue) > 0 && seen[queue[len(queue)-1].roomID] {
		queue = queue[:len(queue)-1]
	}
	if len(queue) > 0 {
		out.NextBatch = strconv.Itoa(answered) + "_" + binding
	}
	return out, nil
}

// binding ties a pagination token to the request it continues.
func (s *Service) binding(userID string, req Request) string {
	h := sha256.Sum256([]byte(strings.Join([]string{userID, req.RoomID, strconv.FormatBool(req.SuggestedOnly), strconv.Itoa(req.MaxDepth)}, "\x00")))
	return hex.EncodeToString(h[:6])
}

// userMayRemote reports whether a local user may see a room another
// server described.
func (s *Service) userMayRemote(ctx context.Context, r Room, userID string) (bool, error) {
	switch r.JoinRule {
	case "", "public", "knock", "knock_restricted":
		return true, nil
	}
	if r.WorldReadable {
		return true, nil
	}
	if userID == "" {
		return false, nil
	}
	if ok, err := s.joinedToAny(ctx, userID, r.AllowedRoomIDs); err != nil || ok {
		return ok, err
	}
	// The user may be in the room already, or invited to it.
	l, ok, err := s.load(ctx, r.RoomID, userID)
	if err != nil || !ok {
		return false, err
	}
	return s.userMay(ctx, l, userID)
}

// remoteHierarchy is another server's answer, checked.
type remoteHierarchy struct {
	room         Room
	children     map[string]Room
	inaccessible map[string]bool
}

// fetch asks the servers of via (the first three, this one left out) for
// a room's hierarchy, the first good answer kept for a while.
func (s *Service) fetch(ctx context.Context, roomID string, via []string, suggestedOnly bool) (remoteHierarchy, bool) {
	if s.remote == nil {
		return remoteHierarchy{}, false
	}
	key := cacheKey{roomID, suggestedOnly}
	s.mu.Lock()
	c, ok := s.cache[key]
	s.mu.Unlock()
	if ok && s.now().Sub(c.at) < remoteTTL {
		return c.entry, true
	}
	asked := 0
	for _, server := range via {
		if asked == maxVia {
			break
		}
		if server == s.serverName {
			continue
		}
		if _, _, ok := spec.ParseAndValidateServerName(spec.ServerName(server)); !ok {
			continue
		}
		asked++
		raw, err := s.remote.Hierarchy(ctx, server, roomID, suggestedOnly)
		if err != nil {
			s.log.WithFields(logrus.Fields{"room_id": roomID, "server": server}).WithError(err).Info("a server did not answer a room's hierarchy")
			continue
		}
		h, err := readRemote(raw, roomID, suggestedOnly)
		if err != nil {
			s.log.WithFields(logrus.Fields{"room_id": roomID, "server": server}).WithError(err).Info("a server answered a room's hierarchy with something else")
			continue
		}
		s.mu.Lock()
		now := s.now()
		if len(s.cache) >= maxCached {
			for k, v := range s.cache {
				if now.Sub(v.at) >= remoteTTL || len(s.cache) >= maxCached {
					delete(s.cache, k)
				}
			}
		}
		s.cache[key] = cached{at: now, entry: h}
		s.mu.Unlock()
		return h, true
	}
	return remoteHierarchy{}, false
}

// readRemote checks another server's answer to /hierarchy/{roomID}.
func readRemote(raw json.RawMessage, roomID string, suggestedOnly bool) (remoteHierarchy, error) {
	var body struct {
		Room                 json.RawMessage   `json:"room"`
		Children             []json.RawMessage `json:"children"`
		InaccessibleChildren []json.RawMessage `json:"inaccessible_children"`
	}
	if err := json.Unmarshal(raw, &body); err != nil {
		return remoteHierarchy{}, err
	}
	var room Room
	if err := json.Unmarshal(body.Room, &room); err != nil {
		return remoteHierarchy{}, err
	}
	if room.RoomID != roomID {
		return remoteHierarchy{}, errors.New("the answer is not about the room asked for")
	}
	// Servers that speak MSC3266's first version name these so.
	var unstable struct {
		Version    string `json:"im.nheko.summary.version"`
		Encryption string `json:"im.nheko.summary.encryption"`
	}
	_ = json.Unmarshal(body.Room, &unstable)
	if room.RoomVersion == "" {
		room.RoomVersion = unstable.Version
	}
	if room.Encryption == "" {
		room.Encryption = unstable.Encryption
	}
	h := remoteHierarchy{room: room, children: map[string]Room{}, inaccessible: map[string]bool{}}
	h.room.ChildrenState = sortChildren(h.room.ChildrenState, suggestedOnly)
	for _, c := range body.Children {
		var r Room
		if json.Unmarshal(c, &r) != nil || !matrixid.ValidRoomID(r.RoomID) {
			continue // one bad child spoils nothing else
		}
		r.ChildrenState = sortChildren(r.ChildrenState, suggestedOnly)
		h.children[r.RoomID] = r
	}
	for _, c := range body.InaccessibleChildren {
		var id string
		if json.Unmarshal(c, &id) == nil {
			h.inaccessible[id] = true
		}
	}
	return h, nil
}

// FederationHierarchy answers another server's /hierarchy/{roomId}: the
// room with its children's events, the entries of the children this
// server is in and may show, and those it may not show (404 M_NOT_FOUND
// when the room itself may not be shown).
func (s *Service) FederationHierarchy(ctx context.Context, origin, roomID string, suggestedOnly bool) (FederationResponse, error) {
	if !matrixid.ValidRoomID(roomID) {
		return FederationResponse{}, mxerr.InvalidParam("%q is not a room ID", roomID)
	}
	may := func(l local) (bool, error) { return s.serverMay(ctx, l, origin) }
	root, err := s.summarise(ctx, roomID, "", may, suggestedOnly, true)
	if err != nil {
		return FederationResponse{}, err
	}
	if root == nil {
		return FederationResponse{}, mxerr.NotFound("unknown room %s", roomID)
	}
	out := FederationResponse{Room: withAllowed(*root), Children: []ChildRoom{}, InaccessibleChildren: []string{}}
	for i, ev := range root.room.ChildrenState {
		if i == MaxChildren {
			break
		}
		here, err := s.joinedHere(ctx, ev.StateKey)
		if err != nil {
			return FederationResponse{}, err
		}
		if !here {
			continue
		}
		l, err := s.summarise(ctx, ev.StateKey, "", may, suggestedOnly, false)
		if err != nil {
			return FederationResponse{}, err
		}
		if l == nil {
			out.InaccessibleChildren = append(out.InaccessibleChildren, ev.StateKey)
			continue
		}
		r := withAllowed(*l)
		r.ChildrenState = nil
		out.Children = append(out.Children, ChildRoom{Room: r})
	}
	return out, nil
}

// withAllowed is a room's entry for another server: with the rooms a
// restricted join rule names.
func withAllowed(l local) Room {
	r := l.room
	if l.restricted() {
		r.AllowedRoomIDs = l.allow
	}
	return r
}

// Summary is a room's summary (MSC3266).
type Summary struct {
	Room
	ChildrenState []ChildEvent `json:"children_state,omitempty"`
	// Membership is the caller's ("leave" when none); empty without a
	// caller.
	Membership string `json:"membership,omitempty"`
	// The names of MSC3266's first version, which clients still read.
	UnstableVersion    string `json:"im.nheko.summary.version,omitempty"`
	UnstableEncryption string `json:"im.nheko.summary.encryption,omitempty"`
}

// Summary answers a room's summary for userID ("" for no one): of a room
// this server is in when the user may see it, else asked of the servers
// of via; 404 M_NOT_FOUND for a room not found or not to be seen.
func (s *Service) Summary(ctx context.Context, userID, roomID string, via []string) (Summary, error) {
	if !matrixid.ValidRoomID(roomID) {
		return Summary{}, mxerr.InvalidParam("%q is not a room ID", roomID)
	}
	here, err := s.joinedHere(ctx, roomID)
	if err != nil {
		return Summary{}, err
	}
	var out Summary
	if here {
		l, err := s.summarise(ctx, roomID, userID, func(l local) (bool, error) { return s.userMay(ctx, l, userID) }, false, false)
		if err != nil {
			return Summary{}, err
		}
		if l == nil {
			return Summary{}, mxerr.NotFound("room %s not found or not to be seen", roomID)
		}
		out = Summary{Room: l.room}
	} else {
		if len(via) == 0 {
			return Summary{}, mxerr.MissingParam("room %s is not known here: name servers to ask with via", roomID)
		}
		h, ok := s.fetch(ctx, roomID, via, true)
		if !ok {
			return Summary{}, mxerr.NotFound("room %s not found or not to be seen", roomID)
		}
		if ok, err := s.userMayRemote(ctx, h.room, userID); err != nil {
			return Summary{}, err
		} else if !ok {
			return Summary{}, mxerr.NotFound("room %s not found or not to be seen", roomID)
		}
		out = Summary{Room: h.room}
	}
	out.Room.AllowedRoomIDs = nil
	out.Room.ChildrenState = nil
	if userID != "" {
		m, err := s.db.RoomMembership(ctx, roomID, userID)
		if err != nil {
			return Summary{}, err
		}
		if m == "" {
			m = spec.Leave
		}
		out.Membership = m
	}
	out.UnstableVersion, out.UnstableEncryption = out.RoomVersion, out.Encryption
	return out, nil
}
