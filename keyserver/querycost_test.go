package keyserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/keyserver"
	"github.com/keyserver/keyserver/storage"
)

// A local /keys/query sends at most one SQL statement however many users
// and devices it names: every statement the store sends is counted.
func TestLocalQueryIsOneRoundTrip(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, tdb testutil.Database) {
		ctx := context.Background()
		store, svc := openService(ctx, t, tdb.URI)
		users := map[string][]string{}
		for i := 0; i < 40; i++ {
			u := fmt.Sprintf("@u%d:local.test", i)
			if _, err := store.CreateAccount(ctx, u, "x", nil); err != nil {
				t.Fatal(err)
			}
			for d := 0; d < 3; d++ {
				dev := fmt.Sprintf("D%d", d)
				if _, err := store.Login(ctx, storage.NewLogin{UserID: u, DeviceID: dev, TokenHash: u + dev}); err != nil {
					t.Fatal(err)
				}
				if _, err := store.UploadKeys(ctx, u, dev, nil, func(storage.KeyState) (storage.KeyWrite, error) {
					return storage.KeyWrite{DeviceKeys: []byte(`{"device_id":"` + dev + `"}`)}, nil
				}); err != nil {
					t.Fatal(err)
				}
			}
			users[u] = nil
		}
		// Cold, for one user and then for the 39 others; then all 40 again,
		// which the device cache may answer without any statement.
		var ids []string
		for u := range users {
			ids = append(ids, u)
		}
		for _, group := range [][]string{ids[:1], ids[1:], ids} {
			req := map[string][]string{}
			for _, u := range group {
				req[u] = []string{}
			}
			before := store.StatementsSent()
			res, err := svc.QueryKeys(ctx, matrixid.Caller{UserID: "@u0:local.test"}, keyserver.QueryRequest{DeviceKeys: req})
			if err != nil {
				t.Fatal(err)
			}
			got := 0
			for _, devs := range res.DeviceKeys {
				got += len(devs)
			}
			if got != 3*len(group) {
				raw, _ := json.Marshal(res)
				t.Fatalf("%d users: %d devices in %s", len(group), got, raw)
			}
			c := store.StatementsSent() - before
			if c > 1 || (c == 0 && len(group) < len(ids)) {
				t.Fatalf("%d users: %d SQL statements, want 1 (or none once all are cached)", len(group), c)
			}
		}
	})
}

// Cross-signing keys and the signatures on devices and master keys come in
// the same single statement as the devices.
func TestLocalQueryWithCrossSigningIsOneRoundTrip(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, tdb testutil.Database) {
		ctx := context.Background()
		store, svc := openService(ctx, t, tdb.URI)
		req := map[string][]string{}
		for i := 0; i < 10; i++ {
			u := fmt.Sprintf("@u%d:local.test", i)
			req[u] = nil
			if _, err := store.CreateAccount(ctx, u, "x", nil); err != nil {
				t.Fatal(err)
			}
			if _, err := store.Login(ctx, storage.NewLogin{UserID: u, DeviceID: "D", TokenHash: u}); err != nil {
				t.Fatal(err)
			}
			if _, err := store.UploadKeys(ctx, u, "D", nil, func(storage.KeyState) (storage.KeyWrite, error) {
				return storage.KeyWrite{DeviceKeys: []byte(`{"device_id":"D"}`)}, nil
			}); err != nil {
				t.Fatal(err)
			}
			if _, err := store.UploadCrossSigningKeys(ctx, u, func(map[string][]byte) (storage.CrossSigningWrite, error) {
				return storage.CrossSigningWrite{Keys: map[string][]byte{
					storage.UsageMaster:      []byte(`{"keys":{"ed25519:M` + u + `":"M` + u + `"},"usage":["master"],"user_id":"` + u + `"}`),
					storage.UsageSelfSigning: []byte(`{"keys":{"ed25519:S":"S"},"usage":["self_signing"],"user_id":"` + u + `"}`),
				}}, nil
			}); err != nil {
				t.Fatal(err)
			}
			if _, err := store.StoreSignatures(ctx, []storage.CrossSigningSignature{
				{TargetUserID: u, TargetKeyID: "D", SignerUserID: u, SignerKeyID: "ed25519:S", Signature: "sigD"},
				{TargetUserID: u, TargetKeyID: "M" + u, SignerUserID: u, SignerKeyID: "ed25519:D", Signature: "sigM"},
			}); err != nil {
				t.Fatal(err)
			}
		}
		before := store.StatementsSent()
		res, err := svc.QueryKeys(ctx, matrixid.Caller{UserID: "@u0:local.test"}, keyserver.QueryRequest{DeviceKeys: req})
		if err != nil {
			t.Fatal(err)
		}
		if c := store.StatementsSent() - before; c > 1 {
			t.Fatalf("%d SQL statements, want 1", c)
		}
		raw, _ := json.Marshal(res)
		for u := range req {
			dev := string(res.DeviceKeys[u]["D"])
			if !strings.Contains(dev, `"sigD"`) || !strings.Contains(string(res.MasterKeys[u]), `"sigM"`) || res.SelfSigningKeys[u] == nil {
				t.Fatalf("%s without its cross-signing keys and signatures: %s", u, raw)
			}
		}
	})
}
