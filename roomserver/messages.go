package roomserver

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/streamtoken"
	"github.com/keyserver/keyserver/storage"
)

// GET /rooms/{roomId}/messages: a room's history, a page at a time, from a
// stream token (a /sync prev_batch or an earlier page's end) backwards or
// forwards. Pages are read by stream position, the order /sync shows
// events in, so paging back from prev_batch continues the timeline /sync
// gave without a gap or a repeat.

// MessagesRequest is a /messages request as the client sent it.
type MessagesRequest struct {
	UserID, RoomID string
	From, To       string // tokens; "" when not given
	Dir            string // "b" or "f"
	Limit          string // "" for the default
	Filter         string // a RoomEventFilter as JSON; "" for none
}

// MessagesResponse is the answer to /messages.
type MessagesResponse struct {
	Start string        `json:"start"`
	End   string        `json:"end,omitempty"`
	Chunk []ClientEvent `json:"chunk"`
	// State holds, with a filter's lazy_load_members, the member events
	// of the chunk's senders (lazymembers.go).
	State []ClientEvent `json:"state,omitempty"`
}

// DefaultMessagesLimit and MaxMessagesLimit bound a page.
const (
	DefaultMessagesLimit = 10
	MaxMessagesLimit     = 1000
)

// messagesScans bounds how many pages of the database one request reads
// to fill its page when the filter or history visibility hide events: a
// client paging through a long stretch it cannot see gets short pages
// with an end token rather than one request that reads the whole room.
const messagesScans = 5

// maxMessagesBackfills bounds the backfills one /messages request makes.
const maxMessagesBackfills = 2

// RoomEventFilter is the part of a room event filter /messages, /context
// and /sync timelines apply;
// other fields are accepted and ignored. In types and not_types a "*"
// matches any run of characters.
type RoomEventFilter struct {
	Types       *[]string `json:"types"`
	NotTypes    []string  `json:"not_types"`
	Senders     *[]string `json:"senders"`
	NotSenders  []string  `json:"not_senders"`
	ContainsURL *bool     `json:"contains_url"`
	// LazyLoadMembers asks /messages for the member events of the
	// senders of its chunk (in /sync it is read from the state filter,
	// StateFilter).
	LazyLoadMembers bool `json:"lazy_load_members"`
}

// active reports whether the filter leaves any event out.
func (f RoomEventFilter) active() bool {
	return f.Types != nil || len(f.NotTypes) > 0 || f.Senders != nil || len(f.NotSenders) > 0 || f.ContainsURL != nil
}

// matches reports whether an event passes the filter.
func (f RoomEventFilter) matches(ev storage.RoomEvent) bool {
	if f.Types != nil && !anyTypeMatches(*f.Types, ev.Type) {
		return false
	}
	if anyTypeMatches(f.NotTypes, ev.Type) {
		return false
	}
	if f.Senders != nil && !slices.Contains(*f.Senders, ev.Sender) {
		return false
	}
	if slices.Contains(f.NotSenders, ev.Sender) {
		return false
	}
	if f.ContainsURL != nil {
		var content struct {
			Content map[string]json.RawMessage `json:"content"`
		}
		_ = json.Unmarshal(ev.JSON, &content)
		if _, hasURL := content.Content["url"]; hasURL != *f.ContainsURL {
			return false
		}
	}
	return true
}

func anyTypeMatches(patterns []string, evType string) bool {
	for _, p := range patterns {
		if typeMatches(p, evType) {
			return true
		}
	}
	return false
}

// typeMatches matches an event type against a pattern in which "*"
// stands for any run of characters.
func typeMatches(pattern, s string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == s
	}
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return strings.HasSuffix(s, last)
}

// reader is a user's access to a room's history: who they are for
// history visibility, and the last position they may read (their leave,
// for one who left).
type reader struct {
	viewer
	upTo storage.StreamPos
}

// historyReader checks that the user may read the room's history: a
// member, one who left or was removed (up to that point), or anyone when
// the room is world readable.
func (s *Service) historyReader(ctx context.Context, userID, roomID string) (reader, error) {
	if _, err := s.db.Room(ctx, roomID); errors.Is(err, storage.ErrNotFound) {
		return reader{}, errNoRoom(roomID)
	} else if err != nil {
		return reader{}, err
	}
	state, err := s.db.RoomStateEvents(ctx, roomID, []storage.StateKey{{Type: spec.MRoomMember, StateKey: userID}, historyKey})
	if err != nil {
		return reader{}, err
	}
	r := reader{viewer: viewer{userID: userID}, upTo: math.MaxInt64}
	var member *storage.RoomEvent
	setting := historyShared
	for i, ev := range state {
		if ev.Type == spec.MRoomMember {
			member = &state[i]
		} else {
			setting = historySetting(eventContentField(ev.JSON, "history_visibility"))
		}
	}
	switch {
	case member != nil && member.Membership == spec.Join:
		r.joinedNow = true
	case member != nil && (member.Membership == spec.Leave || member.Membership == spec.Ban) && member.Pos > 0:
		r.upTo = member.Pos
	case setting == historyWorldReadable:
	default:
		return reader{}, mxerr.Forbidden("you are not in room %s", roomID)
	}
	return r, nil
}

// Messages answers /messages.
func (s *Service) Messages(ctx context.Context, req MessagesRequest) (MessagesResponse, error) {
	backward := req.Dir == "b"
	switch req.Dir {
	case "b", "f":
	case "":
		return MessagesResponse{}, mxerr.MissingParam("dir is required")
	default:
		return MessagesResponse{}, mxerr.InvalidParam("dir must be b or f")
	}
	limit, filter, err := pageParams(req.Limit, req.Filter, DefaultMessagesLimit, MaxMessagesLimit)
	if err != nil {
		return MessagesResponse{}, err
	}
	var from, to *storage.StreamPos
	for _, t := range []struct {
		param, tok string
		pos        **storage.StreamPos
	}{{"from", req.From, &from}, {"to", req.To, &to}} {
		if t.tok == "" {
			continue
		}
		p, err := streamtoken.ParsePage(t.param, t.tok)
		if err != nil {
			return MessagesResponse{}, err
		}
		*t.pos = &p
	}
	r, err := s.historyReader(ctx, req.UserID, req.RoomID)
	if err != nil {
		return MessagesResponse{}, err
	}
	// The range (low, high] to read, and where the page starts.
	var low, high, start storage.StreamPos
	if backward {
		if from == nil {
			cur, err := s.db.CurrentPos(ctx)
			if err != nil {
				return MessagesResponse{}, err
			}
			from = &cur
		}
		start, high = *from, min(*from, r.upTo)
		low = math.MinInt64 // history backfilled lies below 0
		if to != nil {
			low = *to
		}
	} else {
		if from != nil {
			start = *from
		}
		low, high = start, r.upTo
		if to != nil {
			high = min(high, *to)
		}
	}
	out := MessagesResponse{Start: streamtoken.FormatPage(start), Chunk: []ClientEvent{}}
	// Paging back past the room's first event here, without a to token,
	// asks the room's servers for the history before it (backfill.go),
	// at most maxMessagesBackfills times a request.
	backfills, backfilled := 0, false
	if !backward || to != nil {
		backfills = maxMessagesBackfills
	}
	for scan := 0; scan < messagesScans && low < high; scan++ {
		want := limit - len(out.Chunk)
		page, err := s.db.RoomMessages(ctx, req.RoomID, low, high, want, !backward)
		if err != nil {
			return MessagesResponse{}, err
		}
		var keep []storage.RoomEvent
		for _, ev := range page {
			if filter.matches(ev) {
				keep = append(keep, ev)
			}
		}
		if keep, err = s.visibleEvents(ctx, r.viewer, keep); err != nil {
			return MessagesResponse{}, err
		}
		evs, err := clientEvents(keep)
		if err != nil {
			return MessagesResponse{}, err
		}
		out.Chunk = append(out.Chunk, evs...)
		if len(page) > 0 {
			if last := page[len(page)-1].Pos; backward {
				high = last - 1
			} else {
				low = last
			}
		}
		if len(page) < want {
			// The range is read to its end; backwards, the history
			// before it may be had from the room's servers.
			if backfills < maxMessagesBackfills {
				backfills++
				n, err := s.backfill(ctx, req.RoomID, limit)
				if err != nil {
					return MessagesResponse{}, err
				}
				if backfilled = n > 0; backfilled {
					out.End = streamtoken.FormatPage(high) // it lies below what was read
					continue
				}
			}
			if !backfilled {
				out.End = ""
			}
			break
		}
		// More may follow what this page read.
		if backward {
			out.End = streamtoken.FormatPage(high)
		} else {
			out.End = streamtoken.FormatPage(low)
		}
		if len(out.Chunk) >= limit {
			break
		}
	}
	if filter.LazyLoadMembers {
		if out.State, err = s.chunkMembers(ctx, out.Chunk); err != nil {
			return MessagesResponse{}, err
		}
	}
	return out, nil
}

// pageParams reads the limit (a non-negative integer; none or 0: def,
// capped at most) and the room event filter of /messages and /context.
func pageParams(limitParam, filterParam string, def, most int) (int, RoomEventFilter, error) {
	var filter RoomEventFilter
	limit := def
	if limitParam != "" {
		n, err := strconv.Atoi(limitParam)
		if err != nil || n < 0 {
			return 0, filter, mxerr.InvalidParam("limit must be a non-negative integer")
		}
		if n > 0 {
			limit = min(n, most)
		}
	}
	if filterParam != "" {
		if err := json.Unmarshal([]byte(filterParam), &filter); err != nil {
			return 0, filter, mxerr.InvalidParam("filter is not a valid room event filter: %v", err)
		}
	}
	return limit, filter, nil
}

// GET /rooms/{roomId}/context/{eventId}: an event with the events around
// it, as a client shows a permalink, and tokens to page on from there
// with /messages.

// ContextRequest is a /context request as the client sent it.
type ContextRequest struct {
	UserID, RoomID, EventID string
	Limit                   string // "" for the default
	Filter                  string // a RoomEventFilter as JSON; "" for none
	// Before and After, when set, are how many events to read on each
	// side instead of Limit split in two (the context of a search).
	Before, After *int
}

// ContextResponse is the answer to /context: events_before newest first,
// events_after oldest first, and the room's state after the last event
// returned.
type ContextResponse struct {
	Start        string        `json:"start"`
	End          string        `json:"end"`
	EventsBefore []ClientEvent `json:"events_before"`
	Event        ClientEvent   `json:"event"`
	EventsAfter  []ClientEvent `json:"events_after"`
	State        []ClientEvent `json:"state"`
}

// DefaultContextLimit and MaxContextLimit bound the events around.
const (
	DefaultContextLimit = 10
	MaxContextLimit     = 100
)

// Context answers /context: limit events split between before (half,
// rounded down) and after, the filter and history visibility applied to
// them; an event the user may not see is 404, as one that does not exist.
func (s *Service) Context(ctx context.Context, req ContextRequest) (ContextResponse, error) {
	limit, filter, err := pageParams(req.Limit, req.Filter, DefaultContextLimit, MaxContextLimit)
	if err != nil {
		return ContextResponse{}, err
	}
	r, err := s.historyReader(ctx, req.UserID, req.RoomID)
	if err != nil {
		return ContextResponse{}, err
	}
	ev, err := s.db.RoomEvent(ctx, req.EventID)
	if errors.Is(err, storage.ErrNotFound) || err == nil && (ev.RoomID != req.RoomID || ev.Pos == 0 || ev.Pos > r.upTo || ev.SoftFailed) {
		return ContextResponse{}, mxerr.NotFound("unknown event %s", req.EventID)
	} else if err != nil {
		return ContextResponse{}, err
	}
	if ok, err := s.visible(ctx, r.viewer, ev); err != nil {
		return ContextResponse{}, err
	} else if !ok {
		return ContextResponse{}, mxerr.NotFound("unknown event %s", req.EventID)
	}
	out := ContextResponse{Start: streamtoken.FormatPage(ev.Pos - 1), End: streamtoken.FormatPage(ev.Pos)}
	// around reads up to n events on one side and keeps those the filter
	// and visibility let through; the token moves past all it read.
	around := func(low, high storage.StreamPos, n int, forward bool) ([]ClientEvent, *storage.StreamPos, error) {
		if n == 0 || low >= high {
			return []ClientEvent{}, nil, nil
		}
		page, err := s.db.RoomMessages(ctx, req.RoomID, low, high, n, forward)
		if err != nil || len(page) == 0 {
			return []ClientEvent{}, nil, err
		}
		var keep []storage.RoomEvent
		for _, e := range page {
			if filter.matches(e) {
				keep = append(keep, e)
			}
		}
		if keep, err = s.visibleEvents(ctx, r.viewer, keep); err != nil {
			return nil, nil, err
		}
		evs, err := clientEvents(keep)
		last := page[len(page)-1].Pos
		return orEmpty(evs), &last, err
	}
	nBefore, nAfter := limit/2, limit-limit/2
	if req.Before != nil && req.After != nil {
		nBefore, nAfter = *req.Before, *req.After
	}
	before, oldest, err := around(math.MinInt64, ev.Pos-1, nBefore, false)
	if err != nil {
		return ContextResponse{}, err
	}
	after, newest, err := around(ev.Pos, r.upTo, nAfter, true)
	if err != nil {
		return ContextResponse{}, err
	}
	if oldest != nil {
		out.Start = streamtoken.FormatPage(*oldest - 1)
	}
	last := ev.Pos
	if newest != nil {
		out.End, last = streamtoken.FormatPage(*newest), *newest
	}
	p, err := pdu(ev)
	if err != nil {
		return ContextResponse{}, err
	}
	out.Event, out.EventsBefore, out.EventsAfter = clientEvent(p), before, after
	if out.State, err = s.stateAfter(ctx, req.RoomID, last); err != nil {
		return ContextResponse{}, err
	}
	out.State = orEmpty(out.State)
	return out, nil
}
