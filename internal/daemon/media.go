package daemon

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
func newMedia(cfg *config.Config, store media.Store, fed *fedclient.Client, log *logrus.Logger) (*media.Service, error) {
	m := cfg.Media
	return media.New(store, media.Options{
		ServerName:        cfg.ServerName,
		Dir:               cfg.MediaPath(),
		MaxUploadSize:     m.MaxUploadSize,
		MaxPendingUploads: m.MaxPendingUploads,
		UnusedExpiry:      m.UnusedExpiration.Duration(),
		UploadLimit:       limiter(m.UploadRateLimit),
		Authenticated:     m.EnableAuthenticatedMedia,
		MaxImagePixels:    m.MaxImagePixels,
		Remote:            fed,
		URLClient:         fed.URLClient(30 * time.Second),
		URLPreviews:       m.URLPreviewEnabled,
		PreviewMaxBytes:   m.URLPreviewMaxSize,
		Logger:            log,
	})
}
