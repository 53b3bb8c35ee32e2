package federationapi

import (
	"context"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// Profiles answers other servers' profile queries (profile.Service).
type Profiles interface {
	Local(ctx context.Context, userID string) (storage.Profile, error)
}

// profileRoutes serves /query/profile, when there are profiles.
func (a *api) profileRoutes(r *mux.Router) {
	if a.opts.Profiles == nil {
		return
	}
	r.Handle("/_matrix/federation/v1/query/profile", a.authed(a.queryProfile)).Methods(http.MethodGet)
}

// queryProfile answers a local user's profile, or one field of it
// (field=displayname or avatar_url); a field not set is left out.
func (a *api) queryProfile(r request) (any, error) {
	userID, err := queryParam(r, "user_id")
	if err != nil {
		return nil, err
	}
	field := r.URL.Query().Get("field")
	if field != "" && field != "displayname" && field != "avatar_url" {
		return nil, mxerr.InvalidParam("field must be displayname or avatar_url")
	}
	p, err := a.opts.Profiles.Local(r.Context(), userID)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	if p.DisplayName != "" && field != "avatar_url" {
		out["displayname"] = p.DisplayName
	}
	if p.AvatarURL != "" && field != "displayname" {
		out["avatar_url"] = p.AvatarURL
	}
	return out, nil
}
