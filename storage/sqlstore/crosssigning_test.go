package sqlstore_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

func setKeys(t *testing.T, s *sqlstore.Store, user string, keys map[string][]byte) storage.StreamPos {
	t.Helper()
	pos, err := s.UploadCrossSigningKeys(context.Background(), user, func(map[string][]byte) (storage.CrossSigningWrite, error) {
		return storage.CrossSigningWrite{Keys: keys}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pos.Pos
}

func changedFor(t *testing.T, s *sqlstore.Store, user string, from storage.StreamPos) []string {
	t.Helper()
	to, err := s.CurrentPos(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ch, err := s.DeviceListChanges(context.Background(), user, from, to)
	if err != nil {
		t.Fatal(err)
	}
	return ch.Changed
}

// Cross-signing keys are stored per usage; a changed master or
// self-signing key is a change for the user's room-mates, a user-signing
// key one for the user alone, an identical upload no change at all.
func TestCrossSigningKeysAndTheirChanges(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		for _, u := range []string{"@a:x", "@b:x", "@c:x"} {
			if _, err := s.CreateAccount(ctx, u, "h", nil); err != nil {
				t.Fatal(err)
			}
		}
		for _, u := range []string{"@a:x", "@b:x"} {
			if _, err := s.SetMembership(ctx, "!r:x", u, storage.MembershipJoin, 0); err != nil {
				t.Fatal(err)
			}
		}
		start, _ := s.CurrentPos(ctx)
		keys := map[string][]byte{storage.UsageMaster: []byte(`{"m":1}`), storage.UsageSelfSigning: []byte(`{"s":1}`)}
		if pos := setKeys(t, s, "@a:x", keys); pos == 0 {
			t.Fatal("first upload made no change")
		}
		if got := changedFor(t, s, "@b:x", start); !slices.Equal(got, []string{"@a:x"}) {
			t.Errorf("room-mate sees %v, want @a:x", got)
		}
		if got := changedFor(t, s, "@c:x", start); len(got) != 0 {
			t.Errorf("stranger sees %v", got)
		}
		if pos := setKeys(t, s, "@a:x", keys); pos != 0 {
			t.Errorf("identical upload made change %d", pos)
		}

		from, _ := s.CurrentPos(ctx)
		setKeys(t, s, "@a:x", map[string][]byte{storage.UsageUserSigning: []byte(`{"u":1}`)})
		if got := changedFor(t, s, "@b:x", from); len(got) != 0 {
			t.Errorf("a user-signing key reached the room-mate: %v", got)
		}
		if got := changedFor(t, s, "@a:x", from); !slices.Equal(got, []string{"@a:x"}) {
			t.Errorf("owner sees %v after a user-signing key", got)
		}
		cs, err := s.UserCrossSigning(ctx, "@a:x")
		if err != nil || len(cs.Keys) != 3 || string(cs.Keys[storage.UsageMaster]) != `{"m":1}` {
			t.Fatalf("stored: %v %v", cs.Keys, err)
		}

		// decide sees the stored keys; its error writes nothing.
		boom := errors.New("refused")
		_, err = s.UploadCrossSigningKeys(ctx, "@a:x", func(stored map[string][]byte) (storage.CrossSigningWrite, error) {
			if string(stored[storage.UsageSelfSigning]) != `{"s":1}` {
				t.Errorf("decide saw %v", stored)
			}
			return storage.CrossSigningWrite{}, boom
		})
		if !errors.Is(err, boom) {
			t.Errorf("decide's error: %v", err)
		}
		if _, err := s.UploadCrossSigningKeys(ctx, "@nobody:x", func(map[string][]byte) (storage.CrossSigningWrite, error) {
			return storage.CrossSigningWrite{}, nil
		}); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("unknown user: %v", err)
		}

		// Deactivation deletes the keys.
		if _, err := s.DeactivateAccount(ctx, "@a:x", 1); err != nil {
			t.Fatal(err)
		}
		if cs, err := s.UserCrossSigning(ctx, "@a:x"); err != nil || len(cs.Keys) != 0 {
			t.Errorf("after deactivation: %v %v", cs.Keys, err)
		}
	})
}

// Signatures are stored once; a new one on a device is a change of the
// device (queued for other servers too), one by the owner on their master
// key a change for room-mates, one by another user's user-signing key a
// change for the signer alone. Key queries see them at once, in one
// statement, and they go with a deleted device.
func TestCrossSigningSignatures(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		for _, u := range []string{"@a:x", "@b:x", "@c:x"} {
			if _, err := s.CreateAccount(ctx, u, "h", nil); err != nil {
				t.Fatal(err)
			}
			if _, err := s.SetMembership(ctx, "!r:x", u, storage.MembershipJoin, 0); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.SetMembership(ctx, "!r:x", "@z:remote.example", storage.MembershipJoin, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Login(ctx, storage.NewLogin{UserID: "@a:x", DeviceID: "DEV", TokenHash: "t"}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.UploadKeys(ctx, "@a:x", "DEV", nil, func(storage.KeyState) (storage.KeyWrite, error) {
			return storage.KeyWrite{DeviceKeys: []byte(`{"device_id":"DEV"}`)}, nil
		}); err != nil {
			t.Fatal(err)
		}
		setKeys(t, s, "@a:x", map[string][]byte{storage.UsageMaster: []byte(`{"m":1}`)})
		// Cached before the signatures arrive.
		if k, err := s.UserKeys(ctx, []string{"@a:x", "@c:x"}); err != nil || len(k["@a:x"].Devices) != 1 || k["@c:x"] != nil {
			t.Fatalf("keys before: %+v %v", k, err)
		}
		if err := s.MarkUpdatesSent(ctx, "remote.example", mustPending(t, s, "remote.example")); err != nil {
			t.Fatal(err)
		}

		onDevice := storage.CrossSigningSignature{TargetUserID: "@a:x", TargetKeyID: "DEV", SignerUserID: "@a:x", SignerKeyID: "ed25519:SSK", Signature: "sig1"}
		from, _ := s.CurrentPos(ctx)
		if ch, err := s.StoreSignatures(ctx, []storage.CrossSigningSignature{onDevice}); err != nil || ch.Pos == 0 {
			t.Fatalf("device signature: %d %v", ch.Pos, err)
		}
		if got := changedFor(t, s, "@b:x", from); !slices.Equal(got, []string{"@a:x"}) {
			t.Errorf("room-mate sees %v after a device signature", got)
		}
		if p := mustPending(t, s, "remote.example"); len(p) != 1 || p[0].DeviceID != "DEV" {
			t.Errorf("queued for the remote server: %+v", p)
		}
		if ch, err := s.StoreSignatures(ctx, []storage.CrossSigningSignature{onDevice}); err != nil || ch.Pos != 0 {
			t.Errorf("the same signature again: %d %v", ch.Pos, err)
		}

		from, _ = s.CurrentPos(ctx)
		byUSK := storage.CrossSigningSignature{TargetUserID: "@a:x", TargetKeyID: "MPUB", SignerUserID: "@c:x", SignerKeyID: "ed25519:USK", Signature: "sig2"}
		if _, err := s.StoreSignatures(ctx, []storage.CrossSigningSignature{byUSK}); err != nil {
			t.Fatal(err)
		}
		if got := changedFor(t, s, "@b:x", from); len(got) != 0 {
			t.Errorf("room-mate sees %v after another user's user-signing signature", got)
		}
		if got := changedFor(t, s, "@a:x", from); len(got) != 0 {
			t.Errorf("the signed user sees %v", got)
		}
		if got := changedFor(t, s, "@c:x", from); !slices.Equal(got, []string{"@c:x"}) {
			t.Errorf("signer sees %v", got)
		}
		from, _ = s.CurrentPos(ctx)
		byOwner := storage.CrossSigningSignature{TargetUserID: "@a:x", TargetKeyID: "MPUB", SignerUserID: "@a:x", SignerKeyID: "ed25519:DEV", Signature: "sig3"}
		if _, err := s.StoreSignatures(ctx, []storage.CrossSigningSignature{byOwner}); err != nil {
			t.Fatal(err)
		}
		if got := changedFor(t, s, "@b:x", from); !slices.Equal(got, []string{"@a:x"}) {
			t.Errorf("room-mate sees %v after the owner's signature on the master key", got)
		}

		before := s.StatementsSent()
		k, err := s.UserKeys(ctx, []string{"@a:x", "@b:x"})
		if err != nil {
			t.Fatal(err)
		}
		if n := s.StatementsSent() - before; n > 1 {
			t.Errorf("%d statements for a key query", n)
		}
		a := k["@a:x"]
		if a == nil || len(a.Devices) != 1 || string(a.Keys[storage.UsageMaster]) != `{"m":1}` || len(a.Signatures) != 3 {
			t.Fatalf("keys after: %+v", a)
		}
		if k["@b:x"] != nil {
			t.Errorf("@b:x has nothing yet is answered: %+v", k["@b:x"])
		}
		got := map[string]string{}
		for _, sig := range a.Signatures {
			got[sig.TargetKeyID+"/"+sig.SignerUserID+"/"+sig.SignerKeyID] = sig.Signature
		}
		if got["DEV/@a:x/ed25519:SSK"] != "sig1" || got["MPUB/@c:x/ed25519:USK"] != "sig2" || got["MPUB/@a:x/ed25519:DEV"] != "sig3" {
			t.Errorf("signatures: %v", got)
		}

		// A deleted device takes its signatures along.
		if _, _, err := s.DeleteDevices(ctx, "@a:x", []string{"DEV"}); err != nil {
			t.Fatal(err)
		}
		cs, err := s.UserCrossSigning(ctx, "@a:x")
		if err != nil || len(cs.Signatures) != 2 {
			t.Errorf("signatures after the device's deletion: %+v %v", cs.Signatures, err)
		}
	})
}

func mustPending(t *testing.T, s *sqlstore.Store, dest string) []storage.OutboundUpdate {
	t.Helper()
	p, err := s.PendingUpdates(context.Background(), dest, 100)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
