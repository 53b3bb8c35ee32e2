package media_test

import (
	"bytes"
	"image"
	_ "image/gif"
	_ "image/jpeg"
	_ "image/png"
	"net/http"
	"os"
	"testing"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

func thumbnail(t *testing.T, n *testutil.Node, token, server, id, query string) (answer, image.Image) {
	t.Helper()
	a := do(t, n, "GET", "/_matrix/client/v1/media/thumbnail/"+server+"/"+id+"?"+query, token, nil, nil)
	if a.Status != http.StatusOK {
		return a, nil
	}
	img, _, err := image.Decode(bytes.NewReader(a.Body))
	if err != nil {
		t.Fatalf("thumbnail %s is no image (%s): %v", query, a.Header.Get("Content-Type"), err)
	}
	return a, img
}

// Thumbnails of PNG, JPEG, GIF and WebP images come in Synapse's default
// sizes, scaled to fit or cropped around the centre, and are made once.
func TestThumbnails(t *testing.T) {
	webp, err := os.ReadFile("testdata/blue-purple-pink.lossy.webp") // 150x100
	if err != nil {
		t.Fatal(err)
	}
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := startNode(t, db, nil)
		alice := n.Register(t, "alice", "")
		src := halves(400, 100)
		for _, c := range []struct {
			name, ct, thumbType string
			content             []byte
			w, h                int
			colours             bool // red left, blue right
		}{
			{"png", "image/png", "image/png", encodePNG(t, src), 400, 100, true},
			{"jpeg", "image/jpeg", "image/jpeg", encodeJPEG(t, src), 400, 100, true},
			{"gif", "image/gif", "image/png", encodeGIF(t, src), 400, 100, true},
			{"webp", "image/webp", "image/jpeg", webp, 150, 100, false},
		} {
			t.Run(c.name, func(t *testing.T) {
				server, id := upload(t, n, alice, c.ct, "img."+c.name, c.content)
				for _, q := range []struct {
					query string
					w, h  int
				}{
					{"width=32&height=32&method=crop", 32, 32},
					{"width=50&height=50&method=crop", 96, 96}, // the next size up
					{"width=96&height=96&method=crop", 96, 96},
					// scale fits the image within 320x240 keeping its aspect
					{"width=320&height=240&method=scale", min(c.w, 320), min(c.w, 320) * c.h / c.w},
					{"width=100&height=100", min(c.w, 320), min(c.w, 320) * c.h / c.w}, // scale by default
					// never enlarged
					{"width=800&height=600&method=scale", c.w, c.h},
				} {
					a, img := thumbnail(t, n, alice.Token, server, id, q.query)
					if img == nil {
						t.Fatalf("%s: %d %s", q.query, a.Status, a.Body)
					}
					if ct := a.Header.Get("Content-Type"); ct != c.thumbType {
						t.Errorf("%s: Content-Type %q, want %q", q.query, ct, c.thumbType)
					}
					if b := img.Bounds(); b.Dx() != q.w || b.Dy() != q.h {
						t.Errorf("%s: %dx%d, want %dx%d", q.query, b.Dx(), b.Dy(), q.w, q.h)
					}
					if !c.colours {
						continue
					}
					b := img.Bounds()
					// crop keeps the centre (the middle 100x100 of 400x100:
					// half red, half blue); scale keeps the whole width.
					if !isRed(img.At(b.Min.X+2, b.Dy()/2)) || !isBlue(img.At(b.Max.X-3, b.Dy()/2)) {
						t.Errorf("%s: colours %v and %v at the edges, want red and blue", q.query,
							img.At(b.Min.X+2, b.Dy()/2), img.At(b.Max.X-3, b.Dy()/2))
					}
				}
			})
		}
		// Each size is made once: five sizes asked of four images.
		var rows int
		if err := n.Store.DB().QueryRow(`SELECT COUNT(*) FROM media_thumbnails`).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		if rows != 4*4 { // 32 crop, 96 crop, 320 scale, 800 scale
			t.Errorf("%d thumbnails stored, want 16", rows)
		}
	})
}

// A file that claims to be an image but is not one, and an image of more
// pixels than allowed, are refused clearly and nothing is stored.
func TestThumbnailOfBrokenImage(t *testing.T) {
	n := startNode(t, testutil.SQLite(t), func(c *config.Config) { c.Media.MaxImagePixels = 10000 })
	alice := n.Register(t, "alice", "")
	server, id := upload(t, n, alice, "image/png", "", []byte("not a png"))
	if a, _ := thumbnail(t, n, alice.Token, server, id, "width=32&height=32"); a.Status != http.StatusBadRequest || a.errcode() != "M_UNKNOWN" {
		t.Errorf("thumbnail of a broken image: %d %s", a.Status, a.Body)
	}
	server, id = upload(t, n, alice, "image/png", "", encodePNG(t, halves(200, 51)))
	if a, _ := thumbnail(t, n, alice.Token, server, id, "width=32&height=32"); a.Status != http.StatusBadRequest || a.errcode() != "M_UNKNOWN" {
		t.Errorf("thumbnail of a too large image: %d %s", a.Status, a.Body)
	}
	server, id = upload(t, n, alice, "image/png", "", encodePNG(t, halves(200, 50)))
	if a, _ := thumbnail(t, n, alice.Token, server, id, "width=32&height=32"); a.Status != http.StatusOK {
		t.Errorf("thumbnail of an image of the largest size: %d %s", a.Status, a.Body)
	}
	var rows int
	if err := n.Store.DB().QueryRow(`SELECT COUNT(*) FROM media_thumbnails`).Scan(&rows); err != nil || rows != 1 {
		t.Errorf("%d thumbnails stored (%v), want 1", rows, err)
	}
}
