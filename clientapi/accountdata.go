package clientapi

import (
	"encoding/json"
	"net/http"

	"github.com/keyserver/keyserver/internal/matrixid"
)

// accountDataRoutes serves account data, global and per room, and room
// tags (the room's m.tag account data).
func (a *API) accountDataRoutes(s prefixed) {
	if a.opts.AccountData == nil {
		return
	}
	s.Handle("/user/{userId}/account_data/{type}", a.authed(a.setAccountData(false))).Methods(http.MethodPut)
	s.Handle("/user/{userId}/account_data/{type}", a.authed(a.accountData(false))).Methods(http.MethodGet)
	s.Handle("/user/{userId}/rooms/{roomId}/account_data/{type}", a.authed(a.setAccountData(true))).Methods(http.MethodPut)
	s.Handle("/user/{userId}/rooms/{roomId}/account_data/{type}", a.authed(a.accountData(true))).Methods(http.MethodGet)
	s.Handle("/user/{userId}/rooms/{roomId}/tags", a.authed(a.roomTags)).Methods(http.MethodGet)
	s.Handle("/user/{userId}/rooms/{roomId}/tags/{tag}", a.authed(a.setRoomTag)).Methods(http.MethodPut)
	s.Handle("/user/{userId}/rooms/{roomId}/tags/{tag}", a.authed(a.deleteRoomTag)).Methods(http.MethodDelete)
}

func (a *API) roomTags(r *http.Request, c matrixid.Caller) (any, error) {
	v, err := pathVars(r, "userId", "roomId")
	if err != nil {
		return nil, err
	}
	return a.opts.AccountData.Tags(r.Context(), c.UserID, v[0], v[1])
}

func (a *API) setRoomTag(r *http.Request, c matrixid.Caller) (any, error) {
	v, err := pathVars(r, "userId", "roomId", "tag")
	if err != nil {
		return nil, err
	}
	var body json.RawMessage
	if err := a.decode(r, &body); err != nil {
		return nil, err
	}
	return empty, a.opts.AccountData.SetTag(r.Context(), c.UserID, v[0], v[1], v[2], body)
}

func (a *API) deleteRoomTag(r *http.Request, c matrixid.Caller) (any, error) {
	v, err := pathVars(r, "userId", "roomId", "tag")
	if err != nil {
		return nil, err
	}
	return empty, a.opts.AccountData.DeleteTag(r.Context(), c.UserID, v[0], v[1], v[2])
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
	return func(r *http.Request, c matrixid.Caller) (any, error) {
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
	return func(r *http.Request, c matrixid.Caller) (any, error) {
		userID, roomID, dataType, err := accountDataPath(r)
		if err != nil {
			return nil, err
		}
		return a.opts.AccountData.Get(r.Context(), c.UserID, userID, roomID, dataType, perRoom)
	}
}
