package keyserver_test

import (
	"context"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/keyserver"
	"github.com/keyserver/keyserver/storage"
)

// A user's answer to key queries is built once per cached copy of their
// keys and shared by the queries that follow, whoever asks; yet each
// viewer still sees what is theirs to see (a signature of the viewer's
// user-signing key, the display names or not), and a change shows at once.
func TestQueryAnswersAreBuiltOncePerChange(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, tdb testutil.Database) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		store, svc := openService(ctx, t, tdb.URI)
		go func() { _ = store.WatchStream(ctx, func([]string) {}) }() // caches on for PostgreSQL too

		const alice, bob, carol = "@alice:local.test", "@bob:local.test", "@carol:local.test"
		phone := "phone"
		if _, err := store.CreateAccount(ctx, alice, "x", &storage.NewLogin{UserID: alice, DeviceID: "D", TokenHash: "h", DisplayName: &phone}); err != nil {
			t.Fatal(err)
		}
		if _, err := store.UploadKeys(ctx, alice, "D", nil, func(storage.KeyState) (storage.KeyWrite, error) {
			return storage.KeyWrite{DeviceKeys: []byte(`{"device_id":"D","user_id":"` + alice + `"}`)}, nil
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := store.UploadCrossSigningKeys(ctx, alice, func(map[string][]byte) (storage.CrossSigningWrite, error) {
			return storage.CrossSigningWrite{Keys: map[string][]byte{
				storage.UsageMaster: []byte(`{"keys":{"ed25519:M":"M"},"usage":["master"],"user_id":"` + alice + `"}`),
			}}, nil
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := store.StoreSignatures(ctx, []storage.CrossSigningSignature{
			{TargetUserID: alice, TargetKeyID: "D", SignerUserID: alice, SignerKeyID: "ed25519:S", Signature: "by-alice"},
			{TargetUserID: alice, TargetKeyID: "M", SignerUserID: bob, SignerKeyID: "ed25519:B", Signature: "by-bob"},
		}); err != nil {
			t.Fatal(err)
		}

		query := func(viewer string) keyserver.QueryResponse {
			t.Helper()
			res, err := svc.QueryKeys(ctx, matrixid.Caller{UserID: viewer}, keyserver.QueryRequest{DeviceKeys: map[string][]string{alice: nil}})
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		testutil.Eventually(t, "alice's keys cached", func() bool {
			query(carol)
			before := store.StatementsSent()
			query(carol)
			return store.StatementsSent() == before
		})

		first, again := query(carol), query(carol)
		dev := first.DeviceKeys[alice]["D"]
		if !strings.Contains(string(dev), `"unsigned":{"device_display_name":"phone"}`) || !strings.Contains(string(dev), `"by-alice"`) {
			t.Fatalf("carol sees alice's device as %s", dev)
		}
		if again := again.DeviceKeys[alice]["D"]; len(again) == 0 || &again[0] != &dev[0] {
			t.Fatal("the second query built alice's device keys again")
		}
		if m := string(first.MasterKeys[alice]); strings.Contains(m, "by-bob") {
			t.Fatalf("carol sees bob's signature: %s", m)
		}

		// Bob sees his signature, and carol still does not after him.
		if m := string(query(bob).MasterKeys[alice]); !strings.Contains(m, "by-bob") {
			t.Fatalf("bob does not see his signature: %s", m)
		}
		if m := string(query(carol).MasterKeys[alice]); strings.Contains(m, "by-bob") {
			t.Fatalf("after bob's query carol sees his signature: %s", m)
		}
		// Another server sees no display name (the default).
		fed, err := svc.FederationQueryKeys(ctx, map[string][]string{alice: nil})
		if err != nil {
			t.Fatal(err)
		}
		if d := string(fed.DeviceKeys[alice]["D"]); !strings.Contains(d, `"unsigned":{}`) || strings.Contains(d, "phone") {
			t.Fatalf("another server sees alice's device as %s", d)
		}

		// A new name is shown at once.
		if _, err := store.SetDeviceDisplayName(ctx, alice, "D", "laptop"); err != nil {
			t.Fatal(err)
		}
		if d := string(query(carol).DeviceKeys[alice]["D"]); !strings.Contains(d, `"device_display_name":"laptop"`) {
			t.Fatalf("after the rename carol sees %s", d)
		}
	})
}
