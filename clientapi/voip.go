package clientapi

import (
	"net/http"

	"github.com/keyserver/keyserver/internal/matrixid"
)

// voipRoutes serve what clients ask at start for calls and bridges: the
// TURN server ({} when there is none) and the third-party protocols, of
// which this server bridges none ({}).
func (a *API) voipRoutes(s prefixed) {
	s.Handle("/voip/turnServer", a.authed(a.turnServer)).Methods(http.MethodGet)
	s.Handle("/thirdparty/protocols", a.authed(func(*http.Request, matrixid.Caller) (any, error) {
		return empty, nil
	})).Methods(http.MethodGet)
}

func (a *API) turnServer(_ *http.Request, c matrixid.Caller) (any, error) {
	if ans := a.opts.TURN.For(c.UserID); ans != nil {
		return ans, nil
	}
	return empty, nil
}
