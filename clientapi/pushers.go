package clientapi

import (
	"encoding/json"
	"net/http"

	"github.com/keyserver/keyserver/internal/matrixid"
)

// pusherRoutes serves the caller's pushers.
func (a *API) pusherRoutes(s prefixed) {
	if a.opts.Pushers == nil {
		return
	}
	s.Handle("/pushers", a.authed(func(r *http.Request, c matrixid.Caller) (any, error) {
		return a.opts.Pushers.List(r.Context(), c.UserID)
	})).Methods(http.MethodGet)
	s.Handle("/pushers/set", a.authed(func(r *http.Request, c matrixid.Caller) (any, error) {
		var body map[string]json.RawMessage
		if err := a.decode(r, &body); err != nil {
			return nil, err
		}
		return empty, a.opts.Pushers.Set(r.Context(), c.UserID, c.DeviceID, body)
	})).Methods(http.MethodPost)
}
