package streamtoken

import (
	"testing"

	"github.com/keyserver/keyserver/storage"
)

// Tokens of /messages reach below the stream's start (backfilled
// history, "h<n>"); /sync's never do.
func TestPageTokens(t *testing.T) {
	for _, pos := range []storage.StreamPos{0, 1, 42, -1, -1000} {
		got, err := ParsePage("from", FormatPage(pos))
		if err != nil || got != pos {
			t.Errorf("%d: %q read back as %d, %v", pos, FormatPage(pos), got, err)
		}
	}
	if FormatPage(7) != Format(7) || FormatPage(-7) != "h7" {
		t.Errorf("FormatPage(7) %q, FormatPage(-7) %q", FormatPage(7), FormatPage(-7))
	}
	for _, tok := range []string{"h0", "h-3", "hx", "h", "s-1", "x5", ""} {
		if _, err := ParsePage("from", tok); err == nil {
			t.Errorf("ParsePage accepted %q", tok)
		}
	}
	for _, tok := range []string{"h5", "s-1"} {
		if _, err := Parse("since", tok); err == nil {
			t.Errorf("Parse accepted %q", tok)
		}
	}
	if p, err := ParsePage("from", "h12_0_3"); err != nil || p != -12 {
		t.Errorf("h12_0_3: %d %v", p, err)
	}
}
