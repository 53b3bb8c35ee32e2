// Package roomversion adds room version 12 to the versions gomatrixserverlib
// knows. The pinned gomatrixserverlib predates it; version 12 is version 11
// with room IDs that are the hash of the create event (MSC4291), privileged
// creators (MSC4289, package authrules) and state resolution v2.1 (MSC4297,
// package stateres).
//
// Importing the package registers "12" in gomatrixserverlib's table of room
// versions, so everything that parses events by version (the federation
// client's responses, stored events) reads version 12 events through the
// Event type of this package. Events of version 12 are built with Build:
// gomatrixserverlib's event builder would build them as version 11.
package roomversion

import (
	"time"

	"crypto/ed25519"
	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// V12 is room version 12.
const V12 gomatrixserverlib.RoomVersion = "12"

// StateResV21 is the state resolution algorithm of version 12. It is not
// one gomatrixserverlib implements: its ResolveConflicts refuses it rather
// than resolving a version 12 room with v2.
const StateResV21 gomatrixserverlib.StateResAlgorithm = gomatrixserverlib.StateResV2 + 1

func init() {
	base := gomatrixserverlib.MustGetRoomVersion(gomatrixserverlib.RoomVersionV11).(gomatrixserverlib.RoomVersionImpl)
	gomatrixserverlib.RoomVersions()[V12] = version12{base}
}

// version12 is version 11 (redaction algorithm, canonical JSON, event ID
// format, restricted joins, knocking) with its own event type.
type version12 struct {
	gomatrixserverlib.RoomVersionImpl
}

func (version12) Version() gomatrixserverlib.RoomVersion { return V12 }
func (version12) Stable() bool                           { return true }
func (version12) StateResAlgorithm() gomatrixserverlib.StateResAlgorithm {
	return StateResV21
}

func (v version12) NewEventFromTrustedJSON(eventJSON []byte, redacted bool) (gomatrixserverlib.PDU, error) {
	return trustedEvent(eventJSON, "", redacted)
}

func (v version12) NewEventFromTrustedJSONWithEventID(eventID string, eventJSON []byte, redacted bool) (gomatrixserverlib.PDU, error) {
	return trustedEvent(eventJSON, eventID, redacted)
}

func (v version12) NewEventFromUntrustedJSON(eventJSON []byte) (gomatrixserverlib.PDU, error) {
	return untrustedEvent(v.RoomVersionImpl, eventJSON)
}

// NewEventBuilder is not usable for version 12: gomatrixserverlib's builder
// keeps the version it was made by (11) and always writes a room_id.
func (version12) NewEventBuilder() *gomatrixserverlib.EventBuilder {
	panic("roomversion: events of room version 12 are built with roomversion.Build")
}

func (version12) NewEventBuilderFromProtoEvent(*gomatrixserverlib.ProtoEvent) *gomatrixserverlib.EventBuilder {
	panic("roomversion: events of room version 12 are built with roomversion.Build")
}

// Is12 tells whether a room version has the rules of version 12 (room ID
// from the create event, creators, state resolution v2.1).
func Is12(v gomatrixserverlib.RoomVersion) bool { return v == V12 }

// Build builds, hashes and signs an event of the given room version:
// gomatrixserverlib's builder for versions up to 11, ours for 12.
func Build(version gomatrixserverlib.RoomVersion, proto *gomatrixserverlib.ProtoEvent, now time.Time, origin spec.ServerName, keyID gomatrixserverlib.KeyID, key ed25519.PrivateKey) (gomatrixserverlib.PDU, error) {
	if Is12(version) {
		return build12(proto, now, origin, keyID, key)
	}
	impl, err := gomatrixserverlib.GetRoomVersion(version)
	if err != nil {
		return nil, err
	}
	return impl.NewEventBuilderFromProtoEvent(proto).Build(now, origin, keyID, key)
}
