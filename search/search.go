// Package search answers POST /search: full-text search of the room
// events a user may see (message bodies, room names and topics; encrypted
// events are searched by clients, which hold their keys). The index is
// the storage area storage.SearchIndex, brought up to date before each
// search; which events a user may see, and the events around a result,
// come from the rooms through an interface declared here.
package search

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// Store is the search index.
type Store interface {
	storage.SearchIndex
}

// Rooms is what search reads of the rooms (package roomserver, through
// the server's adapter).
type Rooms interface {
	// JoinedRooms lists the rooms userID is joined to.
	JoinedRooms(ctx context.Context, userID string) ([]string, error)
	// VisibleEvent returns an event in client format if userID may see
	// it, otherwise an error.
	VisibleEvent(ctx context.Context, userID, roomID, eventID string) (json.RawMessage, error)
	// EventContext returns up to before and after events around an event
	// userID may see, with the tokens around them and the senders'
	// member events at that point.
	EventContext(ctx context.Context, userID, roomID, eventID string, before, after int) (EventContext, error)
}

// EventContext is what is around a result.
type EventContext struct {
	Start, End   string
	EventsBefore []json.RawMessage
	EventsAfter  []json.RawMessage
	// Members are the m.room.member events in the room's state there,
	// by user ID (client format).
	Members map[string]json.RawMessage
}

// The limits of a search, as Synapse's.
const (
	defaultLimit        = 10
	maxLimit            = 100 // results per page
	defaultContextLimit = 5
	maxContextLimit     = 100
	maxWords            = 20
	// indexBatch is how many stored events one step of bringing the
	// index up to date looks at.
	indexBatch = 1000
)

// Service answers searches.
type Service struct {
	db    Store
	rooms Rooms
}

// New makes a Service.
func New(db Store, rooms Rooms) *Service { return &Service{db: db, rooms: rooms} }

// Request is the body of POST /search.
type Request struct {
	SearchCategories struct {
		RoomEvents *RoomEventsCriteria `json:"room_events"`
	} `json:"search_categories"`
}

// RoomEventsCriteria are the spec's room_events criteria.
type RoomEventsCriteria struct {
	SearchTerm   *string         `json:"search_term"`
	Keys         []string        `json:"keys"`
	Filter       *Filter         `json:"filter"`
	OrderBy      string          `json:"order_by"`
	EventContext *ContextOptions `json:"event_context"`
	IncludeState bool            `json:"include_state"`
	Groupings    struct {
		GroupBy []struct {
			Key string `json:"key"`
		} `json:"group_by"`
	} `json:"groupings"`
}

// Filter is the RoomEventFilter of a search.
type Filter struct {
	Limit      *int     `json:"limit"`
	Rooms      []string `json:"rooms"`
	NotRooms   []string `json:"not_rooms"`
	Senders    []string `json:"senders"`
	NotSenders []string `json:"not_senders"`
	Types      []string `json:"types"`
	NotTypes   []string `json:"not_types"`
}

// ContextOptions ask for the events around each result.
type ContextOptions struct {
	BeforeLimit    *int `json:"before_limit"`
	AfterLimit     *int `json:"after_limit"`
	IncludeProfile bool `json:"include_profile"`
}

// Response is the answer to POST /search.
type Response struct {
	SearchCategories struct {
		RoomEvents *RoomEventsResult `json:"room_events,omitempty"`
	} `json:"search_categories"`
}

// RoomEventsResult is the spec's room_events result.
type RoomEventsResult struct {
	Count      int                          `json:"count"`
	Highlights []string                     `json:"highlights"`
	Results    []Result                     `json:"results"`
	NextBatch  string                       `json:"next_batch,omitempty"`
	Groups     map[string]map[string]*Group `json:"groups,omitempty"`
	State      map[string][]json.RawMessage `json:"state,omitempty"`
}

// Result is one event found.
type Result struct {
	Rank    float64         `json:"rank"`
	Result  json.RawMessage `json:"result"`
	Context *Context        `json:"context,omitempty"`
}

// Context is a result's surroundings.
type Context struct {
	Start        string                    `json:"start"`
	End          string                    `json:"end"`
	EventsBefore []json.RawMessage         `json:"events_before"`
	EventsAfter  []json.RawMessage         `json:"events_after"`
	ProfileInfo  map[string]map[string]any `json:"profile_info,omitempty"`
}

// Group is the results of one room or sender.
type Group struct {
	Results   []string `json:"results"`
	Order     int      `json:"order"`
	NextBatch string   `json:"next_batch,omitempty"`
}

var searchKeys = []string{storage.SearchKeyBody, storage.SearchKeyName, storage.SearchKeyTopic}

// Search answers POST /search for userID; nextBatch is the query's
// next_batch ("" for the first page).
func (s *Service) Search(ctx context.Context, userID string, req Request, nextBatch string) (Response, error) {
	var out Response
	c := req.SearchCategories.RoomEvents
	if c == nil {
		return out, nil // no category asked for: nothing to search
	}
	if c.SearchTerm == nil || strings.TrimSpace(*c.SearchTerm) == "" {
		return out, mxerr.BadJSON("search_categories.room_events.search_term is required")
	}
	keys := c.Keys
	if len(keys) == 0 {
		keys = searchKeys
	}
	for _, k := range keys {
		if !slices.Contains(searchKeys, k) {
			return out, mxerr.BadJSON("keys must be among %s", strings.Join(searchKeys, ", "))
		}
	}
	switch c.OrderBy {
	case "", "rank", "recent":
	default:
		return out, mxerr.BadJSON("order_by must be rank or recent")
	}
	byRank := c.OrderBy != "recent"
	for _, g := range c.Groupings.GroupBy {
		if g.Key != "room_id" && g.Key != "sender" {
			return out, mxerr.BadJSON("groupings may be by room_id or sender")
		}
	}
	f := c.Filter
	if f == nil {
		f = &Filter{}
	}
	limit := defaultLimit
	if f.Limit != nil {
		if *f.Limit < 0 {
			return out, mxerr.BadJSON("filter.limit must not be negative")
		}
		limit = min(*f.Limit, maxLimit)
	}
	before, after := defaultContextLimit, defaultContextLimit
	if e := c.EventContext; e != nil {
		if e.BeforeLimit != nil {
			before = *e.BeforeLimit
		}
		if e.AfterLimit != nil {
			after = *e.AfterLimit
		}
		if before < 0 || after < 0 {
			return out, mxerr.BadJSON("event_context limits must not be negative")
		}
		before, after = min(before, maxContextLimit), min(after, maxContextLimit)
	}
	q := storage.SearchQuery{Words: Words(*c.SearchTerm), Keys: keys, ByRank: byRank,
		Senders: f.Senders, NotSenders: f.NotSenders, Types: f.Types, NotTypes: f.NotTypes}
	if nextBatch != "" {
		var err error
		if q.Offset, q.Before, err = parseBatch(nextBatch, byRank); err != nil {
			return out, err
		}
	}

	joined, err := s.rooms.JoinedRooms(ctx, userID)
	if err != nil {
		return out, err
	}
	for _, r := range joined {
		if (len(f.Rooms) == 0 || slices.Contains(f.Rooms, r)) && !slices.Contains(f.NotRooms, r) {
			q.Rooms = append(q.Rooms, r)
		}
	}
	res := &RoomEventsResult{Highlights: q.Words, Results: []Result{}}
	out.SearchCategories.RoomEvents = res
	if len(q.Words) == 0 || len(q.Rooms) == 0 || limit == 0 {
		return out, nil
	}
	if err := s.catchUp(ctx); err != nil {
		return out, err
	}

	// Results the user may not see are skipped: ask for a page more than
	// needed, and go on while a page is used up by them.
	var page []storage.SearchHit
	for {
		q.Limit = limit + 1
		hits, total, err := s.db.SearchRoomEvents(ctx, q)
		if err != nil {
			return out, err
		}
		res.Count = total
		more := len(hits) > limit
		i := 0
		for ; i < len(hits) && len(page) < limit; i++ {
			h := hits[i]
			q.Offset++
			q.Before = h.Pos
			ev, err := s.rooms.VisibleEvent(ctx, userID, h.RoomID, h.EventID)
			if err != nil || !hasKey(ev, keys) {
				continue // not the user's to see, or redacted since it was indexed
			}
			page = append(page, h)
			res.Results = append(res.Results, Result{Rank: h.Rank, Result: ev})
		}
		if len(page) == limit {
			if i < len(hits) || more {
				res.NextBatch = batchToken(q, byRank)
			}
			break
		}
		if !more {
			break
		}
	}

	if c.EventContext != nil {
		for i, h := range page {
			ec, err := s.rooms.EventContext(ctx, userID, h.RoomID, h.EventID, before, after)
			if err != nil {
				return out, err
			}
			rc := &Context{Start: ec.Start, End: ec.End, EventsBefore: nonNil(ec.EventsBefore), EventsAfter: nonNil(ec.EventsAfter)}
			if c.EventContext.IncludeProfile {
				rc.ProfileInfo = profiles(ec.Members, h.Sender, ec.EventsBefore, ec.EventsAfter)
			}
			res.Results[i].Context = rc
		}
	}
	for _, g := range c.Groupings.GroupBy {
		if res.Groups == nil {
			res.Groups = map[string]map[string]*Group{}
		}
		groups := map[string]*Group{}
		for _, h := range page {
			k := h.RoomID
			if g.Key == "sender" {
				k = h.Sender
			}
			if groups[k] == nil {
				groups[k] = &Group{Order: len(groups), Results: []string{}, NextBatch: res.NextBatch}
			}
			groups[k].Results = append(groups[k].Results, h.EventID)
		}
		res.Groups[g.Key] = groups
	}
	return out, nil
}

// catchUp brings the index up to date with the events stored so far.
func (s *Service) catchUp(ctx context.Context) error {
	for {
		n, err := s.db.IndexRoomEvents(ctx, indexBatch)
		if err != nil || n < indexBatch {
			return err
		}
	}
}

// Words are the words of a search term, lower case, as the index splits
// text: letters, digits and underscores; at most maxWords.
func Words(term string) []string {
	var out []string
	for _, w := range strings.FieldsFunc(strings.ToLower(term), func(r rune) bool {
		return r != '_' && !unicode.IsLetter(r) && !unicode.IsDigit(r)
	}) {
		if !slices.Contains(out, w) {
			out = append(out, w)
		}
		if len(out) == maxWords {
			break
		}
	}
	return out
}

// batchToken is next_batch: "o<offset>" ranked, "p<pos>" newest first.
func batchToken(q storage.SearchQuery, byRank bool) string {
	if byRank {
		return "o" + strconv.Itoa(q.Offset)
	}
	return "p" + strconv.FormatInt(int64(q.Before), 10)
}

func parseBatch(tok string, byRank bool) (int, storage.StreamPos, error) {
	bad := mxerr.InvalidParam("next_batch %q is not a token of this search", tok)
	if len(tok) < 2 {
		return 0, 0, bad
	}
	n, err := strconv.ParseInt(tok[1:], 10, 64)
	if err != nil || n < 0 {
		return 0, 0, bad
	}
	switch {
	case tok[0] == 'o' && byRank:
		return int(min(n, 1<<20)), 0, nil
	case tok[0] == 'p' && !byRank:
		return 0, storage.StreamPos(n), nil
	}
	return 0, 0, bad
}

// hasKey reports whether a client event still has text at one of keys
// (a redacted event has none).
func hasKey(ev json.RawMessage, keys []string) bool {
	var e struct {
		Content map[string]json.RawMessage `json:"content"`
	}
	if json.Unmarshal(ev, &e) != nil {
		return false
	}
	for _, k := range keys {
		var v string
		if json.Unmarshal(e.Content[strings.TrimPrefix(k, "content.")], &v) == nil && v != "" {
			return true
		}
	}
	return false
}

// profiles are the display names and avatars of the senders of a result
// and the events around it, from the member events there.
func profiles(members map[string]json.RawMessage, sender string, around ...[]json.RawMessage) map[string]map[string]any {
	senders := []string{sender}
	for _, evs := range around {
		for _, raw := range evs {
			var e struct {
				Sender string `json:"sender"`
			}
			if json.Unmarshal(raw, &e) == nil && e.Sender != "" && !slices.Contains(senders, e.Sender) {
				senders = append(senders, e.Sender)
			}
		}
	}
	out := map[string]map[string]any{}
	for _, u := range senders {
		var m struct {
			Content struct {
				DisplayName *string `json:"displayname"`
				AvatarURL   *string `json:"avatar_url"`
			} `json:"content"`
		}
		p := map[string]any{}
		if raw, ok := members[u]; ok && json.Unmarshal(raw, &m) == nil {
			if m.Content.DisplayName != nil {
				p["displayname"] = *m.Content.DisplayName
			}
			if m.Content.AvatarURL != nil {
				p["avatar_url"] = *m.Content.AvatarURL
			}
		}
		out[u] = p
	}
	return out
}

func nonNil(evs []json.RawMessage) []json.RawMessage {
	if evs == nil {
		return []json.RawMessage{}
	}
	return evs
}
