package clientapi

import (
	"net/http"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/todevice"
)

// toDeviceRoutes serves the sending of to-device messages.
func (a *API) toDeviceRoutes(s prefixed) {
	if a.opts.ToDevice == nil {
		return
	}
	s.Handle("/sendToDevice/{eventType}/{txnId}", a.authed(a.sendToDevice)).Methods(http.MethodPut)
}

func (a *API) sendToDevice(r *http.Request, c matrixid.Caller) (any, error) {
	eventType, err := pathVar(r, "eventType")
	if err != nil {
		return nil, err
	}
	txnID, err := pathVar(r, "txnId")
	if err != nil {
		return nil, err
	}
	var req todevice.SendRequest
	if err := a.decode(r, &req); err != nil {
		return nil, err
	}
	return empty, a.opts.ToDevice.Send(r.Context(), c.UserID, c.DeviceID, eventType, txnID, req)
}
