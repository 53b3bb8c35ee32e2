package media

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// remoteFetch is a fetch of remote media in progress: those who ask for
// the same media meanwhile wait for it instead of fetching it again.
type remoteFetch struct {
	done chan struct{}
	rec  storage.MediaRecord
	err  error
}

// remoteRecord returns a remote file's record, fetching the file from its
// origin when it is not cached. The unauthenticated endpoints, with
// authenticated media on, serve only what is cached and fetch nothing.
func (s *Service) remoteRecord(ctx context.Context, origin, mediaID string, legacy bool, timeout time.Duration) (storage.MediaRecord, error) {
	rec, err := s.store.Media(ctx, origin, mediaID)
	if err == nil && !rec.Pending() {
		return rec, nil
	}
	if err != nil && !errors.Is(err, storage.ErrNotFound) {
		return rec, err
	}
	if s.opts.Remote == nil || (legacy && s.opts.Authenticated) {
		return rec, mxerr.NotFound("media not found")
	}
	key := origin + "/" + mediaID
	s.mu.Lock()
	f := s.fetching[key]
	if f == nil {
		f = &remoteFetch{done: make(chan struct{})}
		s.fetching[key] = f
		s.mu.Unlock()
		// The fetch is everybody's: it does not end with this request.
		f.rec, f.err = s.fetch(context.WithoutCancel(ctx), origin, mediaID, timeout)
		s.mu.Lock()
		delete(s.fetching, key)
		close(f.done)
	}
	s.mu.Unlock()
	select {
	case <-f.done:
		return f.rec, f.err
	case <-ctx.Done():
		return rec, ctx.Err()
	}
}

// fetch downloads remote media with the federation media endpoint: a
// multipart/mixed answer of a JSON part (metadata, unused) and a part
// with either the bytes or a Location to fetch them from.
func (s *Service) fetch(ctx context.Context, origin, mediaID string, timeout time.Duration) (storage.MediaRecord, error) {
	if timeout < 0 || timeout > maxStall {
		timeout = maxStall
	}
	log := s.opts.Logger.WithFields(logrus.Fields{"origin": origin, "media_id": mediaID})
	path := "/_matrix/federation/v1/media/download/" + url.PathEscape(mediaID) +
		"?timeout_ms=" + strconv.FormatInt(timeout.Milliseconds(), 10)
	resp, err := s.opts.Remote.GetStream(ctx, origin, path)
	legacy := false
	if err != nil && unrecognized(err) {
		// A server older than the federation media endpoints: its media
		// API, as Synapse falls back to.
		legacy = true
		resp, err = s.opts.Remote.GetStream(ctx, origin, "/_matrix/media/v3/download/"+url.PathEscape(origin)+"/"+
			url.PathEscape(mediaID)+"?allow_remote=false&timeout_ms="+strconv.FormatInt(timeout.Milliseconds(), 10))
	}
	if err != nil {
		log.WithError(err).Info("fetching remote media failed")
		return storage.MediaRecord{}, remoteError(err)
	}
	defer resp.Body.Close()
	ct, body, name := resp.Header.Get("Content-Type"), io.ReadCloser(resp.Body), dispositionName(resp.Header.Get("Content-Disposition"))
	if !legacy {
		if ct, body, name, err = s.mediaPart(ctx, resp); err != nil {
			log.WithError(err).Info("remote media answer unusable")
			return storage.MediaRecord{}, mxerr.New(http.StatusBadGateway, "M_UNKNOWN", "the media's server answered with something unusable")
		}
	}
	defer body.Close()
	sha, size, err := s.files.put(body, s.opts.MaxUploadSize)
	switch {
	case errors.Is(err, errTooLarge):
		return storage.MediaRecord{}, mxerr.TooLarge("the remote media is larger than the limit of %d bytes", s.opts.MaxUploadSize)
	case errors.Is(err, errShortBody):
		log.WithError(err).Info("remote media cut short")
		return storage.MediaRecord{}, mxerr.New(http.StatusBadGateway, "M_UNKNOWN", "the media's server did not send it whole")
	case err != nil:
		return storage.MediaRecord{}, err
	}
	if CheckFileName(name) != nil {
		name = ""
	}
	rec := storage.MediaRecord{Origin: origin, MediaID: mediaID, ContentType: contentType(ct), UploadName: name,
		SHA256: sha, Size: size, CreatedTS: s.opts.Now().UnixMilli(), Authenticated: s.opts.Authenticated}
	if err := s.store.PutRemoteMedia(ctx, rec); err != nil {
		return rec, err
	}
	log.WithField("size", size).Debug("remote media cached")
	return rec, nil
}

// unrecognized tells whether a server answered that it does not know an
// endpoint: 404 or 405 without a Matrix error, or M_UNRECOGNIZED.
func unrecognized(err error) bool {
	var he interface {
		StatusCode() int
		ErrCode() string
	}
	if !errors.As(err, &he) {
		return false
	}
	switch he.StatusCode() {
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		return he.ErrCode() == "" || he.ErrCode() == "M_UNRECOGNIZED"
	case http.StatusBadRequest:
		return he.ErrCode() == "M_UNRECOGNIZED"
	}
	return false
}

// remoteError is what a client is told of a failed fetch.
func remoteError(err error) error {
	var status interface{ StatusCode() int }
	if errors.As(err, &status) {
		switch status.StatusCode() {
		case http.StatusNotFound:
			return mxerr.NotFound("media not found on its server")
		case http.StatusRequestEntityTooLarge:
			return mxerr.TooLarge("the media's server refused to send it: too large")
		}
	}
	return mxerr.New(http.StatusBadGateway, "M_UNKNOWN", "the media could not be fetched from its server")
}

// mediaPart reads a federation media answer up to its content: its
// type, a reader of its bytes and its file name.
func (s *Service) mediaPart(ctx context.Context, resp *http.Response) (string, io.ReadCloser, string, error) {
	mt, params, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/mixed" || params["boundary"] == "" {
		return "", nil, "", fmt.Errorf("answer is %q, not multipart/mixed", resp.Header.Get("Content-Type"))
	}
	mr := multipart.NewReader(resp.Body, params["boundary"])
	meta, err := mr.NextRawPart()
	if err != nil {
		return "", nil, "", fmt.Errorf("no metadata part: %w", err)
	}
	if _, err := io.Copy(io.Discard, io.LimitReader(meta, 64<<10)); err != nil {
		return "", nil, "", err
	}
	part, err := mr.NextRawPart()
	if err != nil {
		return "", nil, "", fmt.Errorf("no content part: %w", err)
	}
	if loc := part.Header.Get("Location"); loc != "" {
		return s.fetchURL(ctx, loc)
	}
	return part.Header.Get("Content-Type"), io.NopCloser(part), dispositionName(part.Header.Get("Content-Disposition")), nil
}

// fetchURL follows a media answer's Location, through the URL client
// (the outbound address policy).
func (s *Service) fetchURL(ctx context.Context, loc string) (string, io.ReadCloser, string, error) {
	u, err := url.Parse(loc)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return "", nil, "", fmt.Errorf("bad Location %q", loc)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", nil, "", err
	}
	resp, err := s.opts.URLClient.Do(req)
	if err != nil {
		return "", nil, "", err
	}
	if resp.StatusCode/100 != 2 {
		resp.Body.Close()
		return "", nil, "", fmt.Errorf("Location answered %d", resp.StatusCode)
	}
	return resp.Header.Get("Content-Type"), resp.Body, dispositionName(resp.Header.Get("Content-Disposition")), nil
}

// dispositionName is the file name of a Content-Disposition header (""
// when none), filename* (RFC 5987) preferred.
func dispositionName(h string) string {
	if h == "" {
		return ""
	}
	_, params, err := mime.ParseMediaType(h)
	if err != nil {
		return ""
	}
	return params["filename"]
}
