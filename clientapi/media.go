package clientapi

import (
	"net/http"
	"strconv"
	"time"

	"github.com/gorilla/mux"

	"github.com/keyserver/keyserver/internal/httpx"
	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/metrics/httpmetrics"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/media"
)

// mediaVersions are the versions of the /_matrix/media paths.
const mediaVersions = "/_matrix/media/{" + httpmetrics.APIVersionVar + ":(?:r0|v3|v1)}"

// uploadReadTime is how long an upload's body may take to arrive, in
// place of the listener's read timeout; transferTime is how much longer
// than the write timeout a download may take (remote media fetched first,
// large files to slow clients).
const (
	uploadReadTime = 10 * time.Minute
	transferTime   = 10 * time.Minute
)

// mediaRoutes serve the content repository: uploads under
// /_matrix/media (where the spec keeps them), downloads and thumbnails
// under /_matrix/client/v1/media (authenticated), and the older
// /_matrix/media downloads without authentication, which serve only
// media not marked authenticated (none, with authenticated media on).
func (a *API) mediaRoutes(s prefixed) {
	if a.opts.Media == nil {
		return
	}
	r := s.r
	r.Handle(mediaVersions+"/upload", a.uploading(a.mediaUpload)).Methods(http.MethodPost)
	r.Handle(mediaVersions+"/upload/{serverName}/{mediaId}", a.uploading(a.mediaUploadTo)).Methods(http.MethodPut)
	r.Handle("/_matrix/media/v1/create", a.authed(a.mediaCreate)).Methods(http.MethodPost)
	r.Handle(mediaVersions+"/config", a.authed(a.mediaConfig)).Methods(http.MethodGet)
	r.Handle("/_matrix/client/v1/media/config", a.authed(a.mediaConfig)).Methods(http.MethodGet)
	r.Handle(mediaVersions+"/preview_url", a.authed(a.previewURL)).Methods(http.MethodGet)
	r.Handle("/_matrix/client/v1/media/preview_url", a.authed(a.previewURL)).Methods(http.MethodGet)
	for _, legacy := range []bool{false, true} {
		prefix := "/_matrix/client/v1/media"
		if legacy {
			prefix = mediaVersions
		}
		r.Handle(prefix+"/download/{serverName}/{mediaId}", a.mediaDownload(legacy)).Methods(http.MethodGet)
		r.Handle(prefix+"/download/{serverName}/{mediaId}/{fileName}", a.mediaDownload(legacy)).Methods(http.MethodGet)
		r.Handle(prefix+"/thumbnail/{serverName}/{mediaId}", a.mediaThumbnail(legacy)).Methods(http.MethodGet)
	}
}

// uploading serves an upload: its body may take longer than other
// requests' to arrive.
func (a *API) uploading(h func(r *http.Request, u media.Upload) (any, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := a.authenticate(w, r)
		if !ok {
			return
		}
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(uploadReadTime))
		body, err := h(r, media.Upload{UserID: c.UserID, Body: r.Body, Length: r.ContentLength,
			ContentType: r.Header.Get("Content-Type"), FileName: r.URL.Query().Get("filename")})
		respond(w, r, body, err)
	})
}

func (a *API) mediaUpload(r *http.Request, u media.Upload) (any, error) {
	uri, err := a.opts.Media.Upload(r.Context(), u)
	if err != nil {
		return nil, err
	}
	return map[string]string{"content_uri": uri}, nil
}

func (a *API) mediaUploadTo(r *http.Request, u media.Upload) (any, error) {
	server, err := pathVar(r, "serverName")
	if err != nil {
		return nil, err
	}
	id, err := pathVar(r, "mediaId")
	if err != nil {
		return nil, err
	}
	return empty, a.opts.Media.UploadTo(r.Context(), server, id, u)
}

func (a *API) mediaCreate(r *http.Request, c matrixid.Caller) (any, error) {
	uri, expires, err := a.opts.Media.Create(r.Context(), c.UserID)
	if err != nil {
		return nil, err
	}
	return map[string]any{"content_uri": uri, "unused_expires_at": expires}, nil
}

func (a *API) mediaConfig(*http.Request, matrixid.Caller) (any, error) {
	return a.opts.Media.Config(), nil
}

func (a *API) previewURL(r *http.Request, c matrixid.Caller) (any, error) {
	return a.opts.Media.PreviewURL(r.Context(), c.UserID, r.URL.Query().Get("url"))
}

// mediaTimeout is a download's timeout_ms: how long to wait for media
// whose upload has not happened yet (-1 when absent: the default).
func mediaTimeout(r *http.Request) (time.Duration, error) {
	v := r.URL.Query().Get("timeout_ms")
	if v == "" {
		return -1, nil
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 {
		return 0, mxerr.InvalidParam("timeout_ms must be a non-negative integer")
	}
	return time.Duration(min(ms, int64(time.Hour/time.Millisecond))) * time.Millisecond, nil
}

// mediaPath reads the server name and media ID of a media path.
func mediaPath(r *http.Request) (server, id string, timeout time.Duration, err error) {
	if server, err = pathVar(r, "serverName"); err != nil {
		return
	}
	if id, err = pathVar(r, "mediaId"); err != nil {
		return
	}
	timeout, err = mediaTimeout(r)
	return
}

// serveMedia sends media with its headers (ranges and conditional
// requests as net/http serves them).
func serveMedia(w http.ResponseWriter, r *http.Request, c *media.Content, name string) {
	defer c.File.Close()
	media.SetHeaders(w.Header(), c, name)
	http.ServeContent(w, r, "", time.Time{}, c.File)
}

// mediaDownload serves a download; legacy: the unauthenticated one.
func (a *API) mediaDownload(legacy bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpx.ExtendWriteDeadline(w, transferTime, a.opts.WriteTimeout)
		if !legacy {
			if _, ok := a.authenticate(w, r); !ok {
				return
			}
		}
		server, id, timeout, err := mediaPath(r)
		var name string
		if err == nil && hasVar(r, "fileName") {
			if name, err = pathVar(r, "fileName"); err == nil {
				err = media.CheckFileName(name)
			}
		}
		if err != nil {
			httpx.Error(w, r, err)
			return
		}
		c, err := a.opts.Media.Download(r.Context(), server, id, legacy, timeout)
		if err != nil {
			httpx.Error(w, r, err)
			return
		}
		serveMedia(w, r, c, name)
	})
}

// mediaThumbnail serves a thumbnail; legacy: the unauthenticated one.
func (a *API) mediaThumbnail(legacy bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpx.ExtendWriteDeadline(w, transferTime, a.opts.WriteTimeout)
		if !legacy {
			if _, ok := a.authenticate(w, r); !ok {
				return
			}
		}
		server, id, timeout, err := mediaPath(r)
		var width, height int
		method := r.URL.Query().Get("method")
		if method == "" {
			method = "scale"
		}
		if err == nil {
			width, height, err = thumbnailSize(r)
		}
		if err != nil {
			httpx.Error(w, r, err)
			return
		}
		c, err := a.opts.Media.Thumbnail(r.Context(), server, id, width, height, method, legacy, timeout)
		if err != nil {
			httpx.Error(w, r, err)
			return
		}
		serveMedia(w, r, c, "")
	})
}

func hasVar(r *http.Request, name string) bool {
	_, ok := mux.Vars(r)[name]
	return ok
}

// thumbnailSize reads a thumbnail request's width and height.
func thumbnailSize(r *http.Request) (w, h int, err error) {
	q := r.URL.Query()
	for _, p := range []struct {
		name string
		v    *int
	}{{"width", &w}, {"height", &h}} {
		s := q.Get(p.name)
		if s == "" {
			return 0, 0, mxerr.MissingParam("%s is required", p.name)
		}
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 || n > 100000 {
			return 0, 0, mxerr.InvalidParam("%s must be a positive integer", p.name)
		}
		*p.v = n
	}
	return w, h, nil
}
