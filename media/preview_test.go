package media_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

func preview(t *testing.T, n *testutil.Node, token, target string) answer {
	t.Helper()
	return do(t, n, "GET", "/_matrix/client/v1/media/preview_url?url="+url.QueryEscape(target), token, nil, nil)
}

// URL previews are off unless configured; when on, a page's OpenGraph
// properties are read (within the size cap), an image is stored as
// media, and private addresses are not fetched.
func TestURLPreview(t *testing.T) {
	var hits, pageHits atomic.Int32
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		switch r.URL.Path {
		case "/page":
			pageHits.Add(1)
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = w.Write([]byte(`<html><head><title>Plain title</title>
				<meta property="og:title" content="The OG title">
				<meta name="description" content="A description">
				<meta property="og:site_name" content="Example">
				<meta property="og:image" content="/image"></head><body>hi</body></html>`))
		case "/broken-image":
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write([]byte(`<meta property="og:title" content="T"><meta property="og:image" content="/nowhere">`))
		case "/plain":
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write([]byte(`<html><head><title> Only a title </title><meta name="description" content="Only a description"></head></html>`))
		case "/late":
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write([]byte(`<html><head><!--` + strings.Repeat("x", 4096) + `--><meta property="og:title" content="Too far"></head></html>`))
		case "/image":
			w.Header().Set("Content-Type", "image/png")
			_, _ = w.Write(encodePNG(t, halves(8, 8)))
		default:
			http.NotFound(w, r)
		}
	}))
	defer site.Close()

	off := startNode(t, testutil.SQLite(t), nil)
	u := off.Register(t, "user", "")
	if a := preview(t, off, u.Token, site.URL+"/page"); a.Status != http.StatusNotFound || a.errcode() != "M_UNRECOGNIZED" {
		t.Errorf("previews off: %d %s", a.Status, a.Body)
	}
	if hits.Load() != 0 {
		t.Error("a page was fetched with previews off")
	}

	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := startNode(t, db, func(c *config.Config) {
			c.Media.URLPreviewEnabled = true
			c.Media.URLPreviewMaxSize = 2048
		})
		u := n.Register(t, "user", "")
		a := preview(t, n, u.Token, site.URL+"/page")
		if a.Status != http.StatusOK {
			t.Fatalf("preview: %d %s", a.Status, a.Body)
		}
		og := a.json(t)
		if og["og:title"] != "The OG title" || og["og:site_name"] != "Example" || og["og:description"] != "A description" {
			t.Errorf("preview: %v", og)
		}
		// The page's image is stored here and named by its mxc URI.
		server, id := splitMXC(t, og["og:image"])
		if og["og:image:type"] != "image/png" || og["matrix:image:size"] == nil {
			t.Errorf("page image: %v", og)
		}
		if d := download(t, n, u.Token, server, id); d.Status != http.StatusOK || d.Header.Get("Content-Type") != "image/png" {
			t.Errorf("the page's image: %d %s", d.Status, d.Body)
		}
		// The preview is kept: another user asking for the same page gets
		// it without a second fetch.
		fetched := pageHits.Load()
		other := n.Register(t, "other", "")
		if again := preview(t, n, other.Token, site.URL+"/page").json(t); again["og:title"] != "The OG title" || again["og:image"] != og["og:image"] {
			t.Errorf("the kept preview: %v", again)
		}
		if pageHits.Load() != fetched {
			t.Error("the page was fetched again within the hour")
		}
		if og := preview(t, n, u.Token, site.URL+"/broken-image").json(t); og["og:title"] != "T" || og["og:image"] != nil {
			t.Errorf("preview with an image that cannot be fetched: %v", og)
		}
		og = preview(t, n, u.Token, site.URL+"/plain").json(t)
		if og["og:title"] != "Only a title" || og["og:description"] != "Only a description" {
			t.Errorf("preview from title and description: %v", og)
		}
		if og := preview(t, n, u.Token, site.URL+"/late").json(t); og["og:title"] != nil {
			t.Errorf("a property beyond the size cap was read: %v", og)
		}
		og = preview(t, n, u.Token, site.URL+"/image").json(t)
		server, id = splitMXC(t, og["og:image"])
		if og["og:image:type"] != "image/png" {
			t.Errorf("image preview: %v", og)
		}
		if d := download(t, n, u.Token, server, id); d.Status != http.StatusOK || d.Header.Get("Content-Type") != "image/png" {
			t.Errorf("the previewed image: %d %s", d.Status, d.Body)
		}
		for _, bad := range []string{"", "ftp://example.org/", "file:///etc/passwd", "http://user:pw@example.org/"} {
			if a := preview(t, n, u.Token, bad); a.Status != http.StatusBadRequest {
				t.Errorf("url %q: %d %s", bad, a.Status, a.Body)
			}
		}
		if a := preview(t, n, "", site.URL+"/page"); a.Status != http.StatusUnauthorized {
			t.Errorf("preview without a token: %d", a.Status)
		}
	})

	// With the default policy loopback is denied: nothing is fetched.
	strict := startNode(t, testutil.SQLite(t), func(c *config.Config) {
		c.Media.URLPreviewEnabled = true
		c.Federation.IPRangeAllowlist = []string{}
	})
	v := strict.Register(t, "user", "")
	before := hits.Load()
	for _, target := range []string{site.URL + "/page", strings.Replace(site.URL, "127.0.0.1", "localhost", 1) + "/page"} {
		a := preview(t, strict, v.Token, target)
		if a.Status != http.StatusBadGateway || strings.Contains(string(a.Body), "127.0.0.1") {
			t.Errorf("preview of %s on a private address: %d %s", target, a.Status, a.Body)
		}
	}
	if hits.Load() != before {
		t.Error("a private address was fetched")
	}

	// A redirect to a denied address is refused like the address itself.
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no 127.0.0.2 on this machine: %v", err)
	}
	private := httptest.NewUnstartedServer(site.Config.Handler)
	private.Listener = ln
	private.Start()
	defer private.Close()
	redirector := httptest.NewServer(http.RedirectHandler(private.URL+"/page", http.StatusFound))
	defer redirector.Close()
	one := startNode(t, testutil.SQLite(t), func(c *config.Config) {
		c.Media.URLPreviewEnabled = true
		c.Federation.IPRangeAllowlist = []string{"127.0.0.1/32"}
	})
	w := one.Register(t, "user", "")
	if a := preview(t, one, w.Token, redirector.URL); a.Status != http.StatusBadGateway {
		t.Errorf("redirect to a denied address: %d %s", a.Status, a.Body)
	}
	if hits.Load() != before {
		t.Error("a redirect reached a denied address")
	}
}
