package clientapi

import (
	"net/http"
	"strings"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/metrics/httpmetrics"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/spaces"
)

// spaceRoutes serve space hierarchies (also under MSC2946's unstable
// prefix) and room summaries (MSC3266, also under its unstable path),
// the summaries with or without a token, as Synapse does.
func (a *API) spaceRoutes(r prefixed) {
	if a.opts.Spaces == nil || a.opts.Rooms == nil {
		return
	}
	r.Handle("/_matrix/client/{"+httpmetrics.APIVersionVar+":(?:v1|unstable/org.matrix.msc2946)}/rooms/{roomId}/hierarchy",
		a.authed(a.hierarchy)).Methods(http.MethodGet)
	summary := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var c matrixid.Caller
		if accessToken(r) != "" {
			var ok bool
			if c, ok = a.authenticate(w, r); !ok {
				return
			}
		}
		body, err := a.roomSummary(r, c)
		respond(w, r, body, err)
	})
	r.Handle("/_matrix/client/v1/room_summary/{room}", summary).Methods(http.MethodGet)
	r.Handle("/_matrix/client/unstable/im.nheko.summary/summary/{room}", summary).Methods(http.MethodGet)
	r.Handle("/_matrix/client/unstable/im.nheko.summary/rooms/{room}/summary", summary).Methods(http.MethodGet)
}

func (a *API) hierarchy(r *http.Request, c matrixid.Caller) (any, error) {
	roomID, err := pathVar(r, "roomId")
	if err != nil {
		return nil, err
	}
	req, err := spaces.RequestFromQuery(roomID, r.URL.Query())
	if err != nil {
		return nil, err
	}
	return a.opts.Spaces.Hierarchy(r.Context(), c.UserID, req)
}

// roomSummary answers GET /room_summary/{roomIdOrAlias}: an alias is
// resolved first, its servers then the ones to ask.
func (a *API) roomSummary(r *http.Request, c matrixid.Caller) (any, error) {
	room, err := pathVar(r, "room")
	if err != nil {
		return nil, err
	}
	via := r.URL.Query()["via"]
	switch {
	case strings.HasPrefix(room, "#"):
		res, err := a.opts.Rooms.ResolveAlias(r.Context(), room)
		if err != nil {
			return nil, err
		}
		room, via = res.RoomID, res.Servers
	case !matrixid.ValidRoomID(room):
		return nil, mxerr.InvalidParam("%q is neither a room ID nor a room alias", room)
	}
	return a.opts.Spaces.Summary(r.Context(), c.UserID, room, via)
}
