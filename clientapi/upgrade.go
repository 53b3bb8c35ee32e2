package clientapi

import (
	"net/http"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
)

// upgradeRoom serves POST /rooms/{roomId}/upgrade.
func (a *API) upgradeRoom(r *http.Request, c matrixid.Caller) (any, error) {
	roomID, err := pathVar(r, "roomId")
	if err != nil {
		return nil, err
	}
	var req struct {
		NewVersion         *string  `json:"new_version"`
		AdditionalCreators []string `json:"additional_creators"` // room version 12 (MSC4289)
	}
	if err := a.decode(r, &req); err != nil {
		return nil, err
	}
	if req.NewVersion == nil {
		return nil, mxerr.BadJSON("new_version is required")
	}
	id, err := a.opts.Rooms.Upgrade(r.Context(), c.UserID, roomID, *req.NewVersion, req.AdditionalCreators)
	if err != nil {
		return nil, err
	}
	return map[string]string{"replacement_room": id}, nil
}
