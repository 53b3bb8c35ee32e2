package roomversion

import (
	"fmt"
	"strings"
	"unsafe"

	"github.com/matrix-org/gomatrixserverlib/spec"
)

// A version 12 room ID is "!" and the URL-safe unpadded base64 of the
// create event's reference hash: the create event's ID with "!" for "$".
// It has no server name, which spec.NewRoomID requires, yet
// gomatrixserverlib.PDU returns room IDs as spec.RoomID. domainlessRoomID
// fills one in place. spec.RoomID is three strings (raw, opaque part,
// domain) at the pinned gomatrixserverlib; init checks the size and the
// test checks the fields, so a change of that layout fails loudly.

type roomIDLayout struct {
	raw      string
	opaqueID string
	domain   string
}

func init() {
	if unsafe.Sizeof(spec.RoomID{}) != unsafe.Sizeof(roomIDLayout{}) {
		panic("roomversion: spec.RoomID changed layout")
	}
}

func domainlessRoomID(id string) spec.RoomID {
	var r spec.RoomID
	l := (*roomIDLayout)(unsafe.Pointer(&r))
	l.raw, l.opaqueID = id, strings.TrimPrefix(id, "!")
	return r
}

// RoomIDOfCreate returns the room ID a version 12 create event gives its
// room.
func RoomIDOfCreate(createEventID string) string {
	return "!" + strings.TrimPrefix(createEventID, "$")
}

// CreateEventID returns the ID of a version 12 room's create event.
func CreateEventID(roomID string) string {
	return "$" + strings.TrimPrefix(roomID, "!")
}

// ParseRoomID parses a room ID of any version: "!opaque:server" as
// spec.NewRoomID does, or the domainless "!hash" of version 12.
func ParseRoomID(id string) (spec.RoomID, error) {
	if r, err := spec.NewRoomID(id); err == nil {
		return *r, nil
	}
	if !isHashRoomID(id) {
		return spec.RoomID{}, fmt.Errorf("%q is not a room ID", id)
	}
	return domainlessRoomID(id), nil
}

// isHashRoomID accepts "!" and 43 characters of URL-safe base64 (a SHA-256
// hash unpadded).
func isHashRoomID(id string) bool {
	if len(id) != 44 || id[0] != '!' {
		return false
	}
	for _, c := range id[1:] {
		switch {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
		default:
			return false
		}
	}
	return true
}
