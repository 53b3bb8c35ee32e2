package clientapi

import (
	"net/http"

	"github.com/gorilla/mux"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/roomserver"
)

// relationRoutes registers the endpoints of the relations between events,
// served under /_matrix/client/v1 (as Synapse serves them).
func (a *API) relationRoutes(r *mux.Router) {
	if a.opts.Rooms == nil {
		return
	}
	const v1 = "/_matrix/client/v1/rooms/{roomId}"
	r.Handle(v1+"/relations/{eventId}", a.authed(a.roomRelations)).Methods(http.MethodGet)
	r.Handle(v1+"/relations/{eventId}/{relType}", a.authed(a.roomRelations)).Methods(http.MethodGet)
	r.Handle(v1+"/relations/{eventId}/{relType}/{eventType}", a.authed(a.roomRelations)).Methods(http.MethodGet)
	r.Handle(v1+"/threads", a.authed(a.roomThreads)).Methods(http.MethodGet)
}

func (a *API) roomRelations(r *http.Request, c matrixid.Caller) (any, error) {
	v, err := pathVars(r, "roomId", "eventId")
	if err != nil {
		return nil, err
	}
	req := roomserver.RelationsRequest{UserID: c.UserID, RoomID: v[0], EventID: v[1]}
	for _, p := range []struct {
		name string
		to   *string
	}{{"relType", &req.RelType}, {"eventType", &req.EventType}} {
		if _, ok := mux.Vars(r)[p.name]; ok {
			if *p.to, err = pathVar(r, p.name); err != nil {
				return nil, err
			}
		}
	}
	q := r.URL.Query()
	req.From, req.To, req.Dir, req.Limit, req.Recurse = q.Get("from"), q.Get("to"), q.Get("dir"), q.Get("limit"), q.Get("recurse")
	return a.opts.Rooms.Relations(r.Context(), req)
}

func (a *API) roomThreads(r *http.Request, c matrixid.Caller) (any, error) {
	roomID, err := pathVar(r, "roomId")
	if err != nil {
		return nil, err
	}
	q := r.URL.Query()
	return a.opts.Rooms.Threads(r.Context(), roomserver.ThreadsRequest{UserID: c.UserID, RoomID: roomID,
		Include: q.Get("include"), From: q.Get("from"), Limit: q.Get("limit")})
}
