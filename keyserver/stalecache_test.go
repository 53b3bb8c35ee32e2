package keyserver_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/keyserver"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// Two stores on one database, where the second has not heard of the
// first's changes: on SQLite, which has no notifications, its device cache
// keeps what it read (two daemons never share SQLite; here that stands in
// for a notification still on its way). What the second daemon tells
// clients and servers must still be the database's truth.
func TestStaleDeviceCacheIsNotTrusted(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, tdb testutil.Database) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		open := func() (*sqlstore.Store, *keyserver.Service) {
			st, svc := openService(ctx, t, tdb.URI)
			go func() { _ = st.WatchStream(ctx, func([]string) {}) }() // caches on for PostgreSQL too
			return st, svc
		}
		storeA, svcA := open()
		storeB, svcB := open()

		const userID = "@alice:local.test"
		if _, err := storeA.CreateAccount(ctx, userID, "x", &storage.NewLogin{UserID: userID, DeviceID: "D", TokenHash: "h1"}); err != nil {
			t.Fatal(err)
		}
		newDevice := func() *testutil.User {
			_, key, _ := ed25519.GenerateKey(rand.Reader)
			return &testutil.User{UserID: userID, DeviceID: "D", Key: key}
		}
		upload := func(svc *keyserver.Service, u *testutil.User, body map[string]any) error {
			raw, _ := json.Marshal(body)
			var r keyserver.UploadRequest
			if err := json.Unmarshal(raw, &r); err != nil {
				t.Fatal(err)
			}
			_, err := svc.UploadKeys(ctx, matrixid.Caller{UserID: u.UserID, DeviceID: u.DeviceID}, r)
			return err
		}
		old := newDevice()
		if err := upload(svcA, old, map[string]any{"device_keys": old.DeviceKeys(t)}); err != nil {
			t.Fatal(err)
		}
		if devs, err := storeB.DevicesWithKeys(ctx, []string{userID}); err != nil || len(devs) != 1 {
			t.Fatalf("B reads the device: %v %v", devs, err) // and caches it
		}
		// The device is deleted and made again under the same ID with new
		// identity keys, all through A.
		if _, _, err := storeA.DeleteDevices(ctx, userID, []string{"D"}); err != nil {
			t.Fatal(err)
		}
		if _, err := storeA.Login(ctx, storage.NewLogin{UserID: userID, DeviceID: "D", TokenHash: "h2"}); err != nil {
			t.Fatal(err)
		}
		cur := newDevice()
		if err := upload(svcA, cur, map[string]any{"device_keys": cur.DeviceKeys(t)}); err != nil {
			t.Fatal(err)
		}

		// B checks uploads against the stored keys, not its stale copy.
		if err := upload(svcB, cur, map[string]any{"one_time_keys": cur.OneTimeKeys(t, "B", 2)}); err != nil {
			t.Fatalf("one-time keys signed by the current device key, through B: %v", err)
		}
		if err := upload(svcB, cur, map[string]any{"device_keys": cur.DeviceKeys(t)}); err != nil {
			t.Fatalf("the current device keys again, through B: %v", err)
		}
		if err := upload(svcB, old, map[string]any{"one_time_keys": old.OneTimeKeys(t, "C", 1)}); err == nil {
			t.Fatal("B accepted a one-time key signed by the deleted device's key")
		}

		// B tells other servers the current list, at the current position.
		got, err := svcB.FederationUserDevices(ctx, userID)
		if err != nil {
			t.Fatal(err)
		}
		want, err := svcA.FederationUserDevices(ctx, userID)
		if err != nil {
			t.Fatal(err)
		}
		curKey := testutil.B64(cur.Key.Public().(ed25519.PublicKey))
		if len(got.Devices) != 1 || !strings.Contains(string(got.Devices[0].Keys), curKey) || got.StreamID != want.StreamID {
			var keys []string
			for _, d := range got.Devices {
				keys = append(keys, string(d.Keys))
			}
			t.Fatalf("B's /user/devices: stream %d, device keys %s; want stream %d and the key %s",
				got.StreamID, keys, want.StreamID, curKey)
		}
	})
}
