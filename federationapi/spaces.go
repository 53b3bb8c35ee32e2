package federationapi

import (
	"context"
	"net/http"

	"github.com/gorilla/mux"

	"github.com/keyserver/keyserver/spaces"
)

// Spaces answers other servers' /hierarchy (package spaces).
type Spaces interface {
	FederationHierarchy(ctx context.Context, origin, roomID string, suggestedOnly bool) (spaces.FederationResponse, error)
}

func (a *api) spaceRoutes(r *mux.Router) {
	if a.opts.Spaces == nil {
		return
	}
	r.Handle("/_matrix/federation/v1/hierarchy/{roomId}", a.authed(a.hierarchy)).Methods(http.MethodGet)
}

func (a *api) hierarchy(r request) (any, error) {
	roomID, err := pathVar(r, "roomId")
	if err != nil {
		return nil, err
	}
	suggested, err := spaces.ParseBool(r.URL.Query(), "suggested_only")
	if err != nil {
		return nil, err
	}
	return a.opts.Spaces.FederationHierarchy(r.Context(), r.origin, roomID, suggested)
}
