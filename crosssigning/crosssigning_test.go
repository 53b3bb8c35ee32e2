package crosssigning_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/keyserver/keyserver/crosssigning"
	"github.com/keyserver/keyserver/internal/canonicaljson"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
)

func raw(t *testing.T, v any) json.RawMessage {
	t.Helper()
	js, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func code(err error) string {
	var me *mxerr.Error
	if errors.As(err, &me) {
		return me.Code
	}
	if err != nil {
		return err.Error()
	}
	return ""
}

// Signatures added to a stored object keep the ones it had, and the
// result is canonical.
func TestWithSignaturesKeepsTheObjectsOwn(t *testing.T) {
	xs := testutil.NewCrossSigning("@a:x")
	ssk, err := crosssigning.Parse("self_signing_key", raw(t, xs.SelfSigningKey(t)), storage.UsageSelfSigning, "@a:x")
	if err != nil {
		t.Fatal(err)
	}
	out, err := crosssigning.WithSignatures(ssk.Canonical, []storage.CrossSigningSignature{
		{SignerUserID: "@a:x", SignerKeyID: "ed25519:DEV", Signature: "s1"},
		{SignerUserID: "@b:x", SignerKeyID: "ed25519:USK", Signature: "s2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	master := crosssigning.ParseStored(raw(t, xs.MasterKey()), storage.UsageMaster)
	if err := crosssigning.CheckSignedByMaster("self_signing_key", crosssigning.ParseStored(out, storage.UsageSelfSigning), master); err != nil {
		t.Errorf("the master key's signature was lost: %v (%s)", err, out)
	}
	if crosssigning.Signature(out, "@a:x", "ed25519:DEV") != "s1" || crosssigning.Signature(out, "@b:x", "ed25519:USK") != "s2" {
		t.Errorf("added signatures missing: %s", out)
	}
	if canon, _ := canonicaljson.WithoutUnsigned(out); string(canon) != string(out) {
		t.Errorf("not canonical: %s", out)
	}
}

// A master key is signed by its owner's devices: every device signature
// named must verify, and at least one must be there.
func TestOwnMasterKeySignedByDevices(t *testing.T) {
	xs := testutil.NewCrossSigning("@a:x")
	dev := &testutil.User{UserID: "@a:x", DeviceID: "DEV"}
	other := &testutil.User{UserID: "@a:x", DeviceID: "OTHER"}
	for _, u := range []*testutil.User{dev, other} {
		u.Key = testutil.NewCrossSigning("@a:x").Master // any ed25519 key
	}
	stored := crosssigning.ParseStored(raw(t, xs.MasterKey()), storage.UsageMaster)
	signer := crosssigning.Signer{UserID: "@a:x", DeviceKeys: map[string]string{
		"DEV": testutil.PublicKey(dev.Key), "OTHER": testutil.PublicKey(other.Key)}}
	target := crosssigning.Target{UserID: "@a:x", KeyID: stored.PublicKey, Master: true, Stored: stored.Canonical}

	good := testutil.Sign(t, xs.MasterKey(), "@a:x", "DEV", dev.Key)
	sigs, err := crosssigning.CheckUpload(signer, target, raw(t, good))
	if err != nil || len(sigs) != 1 || sigs[0].SignerKeyID != "ed25519:DEV" {
		t.Fatalf("signed by a device: %v %v", sigs, err)
	}
	// OTHER's signature is made with DEV's key.
	bad := testutil.Sign(t, good, "@a:x", "OTHER", dev.Key)
	if _, err := crosssigning.CheckUpload(signer, target, raw(t, bad)); code(err) != "M_INVALID_SIGNATURE" {
		t.Errorf("one bad device signature: %v", err)
	}
	if _, err := crosssigning.CheckUpload(signer, target, raw(t, xs.MasterKey())); code(err) != "M_INVALID_SIGNATURE" {
		t.Errorf("no device signature: %v", err)
	}
	// Another user's device cannot be signed at all.
	if _, err := crosssigning.CheckUpload(crosssigning.Signer{UserID: "@b:x"}, crosssigning.Target{UserID: "@a:x", KeyID: "DEV"},
		raw(t, good)); code(err) != "M_UNKNOWN" {
		t.Errorf("another user's device: %v", err)
	}
}

// Signatures on a user's keys are shown to everyone when the user made
// them, and otherwise to their signer only; another server is "".
func TestVisible(t *testing.T) {
	own := storage.CrossSigningSignature{SignerUserID: "@a:x"}
	theirs := storage.CrossSigningSignature{SignerUserID: "@b:x"}
	for _, c := range []struct {
		sig    storage.CrossSigningSignature
		viewer string
		want   bool
	}{{own, "@c:x", true}, {own, "", true}, {theirs, "@b:x", true}, {theirs, "@a:x", false}, {theirs, "@c:x", false}, {theirs, "", false}} {
		if got := crosssigning.Visible(c.sig, "@a:x", c.viewer); got != c.want {
			t.Errorf("signature by %s seen by %q: %v, want %v", c.sig.SignerUserID, c.viewer, got, c.want)
		}
	}
}
