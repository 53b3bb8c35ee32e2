package sqlstore_test

import (
	"context"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
)

// A change of a local user's master or self-signing key (or of their
// signature on the master key) is queued, in its transaction, for each
// server sharing a room with them: one pending update per user and
// destination carrying the keys at sending time (never the user-signing
// key), outside the device-list chain. Device updates carry the owner's
// signatures; another user's user-signing signature is not among them.
func TestOutboundSigningKeyUpdates(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		for _, u := range []string{"@a:x", "@c:x"} {
			if _, err := s.CreateAccount(ctx, u, "h", nil); err != nil {
				t.Fatal(err)
			}
		}
		for _, u := range []string{"@a:x", "@c:x", "@z:remote.example", "@y:other.example"} {
			if _, err := s.SetMembership(ctx, "!r:x", u, storage.MembershipJoin, 0); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.Login(ctx, storage.NewLogin{UserID: "@a:x", DeviceID: "DEV", TokenHash: "t"}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.UploadKeys(ctx, "@a:x", "DEV", nil, func(storage.KeyState) (storage.KeyWrite, error) {
			return storage.KeyWrite{DeviceKeys: []byte(`{"device_id":"DEV"}`)}, nil
		}); err != nil {
			t.Fatal(err)
		}
		for _, dest := range []string{"remote.example", "other.example"} {
			if err := s.MarkUpdatesSent(ctx, dest, mustPending(t, s, dest)); err != nil {
				t.Fatal(err)
			}
		}
		deviceChain := func() int64 {
			t.Helper()
			var id int64
			if err := s.DB().QueryRow(`SELECT stream_id FROM outbound_last_sent WHERE destination = 'remote.example' AND user_id = '@a:x'`).Scan(&id); err != nil {
				t.Fatal(err)
			}
			return id
		}
		chain := deviceChain()

		// A user-signing key alone goes nowhere.
		setKeys(t, s, "@a:x", map[string][]byte{storage.UsageUserSigning: []byte(`{"u":1}`)})
		if p := mustPending(t, s, "remote.example"); len(p) != 0 {
			t.Fatalf("a user-signing key was queued: %+v", p)
		}

		first := setKeys(t, s, "@a:x", map[string][]byte{storage.UsageMaster: []byte(`{"m":1}`), storage.UsageSelfSigning: []byte(`{"s":1}`)})
		second := setKeys(t, s, "@a:x", map[string][]byte{storage.UsageMaster: []byte(`{"m":2}`), storage.UsageSelfSigning: []byte(`{"s":2}`)})
		if first == 0 || second == 0 {
			t.Fatal("the uploads made no change")
		}
		q, err := s.OutboundQueue(ctx)
		if err != nil || q["remote.example"] != 1 || q["other.example"] != 1 || len(q) != 2 {
			t.Fatalf("queue %v %v, want one update per destination", q, err)
		}
		if d, err := s.PendingDestinations(ctx); err != nil || len(d) != 2 {
			t.Fatalf("destinations %v %v", d, err)
		}
		p := mustPending(t, s, "remote.example")
		if len(p) != 1 || !p[0].SigningKeys || p[0].UserID != "@a:x" || p[0].StreamID != int64(second) ||
			string(p[0].MasterKey) != `{"m":2}` || string(p[0].SelfSigningKey) != `{"s":2}` || p[0].PrevID != 0 {
			t.Fatalf("pending %+v, want the newest keys at %d", p, second)
		}

		// The owner signs the master key and the device; carol signs the
		// master key with her user-signing key.
		byOwner := storage.CrossSigningSignature{TargetUserID: "@a:x", TargetKeyID: "MPUB", SignerUserID: "@a:x", SignerKeyID: "ed25519:DEV", Signature: "m"}
		onDevice := storage.CrossSigningSignature{TargetUserID: "@a:x", TargetKeyID: "DEV", SignerUserID: "@a:x", SignerKeyID: "ed25519:SSK", Signature: "d"}
		byCarol := storage.CrossSigningSignature{TargetUserID: "@a:x", TargetKeyID: "MPUB", SignerUserID: "@c:x", SignerKeyID: "ed25519:USK", Signature: "c"}
		for _, sig := range []storage.CrossSigningSignature{byOwner, onDevice, byCarol} {
			if _, err := s.StoreSignatures(ctx, []storage.CrossSigningSignature{sig}); err != nil {
				t.Fatal(err)
			}
		}
		p = mustPending(t, s, "remote.example")
		if len(p) != 2 || !p[0].SigningKeys || p[0].StreamID <= int64(second) || p[1].SigningKeys || p[1].DeviceID != "DEV" {
			t.Fatalf("pending %+v, want the signing keys then the device", p)
		}
		if p[1].PrevID != chain {
			t.Errorf("the device update's prev_id is %d, want %d: the signing-key update broke the chain", p[1].PrevID, chain)
		}
		for _, u := range p {
			if len(u.Signatures) != 2 {
				t.Errorf("%+v: signatures %+v, want the owner's two", u, u.Signatures)
			}
			for _, sig := range u.Signatures {
				if sig.SignerUserID != "@a:x" {
					t.Errorf("another user's signature goes out: %+v", sig)
				}
			}
		}

		// Sent: the device chain moves on by the device update alone. A
		// change queued while a batch is out stays for the next one.
		third := setKeys(t, s, "@a:x", map[string][]byte{storage.UsageSelfSigning: []byte(`{"s":3}`)})
		if err := s.MarkUpdatesSent(ctx, "remote.example", p); err != nil {
			t.Fatal(err)
		}
		if got := deviceChain(); got != p[1].StreamID {
			t.Errorf("last sent %d, want the device update's %d", got, p[1].StreamID)
		}
		left := mustPending(t, s, "remote.example")
		if len(left) != 1 || !left[0].SigningKeys || left[0].StreamID != int64(third) || string(left[0].SelfSigningKey) != `{"s":3}` {
			t.Fatalf("left %+v, want the change made while sending", left)
		}
		if err := s.MarkUpdatesSent(ctx, "remote.example", left); err != nil {
			t.Fatal(err)
		}
		if p := mustPending(t, s, "remote.example"); len(p) != 0 {
			t.Fatalf("left after sending: %+v", p)
		}
		if p := mustPending(t, s, "other.example"); len(p) != 2 {
			t.Fatalf("the other destination's queue: %+v", p)
		}
	})
}
