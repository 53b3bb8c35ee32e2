package clientapi

import (
	"encoding/json"
	"net/http"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/presence"
)

// presenceRoutes serves a user's presence: set by the user, read by the
// user and those sharing a room with them.
func (a *API) presenceRoutes(s prefixed) {
	if a.opts.Presence == nil {
		return
	}
	s.Handle("/presence/{userId}/status", a.authed(a.presenceStatus)).Methods(http.MethodGet)
	s.Handle("/presence/{userId}/status", a.authed(a.setPresence)).Methods(http.MethodPut)
}

func (a *API) presenceStatus(r *http.Request, c matrixid.Caller) (any, error) {
	userID, err := pathVar(r, "userId")
	if err != nil {
		return nil, err
	}
	return a.opts.Presence.Status(r.Context(), c, userID)
}

// setPresence decodes {"presence": "...", "status_msg": "..."}; the
// presence package checks the values.
func (a *API) setPresence(r *http.Request, c matrixid.Caller) (any, error) {
	userID, err := pathVar(r, "userId")
	if err != nil {
		return nil, err
	}
	var body map[string]json.RawMessage
	if err := a.decode(r, &body); err != nil {
		return nil, err
	}
	var req presence.SetRequest
	raw, ok := body["presence"]
	if !ok {
		return nil, mxerr.MissingParam("presence is required")
	}
	if err := json.Unmarshal(raw, &req.Presence); err != nil || string(raw) == "null" {
		return nil, mxerr.BadJSON("presence must be a string")
	}
	if raw, ok := body["status_msg"]; ok {
		if err := json.Unmarshal(raw, &req.StatusMsg); err != nil {
			return nil, mxerr.BadJSON("status_msg must be a string")
		}
	}
	return empty, a.opts.Presence.SetStatus(r.Context(), c, userID, req)
}
