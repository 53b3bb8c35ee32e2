package roomserver

import (
	"context"
	"encoding/json"
	"errors"
	"math"
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

// RoomEventFilter is the part of a room event filter /messages applies;
// other fields are accepted and ignored. In types and not_types a "*"
// matches any run of characters.
type RoomEventFilter struct {
	Types       *[]string `json:"types"`
	NotTypes    []string  `json:"not_types"`
	Senders     *[]string `json:"senders"`
	NotSenders  []string  `json:"not_senders"`
	ContainsURL *bool     `json:"contains_url"`
}

// matches reports whether an event passes the filter.
func (f RoomEventFilter) matches(ev storage.RoomEvent) bool {
	if f.Types != nil && !anyTypeMatches(*f.Types, ev.Type) {
		return false
	}
	if anyTypeMatches(f.NotTypes, ev.Type) {
		return false
	}
	if f.Senders != nil && !contains(*f.Senders, ev.Sender) {
		return false
	}
	if contains(f.NotSenders, ev.Sender) {
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

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
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
	return strings.HasSuffix(s, last) && len(s) >= len(last)
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
	limit := DefaultMessagesLimit
	if req.Limit != "" {
		n, err := parseLimit(req.Limit)
		if err != nil {
			return MessagesResponse{}, err
		}
		if n > 0 {
			limit = min(n, MaxMessagesLimit)
		}
	}
	var filter RoomEventFilter
	if req.Filter != "" {
		if err := json.Unmarshal([]byte(req.Filter), &filter); err != nil {
			return MessagesResponse{}, mxerr.InvalidParam("filter is not a valid room event filter: %v", err)
		}
	}
	var from, to *storage.StreamPos
	for _, t := range []struct {
		param, tok string
		pos        **storage.StreamPos
	}{{"from", req.From, &from}, {"to", req.To, &to}} {
		if t.tok == "" {
			continue
		}
		p, err := streamtoken.Parse(t.param, t.tok)
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
	out := MessagesResponse{Start: streamtoken.Format(start), Chunk: []ClientEvent{}}
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
		if len(page) < want {
			out.End = "" // the range is read to its end
			break
		}
		// More may follow what this page read.
		if last := page[len(page)-1].Pos; backward {
			high = last - 1
			out.End = streamtoken.Format(high)
		} else {
			low = last
			out.End = streamtoken.Format(low)
		}
		if len(out.Chunk) >= limit {
			break
		}
	}
	return out, nil
}

// parseLimit reads a non-negative integer limit.
func parseLimit(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, mxerr.InvalidParam("limit must be a non-negative integer")
	}
	return n, nil
}
