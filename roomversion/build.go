package roomversion

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

// build12 writes a version 12 event from proto: no room_id on the create
// event, the redacted event ID in content (from version 11), then the
// content hash and this server's signature.
func build12(proto *gomatrixserverlib.ProtoEvent, now time.Time, origin spec.ServerName, keyID gomatrixserverlib.KeyID, key ed25519.PrivateKey) (gomatrixserverlib.PDU, error) {
	content := []byte(proto.Content)
	if len(content) == 0 {
		content = []byte("{}")
	}
	if !gjson.ValidBytes(content) || !gjson.ParseBytes(content).IsObject() {
		return nil, errors.New("roomversion: event content is not an object")
	}
	if proto.Type == spec.MRoomRedaction && proto.Redacts != "" && !gjson.GetBytes(content, "redacts").Exists() {
		var err error
		if content, err = sjson.SetBytes(content, "redacts", proto.Redacts); err != nil {
			return nil, err
		}
	}
	ev := map[string]any{
		"type":             proto.Type,
		"sender":           proto.SenderID,
		"content":          json.RawMessage(content),
		"prev_events":      idList(proto.PrevEvents),
		"auth_events":      idList(proto.AuthEvents),
		"depth":            proto.Depth,
		"origin_server_ts": spec.AsTimestamp(now),
	}
	isCreate := proto.Type == spec.MRoomCreate && proto.StateKey != nil && *proto.StateKey == ""
	if !isCreate {
		if proto.RoomID == "" {
			return nil, errors.New("roomversion: event has no room ID")
		}
		ev["room_id"] = proto.RoomID
	}
	if proto.StateKey != nil {
		ev["state_key"] = *proto.StateKey
	}
	if len(proto.Unsigned) > 0 {
		ev["unsigned"] = json.RawMessage(proto.Unsigned)
	}
	raw, err := json.Marshal(ev)
	if err != nil {
		return nil, err
	}
	raw, err = gomatrixserverlib.CanonicalJSON(raw)
	if err != nil {
		return nil, err
	}
	hash, err := contentHash(raw)
	if err != nil {
		return nil, err
	}
	if raw, err = sjson.SetBytes(raw, "hashes.sha256", hash); err != nil {
		return nil, err
	}
	if raw, err = sign(raw, string(origin), keyID, key); err != nil {
		return nil, err
	}
	if raw, err = gomatrixserverlib.EnforcedCanonicalJSON(raw, V12); err != nil {
		return nil, err
	}
	e, err := trustedEvent(raw, "", false)
	if err != nil {
		return nil, err
	}
	return e, gomatrixserverlib.CheckFields(e)
}

// idList reads prev or auth events as set in a ProtoEvent ([]string, or
// nil for none).
func idList(v any) []string {
	switch ids := v.(type) {
	case []string:
		if ids != nil {
			return ids
		}
	case []any:
		out := make([]string, 0, len(ids))
		for _, id := range ids {
			if s, ok := id.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return []string{}
}
