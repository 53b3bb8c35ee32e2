package clientapi

import (
	"net/http"

	"github.com/keyserver/keyserver/dehydrated"
	"github.com/keyserver/keyserver/internal/matrixid"
)

// dehydratedPrefix is the unstable prefix of MSC3814.
const dehydratedPrefix = "/_matrix/client/unstable/org.matrix.msc3814.v1"

// dehydratedRoutes serves the user's dehydrated device. Its messages are
// read with POST (the body naming next_batch, as Synapse serves it) or
// with GET and ?from= (the latest text of the proposal).
func (a *API) dehydratedRoutes(r prefixed) {
	if a.opts.Dehydrated == nil {
		return
	}
	r.Handle("/dehydrated_device", a.authed(a.putDehydrated)).Methods(http.MethodPut)
	r.Handle("/dehydrated_device", a.authed(a.getDehydrated)).Methods(http.MethodGet)
	r.Handle("/dehydrated_device", a.authed(a.deleteDehydrated)).Methods(http.MethodDelete)
	r.Handle("/dehydrated_device/{deviceId}/events", a.authed(a.dehydratedEvents)).Methods(http.MethodPost, http.MethodGet)
}

func (a *API) putDehydrated(r *http.Request, c matrixid.Caller) (any, error) {
	var req dehydrated.PutRequest
	if err := a.decode(r, &req); err != nil {
		return nil, err
	}
	return a.opts.Dehydrated.Put(r.Context(), c.UserID, req)
}

func (a *API) getDehydrated(r *http.Request, c matrixid.Caller) (any, error) {
	return a.opts.Dehydrated.Get(r.Context(), c.UserID)
}

func (a *API) deleteDehydrated(r *http.Request, c matrixid.Caller) (any, error) {
	return a.opts.Dehydrated.Delete(r.Context(), c.UserID)
}

func (a *API) dehydratedEvents(r *http.Request, c matrixid.Caller) (any, error) {
	id, err := pathVar(r, "deviceId")
	if err != nil {
		return nil, err
	}
	from := r.URL.Query().Get("from")
	if r.Method == http.MethodPost {
		var req struct {
			NextBatch *string `json:"next_batch"`
		}
		if err := a.decodeOptional(r, &req); err != nil {
			return nil, err
		}
		if req.NextBatch != nil {
			from = *req.NextBatch
		}
	}
	return a.opts.Dehydrated.Events(r.Context(), c.UserID, id, from)
}
