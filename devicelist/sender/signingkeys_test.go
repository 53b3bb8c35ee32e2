package sender

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/keyserver/keyserver/internal/clock"
	"github.com/keyserver/keyserver/internal/workertest"
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
	s := New(newFakeQueue(), &scriptedTransport{}, Options{})
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
		e := s.edu(workertest.Quiet(), tc.u)
		if e.Type != tc.typ || string(e.Content) != tc.want {
			t.Errorf("got  %s %s\nwant %s %s", e.Type, e.Content, tc.typ, tc.want)
		}
	}
}

// Signing-key updates travel with device-list updates, in their queue
// order, at most 100 EDUs in a transaction.
func TestSigningKeyUpdatesShareBatches(t *testing.T) {
	ctx := context.Background()
	q := newFakeQueue()
	q.add("remote.test", 99)
	q.addSigningKeys("remote.test", "@a:local.test")
	q.addSigningKeys("remote.test", "@b:local.test")
	tr := &scriptedTransport{}
	s := startTest(q, tr, Options{Clock: clock.NewFake()})
	s.wake("remote.test", false)
	s.process(ctx, take(t, s))
	s.process(ctx, take(t, s))
	got := tr.delivered()
	if len(got) != 2 || len(got[0].EDUs) != 100 || len(got[1].EDUs) != 1 {
		t.Fatalf("delivered %d transactions: %v", len(got), got)
	}
	for i, want := range map[int]string{0: "m.device_list_update", 98: "m.device_list_update", 99: "m.signing_key_update"} {
		if e := got[0].EDUs[i]; e.Type != want {
			t.Errorf("EDU %d is %s, want %s", i, e.Type, want)
		}
	}
	var last struct {
		UserID    string          `json:"user_id"`
		MasterKey json.RawMessage `json:"master_key"`
	}
	if e := got[1].EDUs[0]; e.Type != "m.signing_key_update" || json.Unmarshal(e.Content, &last) != nil ||
		last.UserID != "@b:local.test" || string(last.MasterKey) != masterKey {
		t.Fatalf("second transaction: %s %s", e.Type, e.Content)
	}
	if q.left("remote.test") != 0 {
		t.Fatalf("%d updates left", q.left("remote.test"))
	}
}
