//go:build goolm

package clientcompat

import (
	"context"
	"testing"

	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/crypto"
	"maunium.net/go/mautrix/id"

	"github.com/keyserver/keyserver/internal/testutil"
)

// realClient is mautrix-go's crypto machine (its pure-Go olm) for one
// device, keeping its state in memory.
func realClient(t *testing.T, n *testutil.Node, u *testutil.User) *crypto.OlmMachine {
	t.Helper()
	ctx := context.Background()
	cli, err := mautrix.NewClient(n.URL, id.UserID(u.UserID), u.Token)
	if err != nil {
		t.Fatal(err)
	}
	cli.DeviceID = id.DeviceID(u.DeviceID)
	mach := crypto.NewOlmMachine(cli, nil, crypto.NewMemoryStore(nil), mautrix.NewMemoryStateStore().(crypto.StateStore))
	if err := mach.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := mach.ShareKeys(ctx, -1); err != nil {
		t.Fatalf("%s uploads its keys: %v", u.UserID, err)
	}
	return mach
}

// passwordUIA answers a user-interactive auth challenge with the password.
func passwordUIA(u *testutil.User) mautrix.UIACallback {
	return func(r *mautrix.RespUserInteractive) any {
		return map[string]any{"type": "m.login.password", "session": r.Session, "password": u.Password,
			"identifier": map[string]any{"type": "m.id.user", "user": u.UserID}}
	}
}

// bootstrap sets up cross-signing as a client does on first login: keys
// made and published, and the client's own device signed.
func bootstrap(t *testing.T, mach *crypto.OlmMachine, u *testutil.User) {
	t.Helper()
	ctx := context.Background()
	keys, err := mach.GenerateCrossSigningKeys()
	if err != nil {
		t.Fatal(err)
	}
	if err := mach.PublishCrossSigningKeys(ctx, keys, passwordUIA(u)); err != nil {
		t.Fatalf("%s publishes cross-signing keys: %v", u.UserID, err)
	}
	if err := mach.SignOwnDevice(ctx, mach.OwnIdentity()); err != nil {
		t.Fatalf("%s signs its device: %v", u.UserID, err)
	}
}

// verify has mach's user sign other's master key, as fetched from the server.
func verify(t *testing.T, mach *crypto.OlmMachine, other id.UserID) {
	t.Helper()
	ctx := context.Background()
	if _, err := mach.FetchKeys(ctx, []id.UserID{other}, true); err != nil {
		t.Fatal(err)
	}
	keys, err := mach.GetCrossSigningPublicKeys(ctx, other)
	if err != nil || keys == nil {
		t.Fatalf("%s's cross-signing keys as fetched: %v %v", other, keys, err)
	}
	if err := mach.SignUser(ctx, other, keys.MasterKey); err != nil {
		t.Fatalf("signing %s: %v", other, err)
	}
}

// trustFrom is how a fresh device of the signer (its cross-signing keys
// restored, as from secret storage, and nothing else remembered) judges
// other's device: from what the server tells it alone.
func trustFrom(t *testing.T, n *testutil.Node, signer *testutil.User, seeds *crypto.CrossSigningSeeds, other id.UserID, device id.DeviceID) id.TrustState {
	t.Helper()
	ctx := context.Background()
	mach := realClient(t, n, n.Login(t, signer, ""))
	if seeds != nil {
		if err := mach.ImportCrossSigningKeys(*seeds); err != nil {
			t.Fatal(err)
		}
	}
	devices, err := mach.FetchKeys(ctx, []id.UserID{other}, true)
	if err != nil {
		t.Fatal(err)
	}
	d := devices[other][device]
	if d == nil {
		t.Fatalf("%s's device %s not fetched: %v", other, device, devices)
	}
	trust, err := mach.ResolveTrustContext(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	return trust
}

// Two users on two federated daemons, each with mautrix-go's crypto,
// bootstrap cross-signing, sign their own device and verify each other
// through their user-signing keys; a fresh device of each then finds the
// other's device cross-signed and verified, while a third user, who
// verified nobody, does not.
func TestRealClientsCrossSignAcrossServers(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a := testutil.StartNode(t, db, nil)
		b := testutil.StartNode(t, testutil.SQLite(t), nil)
		alice := a.Register(t, "alice", "")
		carol := a.Register(t, "carol", "")
		bob := b.Register(t, "bob", "")
		am, bm, cm := realClient(t, a, alice), realClient(t, b, bob), realClient(t, a, carol)
		bootstrap(t, am, alice)
		bootstrap(t, bm, bob)
		bootstrap(t, cm, carol)
		verify(t, am, id.UserID(bob.UserID))
		verify(t, bm, id.UserID(alice.UserID))

		aliceSeeds, bobSeeds, carolSeeds := am.ExportCrossSigningKeys(), bm.ExportCrossSigningKeys(), cm.ExportCrossSigningKeys()
		if got := trustFrom(t, a, alice, &aliceSeeds, id.UserID(bob.UserID), id.DeviceID(bob.DeviceID)); got != id.TrustStateCrossSignedVerified {
			t.Errorf("alice's new device trusts bob's device as %s, want %s", got, id.TrustStateCrossSignedVerified)
		}
		if got := trustFrom(t, b, bob, &bobSeeds, id.UserID(alice.UserID), id.DeviceID(alice.DeviceID)); got != id.TrustStateCrossSignedVerified {
			t.Errorf("bob's new device trusts alice's device as %s, want %s", got, id.TrustStateCrossSignedVerified)
		}
		// Alice's signature on bob's key is hers alone: carol sees bob's
		// device cross-signed by bob, not verified by her.
		if got := trustFrom(t, a, carol, &carolSeeds, id.UserID(bob.UserID), id.DeviceID(bob.DeviceID)); got != id.TrustStateCrossSignedTOFU {
			t.Errorf("carol trusts bob's device as %s, want %s", got, id.TrustStateCrossSignedTOFU)
		}
	})
}
