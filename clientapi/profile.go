package clientapi

import (
	"encoding/json"
	"net/http"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/profile"
)

// profileRoutes serves profiles: anyone may read one, a user changes
// their own.
func (a *API) profileRoutes(s prefixed) {
	if a.opts.Profiles == nil {
		return
	}
	s.Handle("/profile/{userId}", a.public(a.profile(""))).Methods(http.MethodGet)
	for _, field := range []string{profile.DisplayName, profile.AvatarURL} {
		s.Handle("/profile/{userId}/"+field, a.public(a.profile(field))).Methods(http.MethodGet)
		s.Handle("/profile/{userId}/"+field, a.authed(a.setProfile(field))).Methods(http.MethodPut)
	}
}

// profile answers the whole profile (field "") or one field of it; a
// field that is not set is left out.
func (a *API) profile(field string) handler {
	return func(r *http.Request) (any, error) {
		userID, err := pathVar(r, "userId")
		if err != nil {
			return nil, err
		}
		p, err := a.opts.Profiles.Get(r.Context(), userID)
		if err != nil {
			return nil, err
		}
		out := map[string]string{}
		if p.DisplayName != "" && field != profile.AvatarURL {
			out[profile.DisplayName] = p.DisplayName
		}
		if p.AvatarURL != "" && field != profile.DisplayName {
			out[profile.AvatarURL] = p.AvatarURL
		}
		return out, nil
	}
}

// setProfile sets one field: {"<field>": "value"}, or null to remove it.
func (a *API) setProfile(field string) authedHandler {
	return func(r *http.Request, c matrixid.Caller) (any, error) {
		userID, err := pathVar(r, "userId")
		if err != nil {
			return nil, err
		}
		var body map[string]json.RawMessage
		if err := a.decode(r, &body); err != nil {
			return nil, err
		}
		raw, ok := body[field]
		if !ok {
			return nil, mxerr.MissingParam("%s is required", field)
		}
		var value *string
		if err := json.Unmarshal(raw, &value); err != nil {
			return nil, mxerr.BadJSON("%s must be a string or null", field)
		}
		return empty, a.opts.Profiles.Set(r.Context(), c.UserID, userID, field, value)
	}
}
