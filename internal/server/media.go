package server

import (
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/media"
)

// newMedia makes the content repository the configuration describes. Its
// URL fetches (remote media redirects, previews) go through the
// federation client's address policy.
func newMedia(cfg *config.Config, store media.Store, fed *fedclient.Client, log *logrus.Logger, now func() time.Time) (*media.Service, error) {
	m := cfg.Media
	o := media.Options{
		ServerName:        cfg.ServerName,
		Dir:               cfg.MediaPath(),
		MaxUploadSize:     m.MaxUploadSize,
		MaxPendingUploads: m.MaxPendingUploads,
		UnusedExpiry:      m.UnusedExpiration.Duration(),
		UploadLimit:       limiter(m.UploadRateLimit, now),
		Authenticated:     m.EnableAuthenticatedMedia,
		MaxImagePixels:    m.MaxImagePixels,
		URLPreviews:       m.URLPreviewEnabled,
		PreviewMaxBytes:   m.URLPreviewMaxSize,
		Logger:            log,
	}
	if fed != nil { // without federation no remote media is fetched
		o.Remote, o.URLClient = fed, fed.URLClient(30*time.Second)
	}
	return media.New(store, o)
}
