package clientapi

import (
	"encoding/json"
	"net/http"

	"github.com/keyserver/keyserver/internal/matrixid"
)

// ephemeralRoutes serves typing notifications, receipts and read markers.
func (a *API) ephemeralRoutes(room prefixed) {
	if a.opts.Typing != nil {
		room.Handle("/rooms/{roomId}/typing/{userId}", a.authed(a.setTyping)).Methods(http.MethodPut)
	}
	if a.opts.Receipts != nil {
		room.Handle("/rooms/{roomId}/receipt/{receiptType}/{eventId}", a.authed(a.postReceipt)).Methods(http.MethodPost)
		room.Handle("/rooms/{roomId}/read_markers", a.authed(a.readMarkers)).Methods(http.MethodPost)
	}
}

func (a *API) setTyping(r *http.Request, c matrixid.Caller) (any, error) {
	v, err := pathVars(r, "roomId", "userId")
	if err != nil {
		return nil, err
	}
	var body map[string]json.RawMessage
	if err := a.decode(r, &body); err != nil {
		return nil, err
	}
	return empty, a.opts.Typing.Set(r.Context(), c, v[0], v[1], body)
}

func (a *API) postReceipt(r *http.Request, c matrixid.Caller) (any, error) {
	v, err := pathVars(r, "roomId", "receiptType", "eventId")
	if err != nil {
		return nil, err
	}
	// Older clients send no body.
	var body map[string]json.RawMessage
	if err := a.decodeOptional(r, &body); err != nil {
		return nil, err
	}
	return empty, a.opts.Receipts.Post(r.Context(), c, v[0], v[1], v[2], body)
}

func (a *API) readMarkers(r *http.Request, c matrixid.Caller) (any, error) {
	roomID, err := pathVar(r, "roomId")
	if err != nil {
		return nil, err
	}
	var body map[string]json.RawMessage
	if err := a.decode(r, &body); err != nil {
		return nil, err
	}
	return empty, a.opts.Receipts.ReadMarkers(r.Context(), c, roomID, body)
}
