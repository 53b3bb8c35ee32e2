package federationapi

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/gorilla/mux"

	"github.com/keyserver/keyserver/internal/httpx"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/media"
)

// Media serves this server's media to other servers.
type Media interface {
	FederationDownload(ctx context.Context, mediaID string, timeout time.Duration) (*media.Content, error)
	FederationThumbnail(ctx context.Context, mediaID string, width, height int, method string, timeout time.Duration) (*media.Content, error)
}

// mediaRoutes serve local media to other servers, as multipart/mixed
// answers: a JSON part, then the bytes.
func (a *api) mediaRoutes(r *mux.Router) {
	if a.opts.Media == nil {
		return
	}
	r.Handle("/_matrix/federation/v1/media/download/{mediaId}", a.mediaAuthed(func(r request) (*media.Content, error) {
		id, timeout, err := mediaRequest(r)
		if err != nil {
			return nil, err
		}
		return a.opts.Media.FederationDownload(r.Context(), id, timeout)
	})).Methods(http.MethodGet)
	r.Handle("/_matrix/federation/v1/media/thumbnail/{mediaId}", a.mediaAuthed(func(r request) (*media.Content, error) {
		id, timeout, err := mediaRequest(r)
		if err != nil {
			return nil, err
		}
		q := r.URL.Query()
		w, errW := strconv.Atoi(q.Get("width"))
		h, errH := strconv.Atoi(q.Get("height"))
		if errW != nil || errH != nil {
			return nil, mxerr.InvalidParam("width and height must be positive integers")
		}
		method := q.Get("method")
		if method == "" {
			method = "scale"
		}
		return a.opts.Media.FederationThumbnail(r.Context(), id, w, h, method, timeout)
	})).Methods(http.MethodGet)
}

func mediaRequest(r request) (string, time.Duration, error) {
	id, err := url.PathUnescape(mux.Vars(r.Request)["mediaId"])
	if err != nil {
		return "", 0, mxerr.InvalidParam("bad percent-encoding in the media ID")
	}
	timeout := time.Duration(-1) // the default
	if v := r.URL.Query().Get("timeout_ms"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 {
			return "", 0, mxerr.InvalidParam("timeout_ms must be a non-negative integer")
		}
		timeout = time.Duration(min(ms, int64(time.Hour/time.Millisecond))) * time.Millisecond
	}
	return id, timeout, nil
}

// mediaAuthed is authed for the media endpoints, whose answers are not
// JSON: the same X-Matrix check first, then the content as
// multipart/mixed.
func (a *api) mediaAuthed(h func(r request) (*media.Content, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, ok := a.authenticate(w, r)
		if !ok {
			return
		}
		c, err := h(req)
		if err != nil {
			httpx.Error(w, r, err)
			return
		}
		defer c.File.Close()
		// A large file may take longer than other answers to send.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(10 * time.Minute))
		if err := media.WriteFederation(w, c); err != nil {
			httpx.Logger(r).WithError(err).Debug("sending media to a server failed")
		}
	})
}
