package matrixid

import (
	"strings"
	"testing"
)

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

func TestParseUserID(t *testing.T) {
	for _, tc := range []struct {
		id, server string
		ok         bool
	}{
		{"@alice:example.org", "example.org", true},
		{"@alice:example.org:8448", "example.org:8448", true},
		{"@Alice:[::1]:8448", "[::1]:8448", true},
		{"alice:example.org", "", false},
		{"@alice", "", false},
		{"@:example.org", "", false},
		{"@alice:exa mple.org", "", false},
		{"@" + strings.Repeat("a", 260) + ":x.org", "", false},
	} {
		server, ok := ParseUserID(tc.id)
		if ok != tc.ok || server != tc.server {
			t.Errorf("%q: %q %v", tc.id, server, ok)
		}
	}
}
