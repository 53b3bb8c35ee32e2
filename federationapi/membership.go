package federationapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"

	"github.com/gorilla/mux"

	"github.com/keyserver/keyserver/internal/httpx"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/roomserver"
)

// RoomMembership is the rooms' side of the membership handshakes
// (package roomserver).
type RoomMembership interface {
	MakeJoin(ctx context.Context, origin, roomID, userID string, versions []string) (roomserver.Template, error)
	SendJoin(ctx context.Context, origin, roomID, eventID string, raw json.RawMessage) (roomserver.SendJoinAnswer, error)
	MakeLeave(ctx context.Context, origin, roomID, userID string) (roomserver.Template, error)
	SendLeave(ctx context.Context, origin, roomID, eventID string, raw json.RawMessage) error
	ReceiveInvite(ctx context.Context, origin, roomID, eventID string, req roomserver.InviteRequest) (json.RawMessage, error)
}

func (a *api) membershipRoutes(r *mux.Router) {
	if a.opts.Membership == nil {
		return
	}
	r.Handle("/_matrix/federation/v1/make_join/{roomId}/{userId}", a.authed(a.makeJoin)).Methods(http.MethodGet)
	r.Handle("/_matrix/federation/v2/send_join/{roomId}/{eventId}", a.authed(a.sendJoin)).Methods(http.MethodPut)
	r.Handle("/_matrix/federation/v1/make_leave/{roomId}/{userId}", a.authed(a.makeLeave)).Methods(http.MethodGet)
	r.Handle("/_matrix/federation/v2/send_leave/{roomId}/{eventId}", a.authed(a.sendLeave)).Methods(http.MethodPut)
	// The v1 handshakes, which older servers still use: the same, with
	// the answer in the array [200, answer] the first versions specified.
	r.Handle("/_matrix/federation/v1/send_join/{roomId}/{eventId}", a.authed(v1Answer(a.sendJoin))).Methods(http.MethodPut)
	r.Handle("/_matrix/federation/v1/send_leave/{roomId}/{eventId}", a.authed(v1Answer(a.sendLeave))).Methods(http.MethodPut)
	r.Handle("/_matrix/federation/v2/invite/{roomId}/{eventId}", a.authed(a.invite)).Methods(http.MethodPut)
	a.knockRoutes(r)
}

// v1Answer wraps a handshake's answer as v1 sends it: [200, answer].
func v1Answer(h handler) handler {
	return func(r request) (any, error) {
		out, err := h(r)
		if err != nil {
			return nil, err
		}
		return []any{http.StatusOK, out}, nil
	}
}

// pathVars returns the named path variables, decoded.
func pathVars(r request, names ...string) ([]string, error) {
	out := make([]string, len(names))
	for i, n := range names {
		v, err := url.PathUnescape(mux.Vars(r.Request)[n])
		if err != nil || v == "" || httpx.CleanParam(n, v) != nil {
			return nil, mxerr.InvalidParam("bad %s in the path", n)
		}
		out[i] = v
	}
	return out, nil
}

func (a *api) makeJoin(r request) (any, error) {
	v, err := pathVars(r, "roomId", "userId")
	if err != nil {
		return nil, err
	}
	return a.opts.Membership.MakeJoin(r.Context(), r.origin, v[0], v[1], r.URL.Query()["ver"])
}

func (a *api) sendJoin(r request) (any, error) {
	v, err := pathVars(r, "roomId", "eventId")
	if err != nil {
		return nil, err
	}
	return a.opts.Membership.SendJoin(r.Context(), r.origin, v[0], v[1], r.content)
}

func (a *api) makeLeave(r request) (any, error) {
	v, err := pathVars(r, "roomId", "userId")
	if err != nil {
		return nil, err
	}
	return a.opts.Membership.MakeLeave(r.Context(), r.origin, v[0], v[1])
}

func (a *api) sendLeave(r request) (any, error) {
	v, err := pathVars(r, "roomId", "eventId")
	if err != nil {
		return nil, err
	}
	return struct{}{}, a.opts.Membership.SendLeave(r.Context(), r.origin, v[0], v[1], r.content)
}

func (a *api) invite(r request) (any, error) {
	v, err := pathVars(r, "roomId", "eventId")
	if err != nil {
		return nil, err
	}
	var req roomserver.InviteRequest
	if err := httpx.Decode(r.content, &req, false); err != nil {
		return nil, err
	}
	if req.RoomVersion == "" || len(req.Event) == 0 {
		return nil, mxerr.BadJSON("room_version and event are required")
	}
	ev, err := a.opts.Membership.ReceiveInvite(r.Context(), r.origin, v[0], v[1], req)
	if err != nil {
		return nil, err
	}
	return map[string]json.RawMessage{"event": ev}, nil
}
