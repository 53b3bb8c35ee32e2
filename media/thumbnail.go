package media

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/gif"
	"image/jpeg"
	"image/png"
	"io"
	"math"
	"mime"
	"sync"
	"time"

	"golang.org/x/image/draw"
	"golang.org/x/image/webp"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// ThumbnailSize is a size thumbnails are made in.
type ThumbnailSize struct {
	Width, Height int
	Method        string // "crop" or "scale"
}

// ThumbnailSizes are the sizes made (Synapse's default thumbnail_sizes):
// a request gets the one that fits it best.
var ThumbnailSizes = []ThumbnailSize{
	{32, 32, "crop"}, {96, 96, "crop"}, {320, 240, "scale"}, {640, 480, "scale"}, {800, 600, "scale"},
}

// thumbnailFormats maps the image types thumbnailed to the decoder and
// the type of their thumbnails (photographs stay JPEG; images that may be
// drawings or transparent become PNG).
var thumbnailFormats = map[string]struct {
	decode func(io.Reader) (image.Image, error)
	config func(io.Reader) (image.Config, error)
	out    string
}{
	"image/png":  {png.Decode, png.DecodeConfig, "image/png"},
	"image/gif":  {gif.Decode, gif.DecodeConfig, "image/png"},
	"image/jpeg": {jpeg.Decode, jpeg.DecodeConfig, "image/jpeg"},
	"image/jpg":  {jpeg.Decode, jpeg.DecodeConfig, "image/jpeg"},
	"image/webp": {webp.Decode, webp.DecodeConfig, "image/jpeg"},
}

// pickSize chooses the thumbnail size for a request: the smallest of its
// method at least as large as asked, else the largest of its method.
func pickSize(w, h int, method string) ThumbnailSize {
	var best, largest *ThumbnailSize
	for i := range ThumbnailSizes {
		t := &ThumbnailSizes[i]
		if t.Method != method {
			continue
		}
		if largest == nil || t.Width*t.Height > largest.Width*largest.Height {
			largest = t
		}
		if t.Width >= w && t.Height >= h && (best == nil || t.Width*t.Height < best.Width*best.Height) {
			best = t
		}
	}
	if best == nil {
		best = largest
	}
	return *best
}

// CheckThumbnailRequest refuses sizes and methods that make no sense.
func CheckThumbnailRequest(w, h int, method string) error {
	if w <= 0 || h <= 0 {
		return mxerr.InvalidParam("width and height must be positive integers")
	}
	if method != "crop" && method != "scale" {
		return mxerr.InvalidParam("method must be crop or scale")
	}
	return nil
}

// Thumbnail returns a thumbnail of a piece of media (see Download).
func (s *Service) Thumbnail(ctx context.Context, serverName, mediaID string, w, h int, method string, legacy bool, timeout time.Duration) (*Content, error) {
	if err := CheckThumbnailRequest(w, h, method); err != nil {
		return nil, err
	}
	rec, err := s.record(ctx, serverName, mediaID, legacy, timeout)
	if err != nil {
		return nil, err
	}
	return s.thumbnail(ctx, rec, w, h, method)
}

// FederationThumbnail serves a thumbnail of local media to another server.
func (s *Service) FederationThumbnail(ctx context.Context, mediaID string, w, h int, method string, timeout time.Duration) (*Content, error) {
	if err := CheckThumbnailRequest(w, h, method); err != nil {
		return nil, err
	}
	if !mediaIDPattern.MatchString(mediaID) {
		return nil, mxerr.InvalidParam("invalid media ID")
	}
	rec, err := s.localRecord(ctx, mediaID, timeout)
	if err != nil {
		return nil, err
	}
	return s.thumbnail(ctx, rec, w, h, method)
}

func (s *Service) thumbnail(ctx context.Context, rec storage.MediaRecord, w, h int, method string) (*Content, error) {
	mt, _, _ := mime.ParseMediaType(rec.ContentType)
	format, ok := thumbnailFormats[mt]
	if !ok {
		return nil, mxerr.Unknown("media of type %q cannot be thumbnailed", rec.ContentType)
	}
	size := pickSize(w, h, method)
	key := fmt.Sprintf("%s/%s/%dx%d/%s", rec.Origin, rec.MediaID, size.Width, size.Height, size.Method)
	// One request makes a thumbnail; the others asking for it meanwhile
	// wait and then find it stored.
	s.mu.Lock()
	lock := s.thumbing[key]
	if lock == nil {
		lock = &sync.Mutex{}
		s.thumbing[key] = lock
	}
	s.mu.Unlock()
	lock.Lock()
	defer func() {
		lock.Unlock()
		s.mu.Lock()
		delete(s.thumbing, key)
		s.mu.Unlock()
	}()
	t, err := s.store.MediaThumbnail(ctx, rec.Origin, rec.MediaID, size.Width, size.Height, size.Method)
	if err == nil {
		if c, err := s.open(storage.MediaRecord{Origin: rec.Origin, MediaID: rec.MediaID, ContentType: t.ContentType, SHA256: t.SHA256, Size: t.Size}); err == nil {
			return c, nil
		}
	} else if !errors.Is(err, storage.ErrNotFound) {
		return nil, err
	}
	orig, err := s.open(rec)
	if err != nil {
		return nil, err
	}
	defer orig.File.Close()
	cfg, err := format.config(orig.File)
	if err != nil {
		return nil, mxerr.Unknown("the media is not a valid %s image", mt)
	}
	if int64(cfg.Width)*int64(cfg.Height) > s.opts.MaxImagePixels || cfg.Width <= 0 || cfg.Height <= 0 {
		return nil, mxerr.Unknown("the image is too large to thumbnail")
	}
	if _, err := orig.File.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	img, err := format.decode(orig.File)
	if err != nil {
		return nil, mxerr.Unknown("the media is not a valid %s image", mt)
	}
	var buf bytes.Buffer
	thumb := resize(img, size)
	if format.out == "image/png" {
		err = png.Encode(&buf, thumb)
	} else {
		err = jpeg.Encode(&buf, thumb, &jpeg.Options{Quality: 80})
	}
	if err != nil {
		return nil, err
	}
	sha, n, err := s.files.put(&buf, math.MaxInt64-1)
	if err != nil {
		return nil, err
	}
	t = storage.MediaThumbnail{Origin: rec.Origin, MediaID: rec.MediaID, Width: size.Width, Height: size.Height, Method: size.Method,
		ContentType: format.out, SHA256: sha, Size: n}
	if err := s.store.PutMediaThumbnail(ctx, t); err != nil {
		return nil, err
	}
	s.opts.Logger.WithFields(logrus.Fields{"origin": rec.Origin, "media_id": rec.MediaID, "width": size.Width,
		"height": size.Height, "method": size.Method}).Debug("thumbnail made")
	return s.open(storage.MediaRecord{Origin: rec.Origin, MediaID: rec.MediaID, ContentType: t.ContentType, SHA256: sha, Size: n})
}

// resize makes a thumbnail: "scale" fits the image within the size,
// keeping its aspect; "crop" fills the size, cutting what overflows
// around the centre. Images are never enlarged: a smaller one keeps its
// size (scale) or is cut to the size's aspect (crop).
func resize(src image.Image, size ThumbnailSize) image.Image {
	b := src.Bounds()
	w, h := float64(b.Dx()), float64(b.Dy())
	tw, th := float64(size.Width), float64(size.Height)
	var out image.Rectangle
	from := b
	if size.Method == "scale" {
		r := math.Min(1, math.Min(tw/w, th/h))
		out = image.Rect(0, 0, max(1, int(math.Round(w*r))), max(1, int(math.Round(h*r))))
	} else {
		if k := math.Min(w/tw, h/th); k < 1 {
			tw, th = math.Max(1, math.Round(tw*k)), math.Max(1, math.Round(th*k))
		}
		out = image.Rect(0, 0, int(tw), int(th))
		// the largest centred part of the source of the output's aspect
		cw, ch := w, h
		if w*th > h*tw {
			cw = math.Max(1, math.Round(h*tw/th))
		} else {
			ch = math.Max(1, math.Round(w*th/tw))
		}
		x0 := b.Min.X + int((w-cw)/2)
		y0 := b.Min.Y + int((h-ch)/2)
		from = image.Rect(x0, y0, x0+int(cw), y0+int(ch))
	}
	dst := image.NewRGBA(out)
	draw.CatmullRom.Scale(dst, out, src, from, draw.Src, nil)
	return dst
}
