package media

import (
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/html"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// previewTimeout bounds fetching a page to preview.
const previewTimeout = 10 * time.Second

// A preview is kept for previewCacheTTL (Synapse's hour) and answered to
// every user asking for the same URL meanwhile; at most previewCacheSize
// are kept, the oldest going first.
const (
	previewCacheTTL  = time.Hour
	previewCacheSize = 1000
)

type previewCache struct {
	mu      sync.Mutex
	entries map[string]cachedPreview
	order   []string // keys, oldest first
}

type cachedPreview struct {
	og      map[string]any
	expires time.Time
}

func (c *previewCache) get(key string, now time.Time) (map[string]any, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if !ok || now.After(e.expires) {
		return nil, false
	}
	return e.og, true
}

func (c *previewCache) put(key string, og map[string]any, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = map[string]cachedPreview{}
	}
	if _, ok := c.entries[key]; !ok {
		c.order = append(c.order, key)
	}
	c.entries[key] = cachedPreview{og: og, expires: now.Add(previewCacheTTL)}
	for len(c.order) > previewCacheSize {
		delete(c.entries, c.order[0])
		c.order = c.order[1:]
	}
}

// PreviewURL describes a web page for a link preview: its OpenGraph
// properties (og:title, og:description, og:image...), with the title
// and description meta tags in their stead when absent. An image URL is
// stored as media and described as og:image. The page is fetched through
// the URL client, that is the outbound address policy: a private address
// is refused like an unreachable server. At most PreviewMaxBytes of a
// page are read.
func (s *Service) PreviewURL(ctx context.Context, userID, raw string) (map[string]any, error) {
	if !s.opts.URLPreviews {
		return nil, mxerr.New(http.StatusNotFound, "M_UNRECOGNIZED", "URL previews are disabled on this server")
	}
	if raw == "" {
		return nil, mxerr.MissingParam("url is required")
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return nil, mxerr.InvalidParam("url must be an http or https URL")
	}
	key := u.String()
	if og, ok := s.previews.get(key, s.opts.Now()); ok {
		return og, nil
	}
	if err := s.limit(userID); err != nil {
		return nil, err
	}
	// Users asking at once for one URL share one fetch.
	v, err, _ := s.previewing.Do(key, func() (any, error) {
		og, err := s.fetchPreview(context.WithoutCancel(ctx), userID, u)
		if err == nil {
			s.previews.put(key, og, s.opts.Now())
		}
		return og, err
	})
	if err != nil {
		return nil, err
	}
	return v.(map[string]any), nil
}

// fetchPreview fetches a URL and describes it.
func (s *Service) fetchPreview(ctx context.Context, userID string, u *url.URL) (map[string]any, error) {
	ctx, cancel := context.WithTimeout(ctx, previewTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, mxerr.InvalidParam("url must be an http or https URL")
	}
	req.Header.Set("User-Agent", "keyserver URL preview")
	req.Header.Set("Accept", "text/html, image/*;q=0.9, */*;q=0.5")
	log := s.opts.Logger.WithField("host", u.Hostname())
	resp, err := s.opts.URLClient.Do(req)
	if err != nil {
		log.WithError(err).Info("URL preview: fetch failed")
		return nil, mxerr.New(http.StatusBadGateway, "M_UNKNOWN", "the URL could not be fetched")
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return nil, mxerr.New(http.StatusBadGateway, "M_UNKNOWN", "the URL answered %d", resp.StatusCode)
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch {
	case strings.HasPrefix(mt, "image/"):
		return s.previewImage(ctx, userID, mt, resp.Body)
	case mt == "text/html" || mt == "application/xhtml+xml":
		og := openGraph(io.LimitReader(resp.Body, s.opts.PreviewMaxBytes))
		s.previewPageImage(ctx, userID, resp.Request.URL, og)
		log.WithField("properties", len(og)).Debug("URL preview made")
		return og, nil
	default:
		return map[string]any{}, nil
	}
}

// previewPageImage replaces a page's og:image URL by the image stored as
// media (og:image as an mxc URI, with its type and size), as clients show
// it; an image that cannot be fetched is left out.
func (s *Service) previewPageImage(ctx context.Context, userID string, page *url.URL, og map[string]any) {
	raw, _ := og["og:image"].(string)
	if raw == "" {
		return
	}
	delete(og, "og:image")
	u, err := page.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.User != nil {
		return
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return
	}
	resp, err := s.opts.URLClient.Do(req)
	if err != nil {
		s.opts.Logger.WithError(err).WithField("host", u.Hostname()).Debug("URL preview: the page's image could not be fetched")
		return
	}
	defer resp.Body.Close()
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if resp.StatusCode/100 != 2 || !strings.HasPrefix(mt, "image/") {
		return
	}
	img, err := s.previewImage(ctx, userID, mt, resp.Body)
	if err != nil {
		return
	}
	for k, v := range img {
		og[k] = v
	}
}

// previewImage stores an image linked to as media of the server.
func (s *Service) previewImage(ctx context.Context, userID, mt string, body io.Reader) (map[string]any, error) {
	sha, size, err := s.files.put(body, min(s.opts.MaxUploadSize, s.opts.PreviewMaxBytes))
	switch {
	case errors.Is(err, errTooLarge):
		return nil, mxerr.New(http.StatusBadGateway, "M_TOO_LARGE", "the image linked to is too large")
	case errors.Is(err, errShortBody):
		return nil, mxerr.New(http.StatusBadGateway, "M_UNKNOWN", "the image linked to could not be read")
	case err != nil:
		return nil, err
	}
	for {
		rec := storage.MediaRecord{Origin: s.opts.ServerName, MediaID: newMediaID(), UserID: userID, ContentType: mt,
			SHA256: sha, Size: size, CreatedTS: s.opts.Now().UnixMilli(), Authenticated: s.opts.Authenticated}
		err := s.store.AddMedia(ctx, rec)
		if errors.Is(err, storage.ErrMediaExists) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return map[string]any{"og:image": s.mxc(rec.MediaID), "og:image:type": mt, "matrix:image:size": size}, nil
	}
}

// openGraph reads a page's OpenGraph properties (<meta property="og:...">),
// with <title> and <meta name="description"> as og:title and
// og:description when the page has none.
func openGraph(r io.Reader) map[string]any {
	og := map[string]any{}
	var title, description string
	z := html.NewTokenizer(r)
	inTitle := false
	for {
		tt := z.Next()
		switch tt {
		case html.ErrorToken:
			if _, ok := og["og:title"]; !ok && title != "" {
				og["og:title"] = strings.TrimSpace(title)
			}
			if _, ok := og["og:description"]; !ok && description != "" {
				og["og:description"] = description
			}
			return og
		case html.StartTagToken, html.SelfClosingTagToken:
			name, hasAttr := z.TagName()
			switch string(name) {
			case "title":
				inTitle = tt == html.StartTagToken && title == ""
			case "meta":
				var prop, metaName, content string
				for hasAttr {
					var k, v []byte
					k, v, hasAttr = z.TagAttr()
					switch string(k) {
					case "property":
						prop = string(v)
					case "name":
						metaName = strings.ToLower(string(v))
					case "content":
						content = string(v)
					}
				}
				if strings.HasPrefix(prop, "og:") && len(og) < 50 {
					if _, seen := og[prop]; !seen {
						og[prop] = truncate(content, 1000)
					}
				}
				if metaName == "description" && description == "" {
					description = truncate(content, 1000)
				}
			}
		case html.TextToken:
			if inTitle {
				title += string(z.Text())
				if len(title) > 1000 {
					title = truncate(title, 1000)
				}
			}
		case html.EndTagToken:
			if name, _ := z.TagName(); string(name) == "title" {
				inTitle = false
			}
		}
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !validUTF8(s) {
		s = s[:len(s)-1]
	}
	return s
}
