package clientapi

import (
	"net/http"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/search"
)

func (a *API) searchRoutes(s prefixed) {
	if a.opts.Search == nil {
		return
	}
	s.Handle("/search", a.authed(a.search)).Methods(http.MethodPost)
}

func (a *API) search(r *http.Request, c matrixid.Caller) (any, error) {
	var body search.Request
	if err := a.decode(r, &body); err != nil {
		return nil, err
	}
	return a.opts.Search.Search(r.Context(), c.UserID, body, r.URL.Query().Get("next_batch"))
}
