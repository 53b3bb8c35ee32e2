// Package userdirectory finds users for a user (POST
// /user_directory/search), as clients' invite dialogs ask: the users who
// share a room with the searcher or are in a room of the public room
// directory, and with search_all_users every local user; matched without
// regard to case against user ID and display name. It reads the rooms'
// current membership and the profiles at each search, so it is current
// with every profile and membership change.
package userdirectory

import (
	"cmp"
	"context"
	"slices"
	"strings"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// Store is what a search reads (package sqlstore).
type Store interface {
	storage.UserDirectory
}

// Service searches the directory.
type Service struct {
	db             Store
	searchAllUsers bool
}

// New makes a Service; searchAllUsers finds every local user too.
func New(db Store, searchAllUsers bool) *Service {
	return &Service{db: db, searchAllUsers: searchAllUsers}
}

// DefaultLimit and MaxLimit bound the results of a search.
const (
	DefaultLimit = 10
	MaxLimit     = 1000
)

// Result is one user found.
type Result struct {
	UserID      string `json:"user_id"`
	DisplayName string `json:"display_name,omitempty"`
	AvatarURL   string `json:"avatar_url,omitempty"`
}

// Response is the answer of a search: Limited when more users matched
// than were returned.
type Response struct {
	Limited bool     `json:"limited"`
	Results []Result `json:"results"`
}

// Search finds the users matching term for searcher, at most limit (0:
// the default): those whose ID or display name starts with the term
// first, then the others, each in order of user ID.
func (s *Service) Search(ctx context.Context, searcher, term string, limit int) (Response, error) {
	term = strings.TrimSpace(term)
	if term == "" {
		return Response{}, mxerr.MissingParam("search_term is required")
	}
	if limit < 0 {
		return Response{}, mxerr.InvalidParam("limit must be a non-negative integer")
	}
	if limit == 0 {
		limit = DefaultLimit
	}
	limit = min(limit, MaxLimit)
	lower := strings.ToLower(term)
	candidates, err := s.db.UserDirectoryCandidates(ctx, searcher, lower, s.searchAllUsers)
	if err != nil {
		return Response{}, err
	}
	found := map[string]Result{}
	for _, c := range candidates {
		id, name := strings.ToLower(c.UserID), strings.ToLower(c.DisplayName)
		if !strings.Contains(id, lower) && !strings.Contains(name, lower) {
			continue
		}
		r, seen := found[c.UserID]
		if !seen || (r.DisplayName == "" && c.DisplayName != "") {
			found[c.UserID] = Result{UserID: c.UserID, DisplayName: c.DisplayName, AvatarURL: c.AvatarURL}
		}
	}
	results := make([]Result, 0, len(found))
	for _, r := range found {
		results = append(results, r)
	}
	prefix := func(r Result) int {
		if strings.HasPrefix(strings.ToLower(r.UserID), "@"+lower) || strings.HasPrefix(strings.ToLower(r.DisplayName), lower) {
			return 0
		}
		return 1
	}
	slices.SortFunc(results, func(a, b Result) int {
		return cmp.Or(cmp.Compare(prefix(a), prefix(b)), strings.Compare(a.UserID, b.UserID))
	})
	out := Response{Results: results}
	if len(results) > limit {
		out.Results, out.Limited = results[:limit], true
	}
	return out, nil
}
