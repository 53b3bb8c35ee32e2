//go:build goolm

package clientcompat

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"testing"

	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/crypto"
	"maunium.net/go/mautrix/crypto/backup"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"

	"github.com/keyserver/keyserver/internal/testutil"
)

// mautrixDevice is a logged-in device with mautrix's Olm machine, its
// keys uploaded.
func mautrixDevice(t *testing.T, ctx context.Context, srv *testutil.Server, u *testutil.User) *crypto.OlmMachine {
	t.Helper()
	cli, err := mautrix.NewClient(srv.URL, id.UserID(u.UserID), u.Token)
	if err != nil {
		t.Fatal(err)
	}
	cli.DeviceID = id.DeviceID(u.DeviceID)
	mach := crypto.NewOlmMachine(cli, nil, crypto.NewMemoryStore(nil), mautrix.NewMemoryStateStore().(crypto.StateStore))
	if err := mach.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := mach.ShareKeys(ctx, -1); err != nil {
		t.Fatalf("mautrix uploads its device's keys: %v", err)
	}
	return mach
}

// A room key backed up by one mautrix device is restored by another with
// the recovery key, and decrypts the message it encrypted.
func TestMautrixKeyBackupRestoredBySecondDevice(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		laptop := srv.Register(t, "alice", "LAPTOP")
		phone := srv.Login(t, laptop, "PHONE")
		first := mautrixDevice(t, ctx, srv, laptop)
		const room = id.RoomID("!secret:test.local")

		// The laptop has a megolm session and a message encrypted with it.
		ogs, err := crypto.NewOutboundGroupSession(room, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		ogs.Shared = true
		if err := first.CryptoStore.AddOutboundGroupSession(ctx, ogs); err != nil {
			t.Fatal(err)
		}
		sessionKey := exportSession(t, ogs) // before the ratchet moves on
		encrypted, err := first.EncryptMegolmEvent(ctx, room, event.EventMessage,
			&event.MessageEventContent{MsgType: event.MsgText, Body: "what the backup keeps"})
		if err != nil {
			t.Fatal(err)
		}

		// It creates a backup version and backs the session up.
		recovery, err := backup.NewMegolmBackupKey()
		if err != nil {
			t.Fatal(err)
		}
		created, err := first.Client.CreateKeyBackupVersion(ctx, &mautrix.ReqRoomKeysVersionCreate[backup.MegolmAuthData]{
			Algorithm: id.KeyBackupAlgorithmMegolmBackupV1,
			AuthData:  backup.MegolmAuthData{PublicKey: id.Ed25519(base64.RawStdEncoding.EncodeToString(recovery.PublicKey().Bytes()))},
		})
		if err != nil {
			t.Fatal(err)
		}
		own := first.OwnIdentity()
		sessionData, err := backup.EncryptSessionData(recovery, backup.MegolmSessionData{
			Algorithm:         id.AlgorithmMegolmV1,
			SenderKey:         own.IdentityKey,
			SenderClaimedKeys: backup.SenderClaimedKeys{Ed25519: own.SigningKey},
			SessionKey:        sessionKey,
		})
		if err != nil {
			t.Fatal(err)
		}
		raw, err := json.Marshal(sessionData)
		if err != nil {
			t.Fatal(err)
		}
		put, err := first.Client.PutKeysInBackup(ctx, created.Version, &mautrix.ReqKeyBackup{Rooms: map[id.RoomID]mautrix.ReqRoomKeyBackup{
			room: {Sessions: map[id.SessionID]mautrix.ReqKeyBackupData{ogs.ID(): {SessionData: raw}}}}})
		if err != nil {
			t.Fatal(err)
		}
		if put.Count != 1 || put.ETag == "" {
			t.Fatalf("upload answered count %d etag %q", put.Count, put.ETag)
		}

		// The phone, given the recovery key, finds the backup, trusts it
		// (its public key is the recovery key's), restores the session and
		// reads the message.
		second := mautrixDevice(t, ctx, srv, phone)
		typed, err := backup.MegolmBackupKeyFromBytes(recovery.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		version, err := second.DownloadAndStoreLatestKeyBackup(ctx, typed)
		if err != nil {
			t.Fatal(err)
		}
		if version != created.Version {
			t.Fatalf("restored version %q, created %q", version, created.Version)
		}
		info, err := second.Client.GetKeyBackupVersion(ctx, version)
		if err != nil || info.Count != 1 || info.ETag != put.ETag {
			t.Fatalf("version info %+v (%v), want count 1 and etag %q", info, err, put.ETag)
		}
		evt := &event.Event{Type: event.EventEncrypted, RoomID: room, Sender: id.UserID(laptop.UserID), ID: "$message",
			Content: event.Content{Parsed: encrypted}}
		decrypted, err := second.DecryptMegolmEvent(ctx, evt)
		if err != nil {
			t.Fatalf("the restored session does not decrypt: %v", err)
		}
		if err := decrypted.Content.ParseRaw(decrypted.Type); err != nil && err != event.ErrContentAlreadyParsed {
			t.Fatal(err)
		}
		if body := decrypted.Content.AsMessage().Body; body != "what the backup keeps" {
			t.Fatalf("decrypted %q", body)
		}
	})
}

// exportSession exports an outbound session's key from its first message,
// as its inbound counterpart would.
func exportSession(t *testing.T, ogs *crypto.OutboundGroupSession) string {
	t.Helper()
	igs, err := crypto.NewInboundGroupSession("", "", ogs.RoomID, ogs.Internal.Key(), 0, 0, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	key, err := igs.Internal.Export(igs.Internal.FirstKnownIndex())
	if err != nil {
		t.Fatal(err)
	}
	return string(key)
}
