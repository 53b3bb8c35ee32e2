package clientapi

import (
	"net/http"

	"github.com/keyserver/keyserver/internal/matrixid"
)

func (a *API) userDirectoryRoutes(s prefixed) {
	if a.opts.UserDirectory == nil {
		return
	}
	s.Handle("/user_directory/search", a.authed(a.searchUsers)).Methods(http.MethodPost)
}

func (a *API) searchUsers(r *http.Request, c matrixid.Caller) (any, error) {
	var body struct {
		SearchTerm string `json:"search_term"`
		Limit      int    `json:"limit"`
	}
	if err := a.decode(r, &body); err != nil {
		return nil, err
	}
	return a.opts.UserDirectory.Search(r.Context(), c.UserID, body.SearchTerm, body.Limit)
}
