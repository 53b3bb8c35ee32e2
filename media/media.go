// Package media is the content repository: uploads (at once, or to an ID
// reserved first), downloads and thumbnails of local media, remote media
// fetched from its origin over federation and cached, and URL previews.
// Bytes are kept in files named by their SHA-256 (see files); what is
// known of each piece of media is in the database (Store).
package media

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/sirupsen/logrus"
	"golang.org/x/sync/singleflight"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/ratelimit"
	"github.com/keyserver/keyserver/storage"
)

// Store is what the media repository keeps in the database.
type Store interface {
	// Media returns a record, or storage.ErrNotFound.
	Media(ctx context.Context, origin, mediaID string) (storage.MediaRecord, error)
	// AddMedia stores a new record: storage.ErrMediaExists when its ID
	// is taken.
	AddMedia(ctx context.Context, m storage.MediaRecord) error
	// PutRemoteMedia stores or replaces a cached remote file's record.
	PutRemoteMedia(ctx context.Context, m storage.MediaRecord) error
	// ReserveMedia stores a reserved ID unless its user holds max
	// unexpired ones already (then it returns false and when the
	// earliest expires), removing the expired reservations first.
	ReserveMedia(ctx context.Context, m storage.MediaRecord, max int, now int64) (bool, int64, error)
	// FillMedia gives a reserved ID of its user its content:
	// storage.ErrNotFound when there is no such unexpired reservation,
	// storage.ErrMediaNotPending when it has content already.
	FillMedia(ctx context.Context, m storage.MediaRecord, now int64) error
	MediaThumbnail(ctx context.Context, origin, mediaID string, width, height int, method string) (storage.MediaThumbnail, error)
	PutMediaThumbnail(ctx context.Context, t storage.MediaThumbnail) error
}

// Remote fetches from other servers: a signed federation GET whose
// answer is read as a stream (fedclient.Client).
type Remote interface {
	GetStream(ctx context.Context, dest, path string) (*http.Response, error)
}

// Options configure the repository.
type Options struct {
	ServerName string
	// Dir holds the files.
	Dir string
	// MaxUploadSize caps an upload, and a remote file fetched. Default 50 MiB.
	MaxUploadSize int64
	// MaxPendingUploads caps the reserved IDs a user holds unfilled
	// (default 5); UnusedExpiry is how long one stays usable (default 24h).
	MaxPendingUploads int
	UnusedExpiry      time.Duration
	// UploadLimit bounds each user's uploads and reservations; nil: none.
	UploadLimit *ratelimit.Limiter
	// Authenticated marks new media as served by the authenticated
	// endpoints only; the unauthenticated ones then answer 404 for it.
	Authenticated bool
	// MaxImagePixels is the largest image thumbnailed (default 32M pixels).
	MaxImagePixels int64
	// Remote fetches other servers' media; nil: none is fetched.
	Remote Remote
	// URLClient fetches plain URLs (redirects of remote media, previews);
	// it must enforce the outbound address policy.
	URLClient *http.Client
	// URLPreviews turns /preview_url on; PreviewMaxBytes caps what is
	// read of a page (default 10 MiB).
	URLPreviews     bool
	PreviewMaxBytes int64
	Logger          logrus.FieldLogger
	Now             func() time.Time
}

// Service is the media repository.
type Service struct {
	store Store
	opts  Options
	files files

	mu       sync.Mutex
	filled   map[string]chan struct{} // reserved IDs being waited for
	fetching map[string]*remoteFetch  // remote media being fetched
	thumbing map[string]*sync.Mutex   // thumbnails being made

	previews   previewCache
	previewing singleflight.Group // URLs being fetched for a preview
}

// New makes the repository; its directory is created when missing.
func New(store Store, o Options) (*Service, error) {
	if o.MaxUploadSize <= 0 {
		o.MaxUploadSize = 50 << 20
	}
	if o.MaxPendingUploads <= 0 {
		o.MaxPendingUploads = 5
	}
	if o.UnusedExpiry <= 0 {
		o.UnusedExpiry = 24 * time.Hour
	}
	if o.MaxImagePixels <= 0 {
		o.MaxImagePixels = 32_000_000
	}
	if o.PreviewMaxBytes <= 0 {
		o.PreviewMaxBytes = 10 << 20
	}
	if o.Logger == nil {
		o.Logger = logrus.StandardLogger()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.URLClient == nil {
		// Nothing is fetched without a client that enforces the outbound
		// address policy.
		o.URLClient = &http.Client{Transport: refuseAll{}}
	}
	if err := os.MkdirAll(filepath.Join(o.Dir, "tmp"), 0o700); err != nil {
		return nil, fmt.Errorf("media directory: %w", err)
	}
	return &Service{store: store, opts: o, files: files{dir: o.Dir},
		filled: map[string]chan struct{}{}, fetching: map[string]*remoteFetch{}, thumbing: map[string]*sync.Mutex{}}, nil
}

// Config is the answer of /media/config.
func (s *Service) Config() map[string]any {
	return map[string]any{"m.upload.size": s.opts.MaxUploadSize}
}

// refuseAll is the transport of a repository given no URL client.
type refuseAll struct{}

func (refuseAll) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("no URL client is configured")
}

// Content is media ready to be sent: the caller closes File.
type Content struct {
	ContentType string
	UploadName  string
	Size        int64
	File        *os.File
}

// Upload is a request to store content.
type Upload struct {
	UserID string
	Body   io.Reader
	// Length is the declared Content-Length (-1: none).
	Length      int64
	ContentType string
	FileName    string
}

// mediaIDPattern is what a media ID may hold: the spec's
// [A-Za-z0-9_-], which no path trick gets through.
var mediaIDPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,255}$`)

// CheckID refuses a server name or media ID that cannot be a real one.
func CheckID(serverName, mediaID string) error {
	if _, _, ok := spec.ParseAndValidateServerName(spec.ServerName(serverName)); !ok {
		return mxerr.InvalidParam("invalid server name %q", serverName)
	}
	if !mediaIDPattern.MatchString(mediaID) {
		return mxerr.InvalidParam("invalid media ID: it may hold only letters, digits, '_' and '-'")
	}
	return nil
}

// CheckFileName refuses a file name that is no plain name: empty or too
// long, with a path separator, '.' or '..', or control characters.
func CheckFileName(name string) error {
	if name == "" {
		return nil
	}
	bad := len(name) > 255 || name == "." || name == ".." || strings.ContainsAny(name, "/\\") ||
		strings.ContainsFunc(name, unicode.IsControl) || !validUTF8(name)
	if bad {
		return mxerr.InvalidParam("invalid file name: it must be a plain name without path separators or control characters")
	}
	return nil
}

func validUTF8(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

const idAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

func newMediaID() string {
	b := make([]byte, 24)
	for i := range b {
		n, err := rand.Int(rand.Reader, big.NewInt(int64(len(idAlphabet))))
		if err != nil {
			panic(err)
		}
		b[i] = idAlphabet[n.Int64()]
	}
	return string(b)
}

func (s *Service) mxc(mediaID string) string { return "mxc://" + s.opts.ServerName + "/" + mediaID }

func (s *Service) limit(userID string) error {
	if ok, wait := s.opts.UploadLimit.Allow(userID); !ok {
		return mxerr.LimitExceeded(wait)
	}
	return nil
}

// checkUpload refuses an upload before its body is read.
func (s *Service) checkUpload(u Upload) error {
	if err := CheckFileName(u.FileName); err != nil {
		return err
	}
	if u.Length > s.opts.MaxUploadSize {
		return mxerr.TooLarge("the upload is larger than the limit of %d bytes", s.opts.MaxUploadSize)
	}
	return nil
}

// store writes an upload's bytes.
func (s *Service) storeBody(u Upload) (sha string, size int64, err error) {
	sha, size, err = s.files.put(u.Body, s.opts.MaxUploadSize)
	switch {
	case errors.Is(err, errTooLarge):
		return "", 0, mxerr.TooLarge("the upload is larger than the limit of %d bytes", s.opts.MaxUploadSize)
	case errors.Is(err, errShortBody):
		return "", 0, mxerr.Unknown("the upload's body could not be read to its end")
	case err != nil:
		return "", 0, err
	}
	if u.Length >= 0 && size != u.Length {
		return "", 0, mxerr.Unknown("the upload's body is %d bytes, not its Content-Length of %d", size, u.Length)
	}
	return sha, size, nil
}

func contentType(ct string) string {
	if ct == "" {
		return "application/octet-stream"
	}
	return ct
}

// Upload stores content under a new media ID and returns its mxc URI.
func (s *Service) Upload(ctx context.Context, u Upload) (string, error) {
	if err := s.checkUpload(u); err != nil {
		return "", err
	}
	if err := s.limit(u.UserID); err != nil {
		return "", err
	}
	sha, size, err := s.storeBody(u)
	if err != nil {
		return "", err
	}
	for {
		rec := storage.MediaRecord{Origin: s.opts.ServerName, MediaID: newMediaID(), UserID: u.UserID,
			ContentType: contentType(u.ContentType), UploadName: u.FileName, SHA256: sha, Size: size,
			CreatedTS: s.opts.Now().UnixMilli(), Authenticated: s.opts.Authenticated}
		err := s.store.AddMedia(ctx, rec)
		if errors.Is(err, storage.ErrMediaExists) {
			continue
		}
		if err != nil {
			return "", err
		}
		s.opts.Logger.WithFields(logrus.Fields{"media_id": rec.MediaID, "size": size, "user_id": u.UserID}).Debug("media uploaded")
		return s.mxc(rec.MediaID), nil
	}
}

// Create reserves a media ID for an upload to come, and returns its mxc
// URI and when it expires unused (milliseconds).
func (s *Service) Create(ctx context.Context, userID string) (string, int64, error) {
	if err := s.limit(userID); err != nil {
		return "", 0, err
	}
	now := s.opts.Now().UnixMilli()
	for {
		rec := storage.MediaRecord{Origin: s.opts.ServerName, MediaID: newMediaID(), UserID: userID,
			CreatedTS: now, ExpiresTS: now + s.opts.UnusedExpiry.Milliseconds(), Authenticated: s.opts.Authenticated}
		ok, earliest, err := s.store.ReserveMedia(ctx, rec, s.opts.MaxPendingUploads, now)
		if errors.Is(err, storage.ErrMediaExists) {
			continue
		}
		if err != nil {
			return "", 0, err
		}
		if !ok {
			e := mxerr.LimitExceeded(time.Duration(max(earliest-now, 0)) * time.Millisecond)
			e.Message = fmt.Sprintf("too many media IDs reserved and not yet uploaded to (at most %d)", s.opts.MaxPendingUploads)
			return "", 0, e
		}
		return s.mxc(rec.MediaID), rec.ExpiresTS, nil
	}
}

// UploadTo fills a media ID reserved by Create. Only the user who
// reserved it may, once, before it expires; the checks come before the
// body is read.
func (s *Service) UploadTo(ctx context.Context, serverName, mediaID string, u Upload) error {
	if err := CheckID(serverName, mediaID); err != nil {
		return err
	}
	if serverName != s.opts.ServerName {
		return mxerr.NotFound("media of other servers cannot be uploaded to here")
	}
	rec, err := s.store.Media(ctx, serverName, mediaID)
	now := s.opts.Now().UnixMilli()
	switch {
	case errors.Is(err, storage.ErrNotFound):
		return mxerr.NotFound("unknown media ID")
	case err != nil:
		return err
	case rec.UserID != u.UserID:
		return mxerr.Forbidden("this media ID was reserved by another user")
	case !rec.Pending():
		return mxerr.New(http.StatusConflict, "M_CANNOT_OVERWRITE_MEDIA", "this media ID already has content")
	case rec.ExpiresTS <= now:
		return mxerr.NotFound("this media ID expired unused")
	}
	if err := s.checkUpload(u); err != nil {
		return err
	}
	if err := s.limit(u.UserID); err != nil {
		return err
	}
	sha, size, err := s.storeBody(u)
	if err != nil {
		return err
	}
	rec.ContentType, rec.UploadName, rec.SHA256, rec.Size = contentType(u.ContentType), u.FileName, sha, size
	switch err := s.store.FillMedia(ctx, rec, s.opts.Now().UnixMilli()); {
	case errors.Is(err, storage.ErrMediaNotPending):
		return mxerr.New(http.StatusConflict, "M_CANNOT_OVERWRITE_MEDIA", "this media ID already has content")
	case errors.Is(err, storage.ErrNotFound):
		return mxerr.NotFound("this media ID expired unused")
	case err != nil:
		return err
	}
	s.forgetWaiters(mediaID)
	return nil
}

// forgetWaiters wakes the downloads waiting for a reserved ID's content:
// it has arrived, or it never will.
func (s *Service) forgetWaiters(mediaID string) {
	s.mu.Lock()
	if ch := s.filled[mediaID]; ch != nil {
		close(ch)
		delete(s.filled, mediaID)
	}
	s.mu.Unlock()
}

// maxStall caps how long a download waits for a reserved ID's content.
const maxStall = 20 * time.Second

// localRecord returns a local media record with content, waiting up to
// timeout for a reserved ID to be filled (negative: the default, 20 s).
func (s *Service) localRecord(ctx context.Context, mediaID string, timeout time.Duration) (storage.MediaRecord, error) {
	if timeout < 0 || timeout > maxStall {
		timeout = maxStall
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		rec, err := s.store.Media(ctx, s.opts.ServerName, mediaID)
		if errors.Is(err, storage.ErrNotFound) || (err == nil && rec.Pending() && rec.ExpiresTS <= s.opts.Now().UnixMilli()) {
			s.forgetWaiters(mediaID)
			return rec, mxerr.NotFound("media not found")
		}
		if err != nil || !rec.Pending() {
			return rec, err
		}
		s.mu.Lock()
		ch := s.filled[mediaID]
		if ch == nil {
			ch = make(chan struct{})
			s.filled[mediaID] = ch
		}
		s.mu.Unlock()
		// Another daemon on the same database may fill it: look again now
		// and then as well.
		recheck := time.NewTimer(time.Second)
		select {
		case <-ch:
		case <-recheck.C:
		case <-deadline.C:
			recheck.Stop()
			return rec, mxerr.New(http.StatusGatewayTimeout, "M_NOT_YET_UPLOADED", "the media has not been uploaded yet")
		case <-ctx.Done():
			recheck.Stop()
			return rec, ctx.Err()
		}
		recheck.Stop()
	}
}

// Download returns a piece of media: local, or remote (fetched from its
// origin when not cached). legacy is a request to the unauthenticated
// endpoints, which serve only media not marked authenticated.
func (s *Service) Download(ctx context.Context, serverName, mediaID string, legacy bool, timeout time.Duration) (*Content, error) {
	rec, err := s.record(ctx, serverName, mediaID, legacy, timeout)
	if err != nil {
		return nil, err
	}
	return s.open(rec)
}

// record finds (or fetches) a piece of media's record.
func (s *Service) record(ctx context.Context, serverName, mediaID string, legacy bool, timeout time.Duration) (storage.MediaRecord, error) {
	if err := CheckID(serverName, mediaID); err != nil {
		return storage.MediaRecord{}, err
	}
	var rec storage.MediaRecord
	var err error
	if serverName == s.opts.ServerName {
		rec, err = s.localRecord(ctx, mediaID, timeout)
	} else {
		rec, err = s.remoteRecord(ctx, serverName, mediaID, legacy, timeout)
	}
	if err != nil {
		return rec, err
	}
	if legacy && rec.Authenticated {
		return rec, mxerr.NotFound("media not found: it is served by the authenticated media endpoints only")
	}
	return rec, nil
}

func (s *Service) open(rec storage.MediaRecord) (*Content, error) {
	f, err := s.files.open(rec.SHA256)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			s.opts.Logger.WithFields(logrus.Fields{"origin": rec.Origin, "media_id": rec.MediaID}).Warn("the file of a piece of media is missing")
			return nil, mxerr.NotFound("media not found")
		}
		return nil, err
	}
	return &Content{ContentType: rec.ContentType, UploadName: rec.UploadName, Size: rec.Size, File: f}, nil
}

// FederationDownload serves local media to another server.
func (s *Service) FederationDownload(ctx context.Context, mediaID string, timeout time.Duration) (*Content, error) {
	if !mediaIDPattern.MatchString(mediaID) {
		return nil, mxerr.InvalidParam("invalid media ID")
	}
	rec, err := s.localRecord(ctx, mediaID, timeout)
	if err != nil {
		return nil, err
	}
	return s.open(rec)
}
