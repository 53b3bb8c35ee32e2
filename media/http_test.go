package media

import "testing"

func TestDisposition(t *testing.T) {
	for _, c := range []struct{ ct, name, want string }{
		{"image/png", "", "inline"},
		{"IMAGE/PNG", "a.png", "inline; filename=a.png"},
		{"image/png; charset=binary", "a.png", "inline; filename=a.png"},
		{"image/svg+xml", "a.svg", "attachment; filename=a.svg"},
		{"text/html", "x", "attachment; filename=x"},
		{"not a type", "x", "attachment; filename=x"},
		{"text/plain", "a;b.txt", "inline; filename*=utf-8''a%3Bb.txt"},
		{"text/plain", `say "hi".txt`, "inline; filename*=utf-8''say%20%22hi%22.txt"},
		{"text/plain", "☕.txt", "inline; filename*=utf-8''%E2%98%95.txt"},
	} {
		if got := Disposition(c.ct, c.name); got != c.want {
			t.Errorf("Disposition(%q, %q) = %q, want %q", c.ct, c.name, got, c.want)
		}
	}
}

func TestPickSize(t *testing.T) {
	for _, c := range []struct {
		w, h   int
		method string
		want   ThumbnailSize
	}{
		{1, 1, "crop", ThumbnailSize{32, 32, "crop"}},
		{33, 10, "crop", ThumbnailSize{96, 96, "crop"}},
		{500, 500, "crop", ThumbnailSize{96, 96, "crop"}},
		{1, 1, "scale", ThumbnailSize{320, 240, "scale"}},
		{321, 10, "scale", ThumbnailSize{640, 480, "scale"}},
		{2000, 2000, "scale", ThumbnailSize{800, 600, "scale"}},
	} {
		if got := pickSize(c.w, c.h, c.method); got != c.want {
			t.Errorf("pickSize(%d, %d, %s) = %v, want %v", c.w, c.h, c.method, got, c.want)
		}
	}
}
