// Package matrixid is the Matrix vocabulary every package shares: the
// rules of user and room IDs (one rule each, used everywhere), the
// identifiers clients name that this server stores without resolving them
// (session IDs, account data types), the server name of an ID, and the
// identity of an authenticated caller. It imports no package of the
// server.
package matrixid

import (
	"strings"
	"unicode/utf8"

	"github.com/matrix-org/gomatrixserverlib/spec"
)

// Caller is an authenticated client: a user and the device its token is
// bound to.
type Caller struct {
	UserID   string
	DeviceID string
	IP       string // the remote address of the request, for logs
}

// ParseUserID checks that id is a Matrix user ID and returns its server
// name. Historical localparts (any printable ASCII but ':', upper case
// included) are allowed: other servers made them before the grammar was
// narrowed, and the spec requires them to be accepted. Every user ID this
// server reads from a client or another server goes through here; only the
// IDs it creates itself follow the strict grammar of new localparts.
func ParseUserID(id string) (server string, ok bool) {
	u, err := spec.NewUserID(id, true)
	if err != nil || u.Local() == "" {
		return "", false
	}
	return string(u.Domain()), true
}

// MaxLength is the longest identifier accepted: the spec's limit for room
// and event IDs.
const MaxLength = 255

// ValidRoomID accepts "!" followed by an opaque part of at most 254 bytes
// in printable UTF-8. The ":server" suffix is not required: room IDs of
// room version 12 have none.
func ValidRoomID(s string) bool {
	return strings.HasPrefix(s, "!") && len(s) > 1 && printable(s)
}

// ValidOpaqueID accepts an identifier the server only stores and compares
// (a megolm session ID, an account data type): 1 to 255 bytes of
// printable UTF-8.
func ValidOpaqueID(s string) bool { return s != "" && printable(s) }

func printable(s string) bool {
	if len(s) > MaxLength || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// Server returns the server name of a user ID, room ID or alias (what
// follows the first colon), "" when there is none.
func Server(id string) string {
	_, server, _ := strings.Cut(id, ":")
	return server
}

// Localpart returns the localpart of a user ID: what lies between the
// sigil and the first colon.
func Localpart(userID string) string {
	local, _, _ := strings.Cut(userID, ":")
	return strings.TrimPrefix(local, "@")
}
