package config

import (
	"path/filepath"
	"time"
)

// MediaConfig is the "media" section: the content repository.
type MediaConfig struct {
	// Path is the directory of media files; empty means <data_dir>/media.
	// Use MediaPath for the effective value.
	Path string `yaml:"path"`
	// MaxUploadSize caps an upload, and a remote file fetched, in bytes.
	// Default 50 MiB (Synapse's max_upload_size).
	MaxUploadSize int64 `yaml:"max_upload_size"`
	// UploadRateLimit bounds each user's uploads and reserved media IDs.
	// Default 10 per second after a burst of 50 (Synapse's rc_media_create).
	UploadRateLimit RateLimit `yaml:"upload_rate_limit"`
	// MaxPendingUploads caps the media IDs a user may hold reserved
	// (POST /_matrix/media/v1/create) and not yet uploaded to. Default 5.
	MaxPendingUploads int `yaml:"max_pending_uploads"`
	// UnusedExpiration is how long a reserved media ID may wait for its
	// upload. Default 24h.
	UnusedExpiration Duration `yaml:"unused_expiration_time"`
	// EnableAuthenticatedMedia marks new media as served only by the
	// authenticated endpoints (/_matrix/client/v1/media/...): the
	// unauthenticated /_matrix/media/.../download and thumbnail answer
	// 404 for it, and fetch no remote media. Default true.
	EnableAuthenticatedMedia bool `yaml:"enable_authenticated_media"`
	// MaxImagePixels is the largest image, in pixels, thumbnailed.
	// Default 32000000.
	MaxImagePixels int64 `yaml:"max_image_pixels"`
	// URLPreviewEnabled serves GET /_matrix/client/v1/media/preview_url.
	// Pages are fetched through federation.ip_range_denylist and
	// ip_range_allowlist. Default false.
	URLPreviewEnabled bool `yaml:"url_preview_enabled"`
	// URLPreviewMaxSize caps what is read of a page to preview, in
	// bytes. Default 10 MiB.
	URLPreviewMaxSize int64 `yaml:"url_preview_max_size"`
}

func defaultMedia() MediaConfig {
	return MediaConfig{
		MaxUploadSize:            50 << 20,
		UploadRateLimit:          RateLimit{PerSecond: 10, Burst: 50},
		MaxPendingUploads:        5,
		UnusedExpiration:         Duration(24 * time.Hour),
		EnableAuthenticatedMedia: true,
		MaxImagePixels:           32_000_000,
		URLPreviewMaxSize:        10 << 20,
	}
}

// MediaPath is the effective media directory.
func (c *Config) MediaPath() string {
	if c.Media.Path != "" {
		return c.Media.Path
	}
	return filepath.Join(c.DataDir, "media")
}

func (c *Config) validateMedia(add func(format string, args ...any)) {
	m := c.Media
	if m.MaxUploadSize <= 0 {
		add("media.max_upload_size must be positive, not %d", m.MaxUploadSize)
	}
	if m.MaxPendingUploads <= 0 {
		add("media.max_pending_uploads must be positive, not %d", m.MaxPendingUploads)
	}
	if m.UnusedExpiration <= 0 {
		add("media.unused_expiration_time must be positive, not %s", m.UnusedExpiration)
	}
	if m.MaxImagePixels <= 0 {
		add("media.max_image_pixels must be positive, not %d", m.MaxImagePixels)
	}
	if m.URLPreviewMaxSize <= 0 {
		add("media.url_preview_max_size must be positive, not %d", m.URLPreviewMaxSize)
	}
	if m.UploadRateLimit.PerSecond < 0 || m.UploadRateLimit.Burst < 0 {
		add("media.upload_rate_limit must not be negative")
	}
}
