package matrixid

import "testing"

func TestServer(t *testing.T) {
	for id, want := range map[string]string{
		"@alice:example.org":    "example.org",
		"@alice:127.0.0.1:8448": "127.0.0.1:8448",
		"!room:[::1]:8448":      "[::1]:8448",
		"#alias:example.org":    "example.org",
		"!roomwithoutserver":    "",
		"":                      "",
	} {
		if got := Server(id); got != want {
			t.Errorf("Server(%q) = %q, want %q", id, got, want)
		}
	}
}
