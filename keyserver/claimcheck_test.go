package keyserver

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/keyserver/keyserver/devicelist"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/storage"
)

// A claimed signed_curve25519 key that fails the check against its
// device's cached key is dropped and logged with who and what it was; a
// good one is passed on and logs nothing.
func TestBadClaimedKeyIsLogged(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, tdb testdb.Database) {
		ctx := context.Background()
		db := openTestDB(t, tdb)
		log, hook := logtest.NewNullLogger()
		svc := New(db, Options{ServerName: "local.test", Logger: log,
			RemoteLists: devicelist.NewTracker(db, devicelist.TrackerOptions{Logger: log})})
		const carol, server = "@carol:remote.test", "remote.test"
		_, priv, _ := ed25519.GenerateKey(rand.Reader)
		sign := func(obj map[string]any) json.RawMessage {
			raw, _ := json.Marshal(obj)
			signed, err := gomatrixserverlib.SignJSON(carol, "ed25519:CAROLDEV", priv, raw)
			if err != nil {
				t.Fatal(err)
			}
			return signed
		}
		b64 := func(b []byte) string { return base64.RawStdEncoding.EncodeToString(b) }
		dk, err := ParseDeviceKeys(sign(map[string]any{
			"user_id": carol, "device_id": "CAROLDEV", "algorithms": []string{"m.olm.v1.curve25519-aes-sha2"},
			"keys": map[string]string{"ed25519:CAROLDEV": b64(priv.Public().(ed25519.PublicKey)), "curve25519:CAROLDEV": b64(priv.Seed())},
		}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.ReplaceRemoteDeviceList(ctx, storage.RemoteDeviceList{UserID: carol, StreamID: 1, FetchedTS: svc.nowMS(),
			Devices: []storage.RemoteDevice{{DeviceID: "CAROLDEV", KeyJSON: dk.Canonical}}}, server); err != nil {
			t.Fatal(err)
		}
		req := map[string]map[string]string{carol: {"CAROLDEV": "signed_curve25519"}}
		claim := func(key json.RawMessage) map[string]map[string]map[string]json.RawMessage {
			return svc.verifiedClaims(ctx, server, req, map[string]map[string]map[string]json.RawMessage{
				carol: {"CAROLDEV": {"signed_curve25519:K1": key}}})
		}

		var bad map[string]any
		_ = json.Unmarshal(sign(map[string]any{"key": b64(make([]byte, 32))}), &bad)
		bad["key"] = b64(priv.Seed()) // no longer what was signed
		badRaw, _ := json.Marshal(bad)
		if got := claim(badRaw); len(got) != 0 {
			t.Fatalf("a key with a bad signature was passed on: %s", got)
		}
		entries := hook.AllEntries()
		if len(entries) != 1 || entries[0].Level != logrus.WarnLevel || entries[0].Data["user_id"] != carol ||
			entries[0].Data["device_id"] != "CAROLDEV" || entries[0].Data["key"] != "signed_curve25519:K1" || entries[0].Data["server"] != server {
			t.Fatalf("log entries %+v", entries)
		}

		hook.Reset()
		good := sign(map[string]any{"key": b64(make([]byte, 32))})
		if got := claim(good); string(got[carol]["CAROLDEV"]["signed_curve25519:K1"]) != string(good) {
			t.Fatalf("a good key was not passed on: %s", got)
		}
		if n := len(hook.AllEntries()); n != 0 {
			t.Fatalf("%d log entries for a good key", n)
		}
	})
}
