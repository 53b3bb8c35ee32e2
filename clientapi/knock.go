package clientapi

import (
	"encoding/json"
	"net/http"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
)

// knockRoutes registers POST /knock/{roomIdOrAlias}.
func (a *API) knockRoutes(s prefixed) {
	if a.opts.Rooms == nil {
		return
	}
	s.Handle("/knock/{roomIdOrAlias}", a.authed(a.knock)).Methods(http.MethodPost)
}

// knock knocks on a room: the body's reason (optional) goes into the
// knock; server_name and via (repeatable) name servers to knock through
// on a room of another server.
func (a *API) knock(r *http.Request, c matrixid.Caller) (any, error) {
	target, err := pathVar(r, "roomIdOrAlias")
	if err != nil {
		return nil, err
	}
	var body map[string]json.RawMessage
	if err := a.decodeOptional(r, &body); err != nil {
		return nil, err
	}
	var reason string
	if raw, ok := body["reason"]; ok && string(raw) != "null" {
		if json.Unmarshal(raw, &reason) != nil {
			return nil, mxerr.BadJSON("reason must be a string")
		}
	}
	via := append(r.URL.Query()["server_name"], r.URL.Query()["via"]...)
	roomID, err := a.opts.Rooms.Knock(r.Context(), c.UserID, target, reason, via)
	if err != nil {
		return nil, err
	}
	return map[string]string{"room_id": roomID}, nil
}
