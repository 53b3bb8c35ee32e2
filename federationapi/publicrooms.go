package federationapi

import (
	"context"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/keyserver/keyserver/internal/httpx"
	"github.com/keyserver/keyserver/publicrooms"
)

// PublicRooms answers pages of this server's public room directory
// (package publicrooms).
type PublicRooms interface {
	Local(ctx context.Context, req publicrooms.Request) (publicrooms.Response, error)
}

func (a *api) publicRoomRoutes(r *mux.Router) {
	if a.opts.PublicRooms == nil {
		return
	}
	r.Handle("/_matrix/federation/v1/publicRooms", a.authed(a.publicRooms)).Methods(http.MethodGet)
	r.Handle("/_matrix/federation/v1/publicRooms", a.authed(a.filteredPublicRooms)).Methods(http.MethodPost)
}

func (a *api) publicRooms(r request) (any, error) {
	req, err := publicrooms.RequestFromQuery(r.URL.Query())
	if err != nil {
		return nil, err
	}
	return a.opts.PublicRooms.Local(r.Context(), req)
}

func (a *api) filteredPublicRooms(r request) (any, error) {
	var req publicrooms.Request
	if err := httpx.Decode(r.content, &req, true); err != nil {
		return nil, err
	}
	return a.opts.PublicRooms.Local(r.Context(), req)
}
