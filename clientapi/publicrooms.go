package clientapi

import (
	"net/http"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/publicrooms"
)

// publicRoomRoutes serve the public room directory: this server's list,
// read without a token as the spec allows (GET), another server's only
// for a user (it makes this server ask that server), the list with a
// filter (POST) for a user, and each room's entry.
func (a *API) publicRoomRoutes(s prefixed) {
	if a.opts.PublicRooms == nil {
		return
	}
	anyone := a.public(a.publicRooms)
	user := a.authed(func(r *http.Request, _ matrixid.Caller) (any, error) { return a.publicRooms(r) })
	s.Handle("/publicRooms", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.opts.PublicRooms.Remote(r.URL.Query().Get("server")) {
			user.ServeHTTP(w, r)
			return
		}
		anyone.ServeHTTP(w, r)
	})).Methods(http.MethodGet)
	s.Handle("/publicRooms", a.authed(a.filteredPublicRooms)).Methods(http.MethodPost)
	s.Handle("/directory/list/room/{roomId}", a.public(a.roomVisibility)).Methods(http.MethodGet)
	s.Handle("/directory/list/room/{roomId}", a.authed(a.setRoomVisibility)).Methods(http.MethodPut)
}

func (a *API) publicRooms(r *http.Request) (any, error) {
	req, err := publicrooms.RequestFromQuery(r.URL.Query())
	if err != nil {
		return nil, err
	}
	return a.opts.PublicRooms.List(r.Context(), r.URL.Query().Get("server"), req)
}

func (a *API) filteredPublicRooms(r *http.Request, _ matrixid.Caller) (any, error) {
	var req publicrooms.Request
	if err := a.decodeOptional(r, &req); err != nil {
		return nil, err
	}
	if req.Limit < 0 {
		return nil, mxerr.InvalidParam("limit must be a non-negative integer")
	}
	return a.opts.PublicRooms.List(r.Context(), r.URL.Query().Get("server"), req)
}

func (a *API) roomVisibility(r *http.Request) (any, error) {
	roomID, err := pathVar(r, "roomId")
	if err != nil {
		return nil, err
	}
	v, err := a.opts.PublicRooms.Visibility(r.Context(), roomID)
	if err != nil {
		return nil, err
	}
	return map[string]string{"visibility": v}, nil
}

func (a *API) setRoomVisibility(r *http.Request, c matrixid.Caller) (any, error) {
	roomID, err := pathVar(r, "roomId")
	if err != nil {
		return nil, err
	}
	var body struct {
		Visibility *string `json:"visibility"`
	}
	if err := a.decode(r, &body); err != nil {
		return nil, err
	}
	if body.Visibility == nil {
		return nil, mxerr.MissingParam("visibility is required")
	}
	return empty, a.opts.PublicRooms.SetVisibility(r.Context(), c.UserID, roomID, *body.Visibility)
}
