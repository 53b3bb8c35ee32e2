package clientapi

import (
	"net/http"

	"github.com/keyserver/keyserver/internal/httpx"
	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/keybackup"
)

// keyBackupRoutes serves the server-side key backup (/room_keys).
func (a *API) keyBackupRoutes(s prefixed) {
	if a.opts.KeyBackup == nil {
		return
	}
	s.Handle("/room_keys/version", a.authed(a.createBackupVersion)).Methods(http.MethodPost)
	s.Handle("/room_keys/version", a.authed(a.backupVersion)).Methods(http.MethodGet)
	s.Handle("/room_keys/version/{version}", a.authed(a.backupVersion)).Methods(http.MethodGet)
	s.Handle("/room_keys/version/{version}", a.authed(a.updateBackupVersion)).Methods(http.MethodPut)
	s.Handle("/room_keys/version/{version}", a.authed(a.deleteBackupVersion)).Methods(http.MethodDelete)
	for _, path := range []string{"/room_keys/keys", "/room_keys/keys/{roomId}", "/room_keys/keys/{roomId}/{sessionId}"} {
		s.Handle(path, a.authed(a.putBackupKeys)).Methods(http.MethodPut)
		s.Handle(path, a.authed(a.backupKeys)).Methods(http.MethodGet)
		s.Handle(path, a.authed(a.deleteBackupKeys)).Methods(http.MethodDelete)
	}
}

func (a *API) createBackupVersion(r *http.Request, c matrixid.Caller) (any, error) {
	var req keybackup.VersionRequest
	if err := a.decode(r, &req); err != nil {
		return nil, err
	}
	return a.opts.KeyBackup.CreateVersion(r.Context(), c.UserID, req)
}

func (a *API) backupVersion(r *http.Request, c matrixid.Caller) (any, error) {
	version, err := pathVar(r, "version")
	if err != nil {
		return nil, err
	}
	return a.opts.KeyBackup.Version(r.Context(), c.UserID, version)
}

func (a *API) updateBackupVersion(r *http.Request, c matrixid.Caller) (any, error) {
	version, err := pathVar(r, "version")
	if err != nil {
		return nil, err
	}
	var req keybackup.VersionRequest
	if err := a.decode(r, &req); err != nil {
		return nil, err
	}
	return empty, a.opts.KeyBackup.UpdateVersion(r.Context(), c.UserID, version, req)
}

func (a *API) deleteBackupVersion(r *http.Request, c matrixid.Caller) (any, error) {
	version, err := pathVar(r, "version")
	if err != nil {
		return nil, err
	}
	return empty, a.opts.KeyBackup.DeleteVersion(r.Context(), c.UserID, version)
}

// backupKeyPath reads the version, and the room and session IDs the
// path names (empty when it does not: pathVar of a missing variable).
func backupKeyPath(r *http.Request) (version, roomID, sessionID string, err error) {
	if roomID, err = pathVar(r, "roomId"); err != nil {
		return "", "", "", err
	}
	if sessionID, err = pathVar(r, "sessionId"); err != nil {
		return "", "", "", err
	}
	version = r.URL.Query().Get("version")
	return version, roomID, sessionID, httpx.CleanParam("version", version)
}

func (a *API) putBackupKeys(r *http.Request, c matrixid.Caller) (any, error) {
	version, roomID, sessionID, err := backupKeyPath(r)
	if err != nil {
		return nil, err
	}
	// The three paths take the same keys at three depths.
	var rooms map[string]keybackup.RoomKeys
	switch {
	case sessionID != "":
		var key keybackup.KeyBackupData
		if err := a.decode(r, &key); err != nil {
			return nil, err
		}
		rooms = map[string]keybackup.RoomKeys{roomID: {Sessions: map[string]*keybackup.KeyBackupData{sessionID: &key}}}
	case roomID != "":
		var room keybackup.RoomKeys
		if err := a.decode(r, &room); err != nil {
			return nil, err
		}
		rooms = map[string]keybackup.RoomKeys{roomID: room}
	default:
		var req struct {
			Rooms map[string]keybackup.RoomKeys `json:"rooms"`
		}
		if err := a.decode(r, &req); err != nil {
			return nil, err
		}
		if req.Rooms == nil {
			return nil, mxerr.MissingParam("rooms is required")
		}
		rooms = req.Rooms
	}
	return a.opts.KeyBackup.PutKeys(r.Context(), c.UserID, version, rooms)
}

func (a *API) backupKeys(r *http.Request, c matrixid.Caller) (any, error) {
	version, roomID, sessionID, err := backupKeyPath(r)
	if err != nil {
		return nil, err
	}
	return a.opts.KeyBackup.Keys(r.Context(), c.UserID, version, roomID, sessionID)
}

func (a *API) deleteBackupKeys(r *http.Request, c matrixid.Caller) (any, error) {
	version, roomID, sessionID, err := backupKeyPath(r)
	if err != nil {
		return nil, err
	}
	return a.opts.KeyBackup.DeleteKeys(r.Context(), c.UserID, version, roomID, sessionID)
}
