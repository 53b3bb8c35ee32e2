package crosssigning

import (
	"encoding/json"

	"github.com/keyserver/keyserver/storage"
)

// The EDUs that tell other servers of a local user's changed keys.
const (
	EDUDeviceListUpdate = "m.device_list_update"
	EDUSigningKeyUpdate = "m.signing_key_update"
)

// UpdateEDU is the EDU that carries a queued update of a local user's keys
// (storage.OutboundUpdate) to another server: an m.signing_key_update with
// the user's master key (with the signatures they made on it) and
// self-signing key as they are now, or an m.device_list_update with the
// device's current state, its keys carrying the signatures its owner made
// on them (a new self-signing signature is a change of the device).
// deviceNames puts the device's display name in. The user-signing key is
// the user's alone and never goes out.
//
// err, when not nil, says a key goes without the signatures stored apart
// from it because they could not be added to it (a stored key is
// canonical JSON, so that does not happen); the EDU is whole otherwise.
func UpdateEDU(u storage.OutboundUpdate, deviceNames bool) (eduType string, content json.RawMessage, err error) {
	if u.SigningKeys {
		c := map[string]any{"user_id": u.UserID}
		if u.MasterKey != nil {
			var js []byte
			js, err = ownSignaturesOn(u, u.MasterKey, PublicKeyOf(u.MasterKey))
			c["master_key"] = json.RawMessage(js)
		}
		if u.SelfSigningKey != nil {
			c["self_signing_key"] = json.RawMessage(u.SelfSigningKey)
		}
		raw, _ := json.Marshal(c) // maps of plain values always marshal
		return EDUSigningKeyUpdate, raw, err
	}
	c := map[string]any{
		"user_id":   u.UserID,
		"device_id": u.DeviceID,
		"stream_id": u.StreamID,
		"prev_id":   []int64{},
		"deleted":   u.Deleted,
	}
	if u.PrevID > 0 {
		c["prev_id"] = []int64{u.PrevID}
	}
	if !u.Deleted {
		if u.KeyJSON != nil {
			var js []byte
			js, err = ownSignaturesOn(u, u.KeyJSON, u.DeviceID)
			c["keys"] = json.RawMessage(js)
		}
		if deviceNames && u.DisplayName != nil {
			c["device_display_name"] = *u.DisplayName
		}
	}
	raw, _ := json.Marshal(c) // maps of plain values always marshal
	return EDUDeviceListUpdate, raw, err
}

// ownSignaturesOn is the key object js (whose ID is keyID) with the
// signatures of u on it; js alone, and the error, if they cannot be added.
func ownSignaturesOn(u storage.OutboundUpdate, js []byte, keyID string) ([]byte, error) {
	out, err := WithSignatures(js, ByTarget(u.Signatures, u.UserID, "")[keyID])
	if err != nil {
		return js, err
	}
	return out, nil
}
