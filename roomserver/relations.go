package roomserver

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strconv"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/streamtoken"
	"github.com/keyserver/keyserver/storage"
)

// Relations between events (package relations): GET /relations and
// /threads, and the aggregations bundled in unsigned m.relations of the
// events /sync, /messages, /event and /context show.

// Relations is what rooms read of the relations between events.
type Relations interface {
	RelatedEvents(ctx context.Context, q storage.RelationsQuery) ([]storage.RoomEvent, error)
	Threads(ctx context.Context, q storage.ThreadsQuery) ([]storage.Thread, error)
	Aggregations(ctx context.Context, userID string, evs []storage.RoomEvent) (map[string]storage.Aggregations, error)
}

// RelationsRequest is a GET /relations request as the client sent it.
type RelationsRequest struct {
	UserID, RoomID, EventID string
	RelType, EventType      string // "" when not in the path
	From, To                string // tokens; "" when not given
	Dir                     string // "b" (default) or "f"
	Limit                   string // "" for the default
	Recurse                 string // "true", "false" or ""
}

// RelationsResponse is the answer to /relations.
type RelationsResponse struct {
	Chunk          []ClientEvent `json:"chunk"`
	NextBatch      string        `json:"next_batch,omitempty"`
	PrevBatch      string        `json:"prev_batch,omitempty"`
	RecursionDepth *int          `json:"recursion_depth,omitempty"`
}

// DefaultRelationsLimit and MaxRelationsLimit bound a page of /relations
// and /threads (Synapse's default).
const (
	DefaultRelationsLimit = 5
	MaxRelationsLimit     = 1000
)

// RecursionDepth is how many relations away /relations with recurse
// follows them (the specification asks for at least 3).
const RecursionDepth = 3

func (s *Service) relations() (Relations, error) {
	if s.opts.Relations == nil {
		return nil, mxerr.New(404, "M_UNRECOGNIZED", "relations are not served")
	}
	return s.opts.Relations, nil
}

// Relations answers /relations: the events related to one the user may
// see (404 otherwise, as for one that does not exist), those the user may
// see of them, ordered by stream position as /messages pages, with
// tokens /messages and /sync hand out.
func (s *Service) Relations(ctx context.Context, req RelationsRequest) (RelationsResponse, error) {
	rel, err := s.relations()
	if err != nil {
		return RelationsResponse{}, err
	}
	forward := false
	switch req.Dir {
	case "", "b":
	case "f":
		forward = true
	default:
		return RelationsResponse{}, mxerr.InvalidParam("dir must be b or f")
	}
	limit := DefaultRelationsLimit
	if req.Limit != "" {
		n, err := strconv.Atoi(req.Limit)
		if err != nil || n < 0 {
			return RelationsResponse{}, mxerr.InvalidParam("limit must be a non-negative integer")
		}
		limit = min(max(n, 1), MaxRelationsLimit)
	}
	depth := 1
	switch req.Recurse {
	case "", "false":
	case "true":
		depth = RecursionDepth
	default:
		return RelationsResponse{}, mxerr.InvalidParam("recurse must be true or false")
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
			return RelationsResponse{}, err
		}
		*t.pos = &p
	}
	r, _, err := s.userReadableEvent(ctx, req.UserID, req.RoomID, req.EventID)
	if err != nil {
		return RelationsResponse{}, err
	}
	q := storage.RelationsQuery{RoomID: req.RoomID, ParentID: req.EventID, RelType: req.RelType, EventType: req.EventType,
		Depth: depth, After: math.MinInt64, UpTo: r.upTo, Forward: forward, Limit: limit + 1}
	if forward {
		if from != nil {
			q.After = *from
		}
		if to != nil {
			q.UpTo = min(q.UpTo, *to)
		}
	} else {
		if from != nil {
			q.UpTo = min(q.UpTo, *from)
		}
		if to != nil {
			q.After = *to
		}
	}
	page, err := rel.RelatedEvents(ctx, q)
	if err != nil {
		return RelationsResponse{}, err
	}
	out := RelationsResponse{Chunk: []ClientEvent{}}
	if len(page) > limit {
		page = page[:limit]
		if last := page[len(page)-1].Pos; forward {
			out.NextBatch = streamtoken.FormatPage(last)
		} else {
			out.NextBatch = streamtoken.FormatPage(last - 1)
		}
	}
	if from != nil {
		out.PrevBatch = streamtoken.FormatPage(*from)
	}
	if req.Recurse != "" {
		// Given recurse, the answer says how deep it went (1: direct
		// relations only), as the specification asks.
		out.RecursionDepth = &depth
	}
	if page, err = s.visibleEvents(ctx, r.viewer, page); err != nil {
		return RelationsResponse{}, err
	}
	if out.Chunk, err = s.bundledEvents(ctx, req.UserID, page); err != nil {
		return RelationsResponse{}, err
	}
	return out, nil
}

// userReadableEvent returns an event of a room the user may see, with their
// access to the room's history; 404 for one they may not, as for one that
// does not exist.
func (s *Service) userReadableEvent(ctx context.Context, userID, roomID, eventID string) (reader, storage.RoomEvent, error) {
	r, err := s.historyReader(ctx, userID, roomID)
	if err != nil {
		return reader{}, storage.RoomEvent{}, err
	}
	ev, err := s.db.RoomEvent(ctx, eventID)
	if errors.Is(err, storage.ErrNotFound) || err == nil && (ev.RoomID != roomID || ev.Pos == 0 || ev.Pos > r.upTo || ev.Rejected || ev.SoftFailed) {
		return reader{}, storage.RoomEvent{}, mxerr.NotFound("unknown event %s", eventID)
	} else if err != nil {
		return reader{}, storage.RoomEvent{}, err
	}
	if ok, err := s.visible(ctx, r.viewer, ev); err != nil {
		return reader{}, storage.RoomEvent{}, err
	} else if !ok {
		return reader{}, storage.RoomEvent{}, mxerr.NotFound("unknown event %s", eventID)
	}
	return r, ev, nil
}

// ThreadsRequest is a GET /threads request as the client sent it.
type ThreadsRequest struct {
	UserID, RoomID string
	Include        string // "all" (default) or "participated"
	From           string // a next_batch token; "" for the start
	Limit          string // "" for the default
}

// ThreadsResponse is the answer to /threads: thread roots, the most
// recently active thread first, each with its m.thread aggregation.
type ThreadsResponse struct {
	Chunk     []ClientEvent `json:"chunk"`
	NextBatch string        `json:"next_batch,omitempty"`
}

// Threads answers /threads: a room's threads whose roots the user may see,
// ordered by their latest reply, the newest first.
func (s *Service) Threads(ctx context.Context, req ThreadsRequest) (ThreadsResponse, error) {
	rel, err := s.relations()
	if err != nil {
		return ThreadsResponse{}, err
	}
	q := storage.ThreadsQuery{RoomID: req.RoomID, Before: math.MaxInt64, Limit: DefaultRelationsLimit}
	switch req.Include {
	case "", "all":
	case "participated":
		q.Participant = req.UserID
	default:
		return ThreadsResponse{}, mxerr.InvalidParam("include must be all or participated")
	}
	if req.Limit != "" {
		n, err := strconv.Atoi(req.Limit)
		if err != nil || n < 0 {
			return ThreadsResponse{}, mxerr.InvalidParam("limit must be a non-negative integer")
		}
		q.Limit = min(max(n, 1), MaxRelationsLimit)
	}
	if req.From != "" {
		p, err := streamtoken.ParsePage("from", req.From)
		if err != nil {
			return ThreadsResponse{}, err
		}
		q.Before = p
	}
	r, err := s.historyReader(ctx, req.UserID, req.RoomID)
	if err != nil {
		return ThreadsResponse{}, err
	}
	if r.upTo != math.MaxInt64 {
		q.Before = min(q.Before, r.upTo+1)
	}
	limit := q.Limit
	q.Limit++
	threads, err := rel.Threads(ctx, q)
	if err != nil {
		return ThreadsResponse{}, err
	}
	out := ThreadsResponse{Chunk: []ClientEvent{}}
	if len(threads) > limit {
		threads = threads[:limit]
		out.NextBatch = streamtoken.FormatPage(threads[len(threads)-1].Latest)
	}
	ids := make([]string, 0, len(threads))
	for _, t := range threads {
		ids = append(ids, t.RootID)
	}
	stored, err := s.db.RoomEventsByID(ctx, ids)
	if err != nil {
		return ThreadsResponse{}, err
	}
	byID := map[string]storage.RoomEvent{}
	for _, ev := range stored {
		byID[ev.EventID] = ev
	}
	roots := make([]storage.RoomEvent, 0, len(ids))
	for _, id := range ids {
		if ev, ok := byID[id]; ok && ev.Pos <= r.upTo {
			roots = append(roots, ev)
		}
	}
	if roots, err = s.visibleEvents(ctx, r.viewer, roots); err != nil {
		return ThreadsResponse{}, err
	}
	if out.Chunk, err = s.bundledEvents(ctx, req.UserID, roots); err != nil {
		return ThreadsResponse{}, err
	}
	return out, nil
}

// bundledEvents formats events for a user with their aggregations.
func (s *Service) bundledEvents(ctx context.Context, userID string, evs []storage.RoomEvent) ([]ClientEvent, error) {
	out, err := clientEvents(evs)
	if err != nil {
		return nil, err
	}
	if err := s.bundle(ctx, userID, evs, out); err != nil {
		return nil, err
	}
	return orEmpty(out), nil
}

// bundle adds to each client event of out (the events evs formatted, in
// the same order) the aggregations of its relations, as unsigned
// m.relations. Without package relations it does nothing.
func (s *Service) bundle(ctx context.Context, userID string, evs []storage.RoomEvent, out []ClientEvent) error {
	if s.opts.Relations == nil || len(evs) == 0 {
		return nil
	}
	aggs, err := s.opts.Relations.Aggregations(ctx, userID, evs)
	if err != nil || len(aggs) == 0 {
		return err
	}
	for i := range out {
		a, ok := aggs[out[i].EventID]
		if !ok {
			continue
		}
		rels, err := relationsJSON(a, aggs)
		if err != nil {
			return err
		}
		if out[i].Unsigned, err = withUnsignedField(out[i].Unsigned, "m.relations", rels); err != nil {
			return err
		}
	}
	return nil
}

// bundleOne is bundle for one event.
func (s *Service) bundleOne(ctx context.Context, userID string, ev storage.RoomEvent, out *ClientEvent) error {
	evs := []ClientEvent{*out}
	if err := s.bundle(ctx, userID, []storage.RoomEvent{ev}, evs); err != nil {
		return err
	}
	*out = evs[0]
	return nil
}

// relationsJSON is the m.relations object of an event's aggregations; a
// thread's latest reply carries its own edit (from aggs).
func relationsJSON(a storage.Aggregations, aggs map[string]storage.Aggregations) (json.RawMessage, error) {
	rels := map[string]any{}
	if th := a.Thread; th != nil && th.Latest.EventID != "" {
		p, err := pdu(th.Latest)
		if err != nil {
			return nil, err
		}
		latest := clientEvent(p)
		if la, ok := aggs[latest.EventID]; ok && la.Replace != nil {
			inner, err := relationsJSON(storage.Aggregations{Replace: la.Replace}, nil)
			if err != nil {
				return nil, err
			}
			if latest.Unsigned, err = withUnsignedField(latest.Unsigned, "m.relations", inner); err != nil {
				return nil, err
			}
		}
		rels["m.thread"] = map[string]any{"latest_event": latest, "count": th.Count, "current_user_participated": th.Participated}
	}
	if a.Replace != nil {
		p, err := pdu(*a.Replace)
		if err != nil {
			return nil, err
		}
		rels["m.replace"] = clientEvent(p)
	}
	if len(a.References) > 0 {
		chunk := make([]map[string]string, 0, len(a.References))
		for _, id := range a.References {
			chunk = append(chunk, map[string]string{"event_id": id})
		}
		rels["m.reference"] = map[string]any{"chunk": chunk}
	}
	return json.Marshal(rels)
}

// withUnsignedField sets one field of an event's unsigned object.
func withUnsignedField(unsigned json.RawMessage, field string, value json.RawMessage) (json.RawMessage, error) {
	fields := map[string]json.RawMessage{}
	if len(unsigned) > 0 {
		if err := json.Unmarshal(unsigned, &fields); err != nil {
			return nil, err
		}
	}
	fields[field] = value
	return json.Marshal(fields)
}
