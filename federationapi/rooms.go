package federationapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"

	"github.com/gorilla/mux"

	"github.com/keyserver/keyserver/internal/httpx"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/roomserver"
)

// Rooms is what other servers read of the rooms (package roomserver):
// each call names the requesting server, which the rooms check may read.
type Rooms interface {
	FederationEvent(ctx context.Context, origin, eventID string) (json.RawMessage, error)
	FederationStateIDs(ctx context.Context, origin, roomID, eventID string) (roomserver.StateIDsResponse, error)
	FederationState(ctx context.Context, origin, roomID, eventID string) (roomserver.StateResponse, error)
	FederationEventAuth(ctx context.Context, origin, roomID, eventID string) ([]json.RawMessage, error)
	FederationMissingEvents(ctx context.Context, origin, roomID string, req roomserver.MissingEventsRequest) ([]json.RawMessage, error)
	FederationBackfill(ctx context.Context, origin, roomID string, from []string, limit int) ([]json.RawMessage, error)
	FederationQueryAlias(ctx context.Context, alias string) (roomserver.AliasResponse, error)
}

// roomRoutes serves the room reads, when there are rooms.
func (a *api) roomRoutes(r *mux.Router) {
	if a.opts.Rooms == nil {
		return
	}
	const v1 = "/_matrix/federation/v1"
	r.Handle(v1+"/event/{eventId}", a.authed(a.event)).Methods(http.MethodGet)
	r.Handle(v1+"/state_ids/{roomId}", a.authed(a.stateIDs)).Methods(http.MethodGet)
	r.Handle(v1+"/state/{roomId}", a.authed(a.state)).Methods(http.MethodGet)
	r.Handle(v1+"/event_auth/{roomId}/{eventId}", a.authed(a.eventAuth)).Methods(http.MethodGet)
	r.Handle(v1+"/get_missing_events/{roomId}", a.authed(a.missingEvents)).Methods(http.MethodPost)
	r.Handle(v1+"/backfill/{roomId}", a.authed(a.backfill)).Methods(http.MethodGet)
	r.Handle(v1+"/query/directory", a.authed(a.queryDirectory)).Methods(http.MethodGet)
}

// pathVar returns a percent-decoded path variable.
func pathVar(r request, name string) (string, error) {
	v, err := url.PathUnescape(mux.Vars(r.Request)[name])
	if err != nil {
		return "", mxerr.InvalidParam("bad percent-encoding in %s", name)
	}
	return v, httpx.CleanParam(name, v)
}

// queryParam returns a required query parameter.
func queryParam(r request, name string) (string, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return "", mxerr.MissingParam("the %s parameter is required", name)
	}
	return v, httpx.CleanParam(name, v)
}

// pdusAnswer is the answer of /event and /backfill.
func (a *api) pdusAnswer(pdus []json.RawMessage) map[string]any {
	return map[string]any{"origin": a.opts.ServerName, "origin_server_ts": a.opts.Now().UnixMilli(), "pdus": pdus}
}

func (a *api) event(r request) (any, error) {
	eventID, err := pathVar(r, "eventId")
	if err != nil {
		return nil, err
	}
	ev, err := a.opts.Rooms.FederationEvent(r.Context(), r.origin, eventID)
	if err != nil {
		return nil, err
	}
	return a.pdusAnswer([]json.RawMessage{ev}), nil
}

// roomAndEvent reads the room from the path and event_id from the query.
func roomAndEvent(r request) (string, string, error) {
	roomID, err := pathVar(r, "roomId")
	if err != nil {
		return "", "", err
	}
	eventID, err := queryParam(r, "event_id")
	return roomID, eventID, err
}

func (a *api) stateIDs(r request) (any, error) {
	roomID, eventID, err := roomAndEvent(r)
	if err != nil {
		return nil, err
	}
	return a.opts.Rooms.FederationStateIDs(r.Context(), r.origin, roomID, eventID)
}

func (a *api) state(r request) (any, error) {
	roomID, eventID, err := roomAndEvent(r)
	if err != nil {
		return nil, err
	}
	return a.opts.Rooms.FederationState(r.Context(), r.origin, roomID, eventID)
}

func (a *api) eventAuth(r request) (any, error) {
	roomID, err := pathVar(r, "roomId")
	if err != nil {
		return nil, err
	}
	eventID, err := pathVar(r, "eventId")
	if err != nil {
		return nil, err
	}
	chain, err := a.opts.Rooms.FederationEventAuth(r.Context(), r.origin, roomID, eventID)
	if err != nil {
		return nil, err
	}
	return map[string]any{"auth_chain": chain}, nil
}

func (a *api) missingEvents(r request) (any, error) {
	roomID, err := pathVar(r, "roomId")
	if err != nil {
		return nil, err
	}
	var req roomserver.MissingEventsRequest
	if err := httpx.Decode(r.content, &req, false); err != nil {
		return nil, err
	}
	evs, err := a.opts.Rooms.FederationMissingEvents(r.Context(), r.origin, roomID, req)
	if err != nil {
		return nil, err
	}
	return map[string]any{"events": evs}, nil
}

func (a *api) backfill(r request) (any, error) {
	roomID, err := pathVar(r, "roomId")
	if err != nil {
		return nil, err
	}
	from := r.URL.Query()["v"]
	if len(from) == 0 {
		return nil, mxerr.MissingParam("the v parameter is required")
	}
	for _, v := range from {
		if err := httpx.CleanParam("v", v); err != nil {
			return nil, err
		}
	}
	raw, err := queryParam(r, "limit")
	if err != nil {
		return nil, err
	}
	limit, err := strconv.Atoi(raw)
	if err != nil {
		return nil, mxerr.InvalidParam("limit must be an integer")
	}
	pdus, err := a.opts.Rooms.FederationBackfill(r.Context(), r.origin, roomID, from, limit)
	if err != nil {
		return nil, err
	}
	return a.pdusAnswer(pdus), nil
}

func (a *api) queryDirectory(r request) (any, error) {
	alias, err := queryParam(r, "room_alias")
	if err != nil {
		return nil, err
	}
	return a.opts.Rooms.FederationQueryAlias(r.Context(), alias)
}
