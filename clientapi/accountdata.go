package clientapi

import (
	"encoding/json"
	"net/http"

	"github.com/keyserver/keyserver/keyserver"
)

// accountDataRoutes serves account data, global and per room.
func (a *API) accountDataRoutes(s prefixed) {
	if a.opts.AccountData == nil {
		return
	}
	s.Handle("/user/{userId}/account_data/{type}", a.authed(a.setAccountData(false))).Methods(http.MethodPut)
	s.Handle("/user/{userId}/account_data/{type}", a.authed(a.accountData(false))).Methods(http.MethodGet)
	s.Handle("/user/{userId}/rooms/{roomId}/account_data/{type}", a.authed(a.setAccountData(true))).Methods(http.MethodPut)
	s.Handle("/user/{userId}/rooms/{roomId}/account_data/{type}", a.authed(a.accountData(true))).Methods(http.MethodGet)
}

// accountDataPath reads the user, room (empty on the global paths) and
// type the path names.
func accountDataPath(r *http.Request) (userID, roomID, dataType string, err error) {
	if userID, err = pathVar(r, "userId"); err != nil {
		return "", "", "", err
	}
	if roomID, err = pathVar(r, "roomId"); err != nil {
		return "", "", "", err
	}
	if dataType, err = pathVar(r, "type"); err != nil {
		return "", "", "", err
	}
	return userID, roomID, dataType, nil
}

func (a *API) setAccountData(perRoom bool) authedHandler {
	return func(r *http.Request, c keyserver.Caller) (any, error) {
		userID, roomID, dataType, err := accountDataPath(r)
		if err != nil {
			return nil, err
		}
		var content json.RawMessage
		if err := a.decode(r, &content); err != nil {
			return nil, err
		}
		return empty, a.opts.AccountData.Set(r.Context(), c.UserID, userID, roomID, dataType, perRoom, content)
	}
}

func (a *API) accountData(perRoom bool) authedHandler {
	return func(r *http.Request, c keyserver.Caller) (any, error) {
		userID, roomID, dataType, err := accountDataPath(r)
		if err != nil {
			return nil, err
		}
		return a.opts.AccountData.Get(r.Context(), c.UserID, userID, roomID, dataType, perRoom)
	}
}
