package clientapi

import (
	"net/http"

	"github.com/keyserver/keyserver/initialsync"
	"github.com/keyserver/keyserver/internal/matrixid"
)

// initialSyncRoutes serve the first sync API, which Synapse still serves:
// every room of the user's, and one room (room is the router of the
// paths under /rooms/).
func (a *API) initialSyncRoutes(s, room prefixed) {
	if a.opts.InitialSync == nil {
		return
	}
	s.Handle("/initialSync", a.authed(a.initialSync)).Methods(http.MethodGet)
	room.Handle("/rooms/{roomId}/initialSync", a.authed(a.roomInitialSync)).Methods(http.MethodGet)
}

func (a *API) initialSync(r *http.Request, c matrixid.Caller) (any, error) {
	limit, err := initialsync.ParseLimit(r.URL.Query().Get("limit"))
	if err != nil {
		return nil, err
	}
	return a.opts.InitialSync.All(r.Context(), c.UserID, limit, r.URL.Query().Get("archived") == "true")
}

func (a *API) roomInitialSync(r *http.Request, c matrixid.Caller) (any, error) {
	roomID, err := pathVar(r, "roomId")
	if err != nil {
		return nil, err
	}
	limit, err := initialsync.ParseLimit(r.URL.Query().Get("limit"))
	if err != nil {
		return nil, err
	}
	return a.opts.InitialSync.Room(r.Context(), c.UserID, roomID, limit)
}
