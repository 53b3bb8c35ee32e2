// Package streamtoken reads and writes stream tokens: the positions /sync
// hands out as next_batch and prev_batch, and /keys/changes and /messages
// take back.
package streamtoken

import (
	"strconv"
	"strings"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// Format makes the token of a position: "s<position>". Tokens are opaque
// to clients.
func Format(pos storage.StreamPos) string { return "s" + strconv.FormatInt(int64(pos), 10) }

// Parse reads a token given in the parameter param. Anything after an "_"
// is reserved for streams added later and ignored, so tokens of a newer
// version still parse.
func Parse(param, tok string) (storage.StreamPos, error) {
	num, _, _ := strings.Cut(tok, "_")
	if !strings.HasPrefix(num, "s") {
		return 0, mxerr.InvalidParam("%s is not a valid stream token", param)
	}
	n, err := strconv.ParseInt(num[1:], 10, 64)
	if err != nil || n < 0 {
		return 0, mxerr.InvalidParam("%s is not a valid stream token", param)
	}
	return storage.StreamPos(n), nil
}

// FormatPage makes a token of /messages: a stream position as Format
// makes it, or "h<n>" for the position -n below the stream's start, where
// a room's history fetched from other servers (backfill) is placed.
func FormatPage(pos storage.StreamPos) string {
	if pos < 0 {
		return "h" + strconv.FormatInt(-int64(pos), 10)
	}
	return Format(pos)
}

// ParsePage reads a token FormatPage made, or one of Parse.
func ParsePage(param, tok string) (storage.StreamPos, error) {
	num, _, _ := strings.Cut(tok, "_")
	if !strings.HasPrefix(num, "h") {
		return Parse(param, tok)
	}
	n, err := strconv.ParseInt(num[1:], 10, 64)
	if err != nil || n <= 0 {
		return 0, mxerr.InvalidParam("%s is not a valid stream token", param)
	}
	return storage.StreamPos(-n), nil
}
