//go:build goolm

package clientcompat

import (
	"context"
	"testing"
	"time"

	"maunium.net/go/mautrix/crypto"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"

	"github.com/keyserver/keyserver/internal/testutil"
)

// mautrix-go on two federated daemons: alice fetches bob's device through
// her server, claims one of its one-time keys, establishes an Olm session
// and sends it an encrypted m.room_key; bob's client receives it from
// /sync, decrypts it, and with the key reads alice's megolm message.
func TestRealClientsShareRoomKeyAcrossServers(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		a := testutil.StartNode(t, db, nil)
		b := testutil.StartNode(t, testutil.SQLite(t), nil)
		alice := a.Register(t, "alice", "ALICEDEV")
		bob := b.Register(t, "bob", "BOBDEV")
		am, bm := realClient(t, a, alice), realClient(t, b, bob)
		const room = id.RoomID("!encrypted:x")

		device, err := am.GetOrFetchDevice(ctx, id.UserID(bob.UserID), id.DeviceID(bob.DeviceID))
		if err != nil {
			t.Fatalf("alice fetches bob's device: %v", err)
		}
		ogs, err := crypto.NewOutboundGroupSession(room, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		ogs.Shared = true
		if err := am.CryptoStore.AddOutboundGroupSession(ctx, ogs); err != nil {
			t.Fatal(err)
		}
		if err := am.SendEncryptedToDevice(ctx, device, event.ToDeviceRoomKey, ogs.ShareContent()); err != nil {
			t.Fatalf("alice sends the room key: %v", err)
		}
		encrypted, err := am.EncryptMegolmEvent(ctx, room, event.EventMessage,
			&event.MessageEventContent{MsgType: event.MsgText, Body: "through two servers"})
		if err != nil {
			t.Fatal(err)
		}

		// Bob syncs as a client does, long-polling, until the key is in.
		since := ""
		deadline := time.Now().Add(30 * time.Second)
		for {
			resp, err := bm.Client.SyncRequest(ctx, 5000, since, "", false, event.PresenceOnline)
			if err != nil {
				t.Fatal(err)
			}
			bm.ProcessSyncResponse(ctx, resp, since)
			since = resp.NextBatch
			if sess, err := bm.CryptoStore.GetGroupSession(ctx, room, ogs.ID()); err == nil && sess != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("bob never got the room key")
			}
		}
		evt := &event.Event{Type: event.EventEncrypted, RoomID: room, Sender: id.UserID(alice.UserID), ID: "$message",
			Content: event.Content{Parsed: encrypted}}
		decrypted, err := bm.DecryptMegolmEvent(ctx, evt)
		if err != nil {
			t.Fatalf("bob cannot decrypt with the shared key: %v", err)
		}
		if err := decrypted.Content.ParseRaw(decrypted.Type); err != nil && err != event.ErrContentAlreadyParsed {
			t.Fatal(err)
		}
		if body := decrypted.Content.AsMessage().Body; body != "through two servers" {
			t.Fatalf("decrypted %q", body)
		}
		// The message was delivered once: the next sync acknowledged it.
		resp, err := bm.Client.SyncRequest(ctx, 0, since, "", false, event.PresenceOnline)
		if err != nil || len(resp.ToDevice.Events) != 0 {
			t.Fatalf("after acknowledging: %d to-device events (%v)", len(resp.ToDevice.Events), err)
		}
	})
}
