package federationapi

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/keyserver/keyserver/roomserver"
)

// RoomKnocks is the rooms' side of the knock handshake (package
// roomserver); served when the Membership of Options implements it.
type RoomKnocks interface {
	MakeKnock(ctx context.Context, origin, roomID, userID string, versions []string) (roomserver.Template, error)
	SendKnock(ctx context.Context, origin, roomID, eventID string, raw json.RawMessage) (roomserver.SendKnockAnswer, error)
}

func (a *api) knockRoutes(r *mux.Router) {
	knocks, ok := a.opts.Membership.(RoomKnocks)
	if !ok {
		return
	}
	r.Handle("/_matrix/federation/v1/make_knock/{roomId}/{userId}", a.authed(func(r request) (any, error) {
		v, err := pathVars(r, "roomId", "userId")
		if err != nil {
			return nil, err
		}
		return knocks.MakeKnock(r.Context(), r.origin, v[0], v[1], r.URL.Query()["ver"])
	})).Methods(http.MethodGet)
	r.Handle("/_matrix/federation/v1/send_knock/{roomId}/{eventId}", a.authed(func(r request) (any, error) {
		v, err := pathVars(r, "roomId", "eventId")
		if err != nil {
			return nil, err
		}
		return knocks.SendKnock(r.Context(), r.origin, v[0], v[1], r.content)
	})).Methods(http.MethodPut)
}
