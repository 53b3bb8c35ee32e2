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

// Two users sharing a room, on two federated daemons that each already
// follow the other's device list, bootstrap cross-signing with mautrix-go
// and verify each other: each server learns the other user's keys and
// device signature from the updates sent to it (no fetch of the list
// again), and a fresh device of each finds the other's device verified.
func TestRealClientsCrossSignThroughUpdates(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		a := testutil.StartNode(t, db, nil)
		b := testutil.StartNode(t, testutil.SQLite(t), nil)
		alice := a.Register(t, "alice", "")
		bob := b.Register(t, "bob", "")
		am, bm := realClient(t, a, alice), realClient(t, b, bob)
		for _, n := range []*testutil.Node{a, b} {
			n.Join(t, "!shared:x", alice.UserID)
			n.Join(t, "!shared:x", bob.UserID)
		}
		// Each client asks for the other user's keys, as a client does on
		// sharing a room: the list is fetched then.
		a.Must(t, "POST", "/_matrix/client/v3/keys/query", alice.Token, map[string]any{"device_keys": map[string]any{bob.UserID: []string{}}})
		b.Must(t, "POST", "/_matrix/client/v3/keys/query", bob.Token, map[string]any{"device_keys": map[string]any{alice.UserID: []string{}}})
		following := func(n *testutil.Node, user string) bool {
			_, stale, err := n.Store.StaleEntry(ctx, user)
			lists, err2 := n.Store.RemoteDeviceLists(ctx, []string{user})
			return err == nil && err2 == nil && !stale && lists[user] != nil && n.Updater.InFlight() == 0
		}
		testutil.Eventually(t, "each server to follow the other's user", func() bool {
			return following(a, bob.UserID) && following(b, alice.UserID)
		})
		const devicesPath = "/_matrix/federation/v1/user/devices/"
		fetchedFromA, fetchedFromB := a.Requests.Count("GET", devicesPath), b.Requests.Count("GET", devicesPath)

		bootstrap(t, am, alice)
		bootstrap(t, bm, bob)
		// A /send is answered once its updates are visible: an empty queue
		// means the other server has them.
		for _, n := range []*testutil.Node{a, b} {
			testutil.Eventually(t, "the updates to be delivered", func() bool {
				pending, err := n.Store.PendingDestinations(ctx)
				return err == nil && len(pending) == 0
			})
		}
		verify(t, am, id.UserID(bob.UserID))
		verify(t, bm, id.UserID(alice.UserID))

		aliceSeeds, bobSeeds := am.ExportCrossSigningKeys(), bm.ExportCrossSigningKeys()
		if got := trustFrom(t, a, alice, &aliceSeeds, id.UserID(bob.UserID), id.DeviceID(bob.DeviceID)); got != id.TrustStateCrossSignedVerified {
			t.Errorf("alice's new device trusts bob's device as %s, want %s", got, id.TrustStateCrossSignedVerified)
		}
		if got := trustFrom(t, b, bob, &bobSeeds, id.UserID(alice.UserID), id.DeviceID(alice.DeviceID)); got != id.TrustStateCrossSignedVerified {
			t.Errorf("bob's new device trusts alice's device as %s, want %s", got, id.TrustStateCrossSignedVerified)
		}
		if n := a.Requests.Count("GET", devicesPath) - fetchedFromA; n != 0 {
			t.Errorf("B fetched alice's list %d more times", n)
		}
		if n := b.Requests.Count("GET", devicesPath) - fetchedFromB; n != 0 {
			t.Errorf("A fetched bob's list %d more times", n)
		}
	})
}
