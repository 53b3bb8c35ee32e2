package media_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

// answer is a raw HTTP answer.
type answer struct {
	Status int
	Header http.Header
	Body   []byte
}

func (a answer) errcode() string {
	var e struct {
		Errcode string `json:"errcode"`
	}
	_ = json.Unmarshal(a.Body, &e)
	return e.Errcode
}

func (a answer) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(a.Body, &m); err != nil {
		t.Fatalf("answer %d is not JSON: %q", a.Status, a.Body)
	}
	return m
}

var httpClient = &http.Client{Timeout: 60 * time.Second}

// do sends a request to a node's client API; body nil: none.
func do(t *testing.T, n *testutil.Node, method, path, token string, header map[string]string, body io.Reader) answer {
	t.Helper()
	req, err := http.NewRequest(method, n.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading: %v", method, path, err)
	}
	return answer{Status: resp.StatusCode, Header: resp.Header, Body: raw}
}

// uploadPath is the upload endpoint with a file name ("" none).
func uploadPath(version, name string) string {
	p := "/_matrix/media/" + version + "/upload"
	if name != "" {
		p += "?filename=" + url.QueryEscape(name)
	}
	return p
}

// upload stores content and returns its server name and media ID.
func upload(t *testing.T, n *testutil.Node, u *testutil.User, contentType, name string, content []byte) (string, string) {
	t.Helper()
	a := do(t, n, "POST", uploadPath("v3", name), u.Token, map[string]string{"Content-Type": contentType}, bytes.NewReader(content))
	if a.Status != http.StatusOK {
		t.Fatalf("upload: %d %s", a.Status, a.Body)
	}
	return splitMXC(t, a.json(t)["content_uri"])
}

func splitMXC(t *testing.T, v any) (string, string) {
	t.Helper()
	s, _ := v.(string)
	rest, ok := strings.CutPrefix(s, "mxc://")
	server, id, ok2 := strings.Cut(rest, "/")
	if !ok || !ok2 || server == "" || id == "" {
		t.Fatalf("content_uri %q is not an mxc URI", s)
	}
	return server, id
}

func download(t *testing.T, n *testutil.Node, token, server, id string) answer {
	t.Helper()
	return do(t, n, "GET", "/_matrix/client/v1/media/download/"+server+"/"+id, token, nil, nil)
}

// mediaRows counts the media records of a node's database.
func mediaRows(t *testing.T, n *testutil.Node) int {
	t.Helper()
	var c int
	if err := n.Store.DB().QueryRow(`SELECT COUNT(*) FROM media`).Scan(&c); err != nil {
		t.Fatal(err)
	}
	return c
}

// mediaFiles counts the files under a node's media directory: those in
// place, and those left in tmp/.
func mediaFiles(t *testing.T, n *testutil.Node) (kept, tmp int) {
	t.Helper()
	dir := n.Config.MediaPath()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if strings.HasPrefix(p, filepath.Join(dir, "tmp")+string(filepath.Separator)) {
			tmp++
		} else {
			kept++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return kept, tmp
}

func startNode(t *testing.T, db testutil.Database, adjust func(*config.Config)) *testutil.Node {
	return testutil.StartNode(t, db, adjust)
}

// halves is a w x h image whose left half is red and right half blue.
func halves(w, h int) *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			c := color.RGBA{255, 0, 0, 255}
			if x >= w/2 {
				c = color.RGBA{0, 0, 255, 255}
			}
			img.Set(x, y, c)
		}
	}
	return img
}

func encodePNG(t *testing.T, img image.Image) []byte {
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func encodeJPEG(t *testing.T, img image.Image) []byte {
	var b bytes.Buffer
	if err := jpeg.Encode(&b, img, &jpeg.Options{Quality: 95}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// encodeGIF makes a two-frame animated GIF of img (and its inverse).
func encodeGIF(t *testing.T, img image.Image) []byte {
	b := img.Bounds()
	pal := color.Palette{color.RGBA{255, 0, 0, 255}, color.RGBA{0, 0, 255, 255}}
	frames := []*image.Paletted{image.NewPaletted(b, pal), image.NewPaletted(b, pal)}
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			frames[0].Set(x, y, img.At(x, y))
			if x < b.Dx()/2 {
				frames[1].SetColorIndex(x, y, 1)
			}
		}
	}
	var out bytes.Buffer
	if err := gif.EncodeAll(&out, &gif.GIF{Image: frames, Delay: []int{10, 10}}); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// isRed and isBlue tell a pixel's dominant colour.
func isRed(c color.Color) bool {
	r, g, b, _ := c.RGBA()
	return r > 0xb000 && g < 0x5000 && b < 0x5000
}

func isBlue(c color.Color) bool {
	r, g, b, _ := c.RGBA()
	return b > 0xb000 && g < 0x5000 && r < 0x5000
}

func bufioReader(r io.Reader) *bufio.Reader { return bufio.NewReader(r) }
