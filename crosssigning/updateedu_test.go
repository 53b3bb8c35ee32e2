package crosssigning_test

import (
	"testing"

	"github.com/keyserver/keyserver/crosssigning"
	"github.com/keyserver/keyserver/storage"
)

// Signatures a user made on their own keys: one on the device D by the
// self-signing key, one on the master key by the device.
var ownSignatures = []storage.CrossSigningSignature{
	{TargetUserID: "@a:l", TargetKeyID: "D", SignerUserID: "@a:l", SignerKeyID: "ed25519:SSK", Signature: "on-device"},
	{TargetUserID: "@a:l", TargetKeyID: "MSK", SignerUserID: "@a:l", SignerKeyID: "ed25519:D", Signature: "on-master"},
}

const (
	masterKey      = `{"keys":{"ed25519:MSK":"MSK"},"usage":["master"],"user_id":"@a:l"}`
	selfSigningKey = `{"keys":{"ed25519:SSK":"SSK"},"signatures":{"@a:l":{"ed25519:MSK":"by-master"}},"usage":["self_signing"],"user_id":"@a:l"}`
)

// A signing-key update is an m.signing_key_update with the user's master
// key, carrying the signatures they made on it, and self-signing key, and
// nothing of the device-list chain; a device update carries the
// signatures on that device alone.
func TestSigningKeyAndSignedDeviceEDUs(t *testing.T) {
	for _, tc := range []struct {
		u         storage.OutboundUpdate
		typ, want string
	}{
		{storage.OutboundUpdate{UserID: "@a:l", StreamID: 7, SigningKeys: true, Signatures: ownSignatures,
			MasterKey: []byte(masterKey), SelfSigningKey: []byte(selfSigningKey)},
			"m.signing_key_update",
			`{"master_key":{"keys":{"ed25519:MSK":"MSK"},"signatures":{"@a:l":{"ed25519:D":"on-master"}},"usage":["master"],"user_id":"@a:l"},` +
				`"self_signing_key":` + selfSigningKey + `,"user_id":"@a:l"}`},
		{storage.OutboundUpdate{UserID: "@a:l", StreamID: 8, SigningKeys: true, MasterKey: []byte(masterKey)},
			"m.signing_key_update",
			`{"master_key":` + masterKey + `,"user_id":"@a:l"}`},
		{storage.OutboundUpdate{UserID: "@a:l", DeviceID: "D", StreamID: 9, PrevID: 5, Signatures: ownSignatures,
			KeyJSON: []byte(`{"device_id":"D","signatures":{"@a:l":{"ed25519:D":"self"}},"user_id":"@a:l"}`)},
			"m.device_list_update",
			`{"deleted":false,"device_id":"D","keys":{"device_id":"D","signatures":{"@a:l":{"ed25519:D":"self","ed25519:SSK":"on-device"}},"user_id":"@a:l"},` +
				`"prev_id":[5],"stream_id":9,"user_id":"@a:l"}`},
	} {
		typ, content, err := crosssigning.UpdateEDU(tc.u, false)
		if err != nil || typ != tc.typ || string(content) != tc.want {
			t.Errorf("got  %s %s %v\nwant %s %s", typ, content, err, tc.typ, tc.want)
		}
	}
}

// The EDU carries the device's state and its place in the user's chain:
// prev_id names the update sent before (none: empty), a deleted device
// has no keys, and names go out only when allowed.
func TestDeviceListUpdateEDU(t *testing.T) {
	name := "Alice's phone"
	for _, tc := range []struct {
		names bool
		u     storage.OutboundUpdate
		want  string
	}{
		{false, storage.OutboundUpdate{UserID: "@a:l", DeviceID: "D", StreamID: 5, KeyJSON: []byte(`{"k":1}`), DisplayName: &name},
			`{"deleted":false,"device_id":"D","keys":{"k":1},"prev_id":[],"stream_id":5,"user_id":"@a:l"}`},
		{true, storage.OutboundUpdate{UserID: "@a:l", DeviceID: "D", StreamID: 9, PrevID: 5, KeyJSON: []byte(`{"k":1}`), DisplayName: &name},
			`{"deleted":false,"device_display_name":"Alice's phone","device_id":"D","keys":{"k":1},"prev_id":[5],"stream_id":9,"user_id":"@a:l"}`},
		{true, storage.OutboundUpdate{UserID: "@a:l", DeviceID: "D", StreamID: 12, PrevID: 9, Deleted: true, KeyJSON: []byte(`{"k":1}`), DisplayName: &name},
			`{"deleted":true,"device_id":"D","prev_id":[9],"stream_id":12,"user_id":"@a:l"}`},
	} {
		typ, content, err := crosssigning.UpdateEDU(tc.u, tc.names)
		if err != nil || typ != crosssigning.EDUDeviceListUpdate || string(content) != tc.want {
			t.Errorf("got  %s %s %v\nwant %s", typ, content, err, tc.want)
		}
	}
}

// Signatures that cannot be added leave the key as stored, and say so.
func TestUpdateEDUKeepsAKeyItCannotSign(t *testing.T) {
	u := storage.OutboundUpdate{UserID: "@a:l", DeviceID: "D", StreamID: 3, Signatures: ownSignatures, KeyJSON: []byte(`"not an object"`)}
	typ, content, err := crosssigning.UpdateEDU(u, false)
	want := `{"deleted":false,"device_id":"D","keys":"not an object","prev_id":[],"stream_id":3,"user_id":"@a:l"}`
	if err == nil || typ != crosssigning.EDUDeviceListUpdate || string(content) != want {
		t.Fatalf("got %s %s %v, want %s and an error", typ, content, err, want)
	}
}
