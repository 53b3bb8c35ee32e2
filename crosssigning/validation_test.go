package crosssigning_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/keyserver/keyserver/crosssigning"
	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
)

// A cross-signing key object names its owner (the caller), its one usage
// and exactly one ed25519 key, named by itself; its canonical form keeps
// the signatures and drops unsigned.
func TestParse(t *testing.T) {
	const alice = "@alice:x"
	xs := testutil.NewCrossSigning(alice)
	pub := testutil.PublicKey(xs.Master)

	obj := xs.MasterKey()
	obj["unsigned"] = map[string]any{"note": "servers may add this"}
	obj["signatures"] = map[string]any{alice: map[string]string{"ed25519:DEV": "sig"}}
	k, err := crosssigning.Parse("master_key", raw(t, obj), storage.UsageMaster, alice)
	if err != nil {
		t.Fatal(err)
	}
	if k.UserID != alice || k.Usage != storage.UsageMaster || k.PublicKey != pub || k.KeyID() != "ed25519:"+pub {
		t.Fatalf("parsed %+v", k)
	}
	var canon map[string]json.RawMessage
	_ = json.Unmarshal(k.Canonical, &canon)
	if _, has := canon["unsigned"]; has || canon["signatures"] == nil {
		t.Fatalf("canonical form %s", k.Canonical)
	}
	if crosssigning.PublicKeyOf(k.Canonical) != pub {
		t.Fatalf("PublicKeyOf %q", crosssigning.PublicKeyOf(k.Canonical))
	}
	if s := crosssigning.ParseStored(k.Canonical, storage.UsageMaster); s.UserID != alice || s.PublicKey != pub {
		t.Fatalf("ParseStored %+v", s)
	}
	if crosssigning.ParseStored(nil, storage.UsageMaster) != nil {
		t.Fatal("nothing stored parsed as a key")
	}

	other := testutil.NewCrossSigning(alice).Master
	otherPub := testutil.PublicKey(other)
	for name, c := range map[string]struct {
		change func(map[string]any)
		code   string
	}{
		"no user_id":    {func(o map[string]any) { delete(o, "user_id") }, "M_MISSING_PARAM"},
		"another user":  {func(o map[string]any) { o["user_id"] = "@bob:x" }, "M_INVALID_PARAM"},
		"another usage": {func(o map[string]any) { o["usage"] = []string{"self_signing"} }, "M_INVALID_PARAM"},
		"two usages":    {func(o map[string]any) { o["usage"] = []string{"master", "self_signing"} }, "M_INVALID_PARAM"},
		"no usage":      {func(o map[string]any) { delete(o, "usage") }, "M_INVALID_PARAM"},
		"two keys": {func(o map[string]any) {
			o["keys"] = map[string]string{"ed25519:" + pub: pub, "ed25519:" + otherPub: otherPub}
		}, "M_INVALID_PARAM"},
		"no keys":           {func(o map[string]any) { o["keys"] = map[string]string{} }, "M_INVALID_PARAM"},
		"misnamed key":      {func(o map[string]any) { o["keys"] = map[string]string{"ed25519:" + otherPub: pub} }, "M_INVALID_PARAM"},
		"not ed25519":       {func(o map[string]any) { o["keys"] = map[string]string{"curve25519:" + pub: pub} }, "M_INVALID_PARAM"},
		"short key":         {func(o map[string]any) { o["keys"] = map[string]string{"ed25519:abcd": "abcd"} }, "M_INVALID_PARAM"},
		"padded base64 key": {func(o map[string]any) { o["keys"] = map[string]string{"ed25519:" + pub + "=": pub + "="} }, "M_INVALID_PARAM"},
		"user_id not text":  {func(o map[string]any) { o["user_id"] = 5 }, "M_INVALID_PARAM"},
	} {
		o := xs.MasterKey()
		c.change(o)
		if _, err := crosssigning.Parse("master_key", raw(t, o), storage.UsageMaster, alice); code(err) != c.code {
			t.Errorf("%s: %v, want %s", name, err, c.code)
		}
	}
	for _, notObject := range []string{`[]`, `"key"`, `null`, `{`} {
		if _, err := crosssigning.Parse("master_key", json.RawMessage(notObject), storage.UsageMaster, alice); code(err) != "M_INVALID_PARAM" {
			t.Errorf("%s: %v", notObject, err)
		}
	}
}

// A self-signing or user-signing key must carry a valid signature of the
// master key; one by another key, or over other content, does not count.
func TestCheckSignedByMaster(t *testing.T) {
	const alice = "@alice:x"
	xs := testutil.NewCrossSigning(alice)
	master := crosssigning.ParseStored(raw(t, xs.MasterKey()), storage.UsageMaster)
	parse := func(obj map[string]any) *crosssigning.Key {
		k, err := crosssigning.Parse("self_signing_key", raw(t, obj), storage.UsageSelfSigning, alice)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	if err := crosssigning.CheckSignedByMaster("self_signing_key", parse(xs.SelfSigningKey(t)), master); err != nil {
		t.Fatalf("signed by the master key: %v", err)
	}
	unsignedSSK := testutil.KeyObject(alice, "self_signing", xs.SelfSigning)
	byOther := testutil.SignWith(t, testutil.KeyObject(alice, "self_signing", xs.SelfSigning), alice, xs.UserSigning)
	tampered := xs.SelfSigningKey(t)
	tampered["extra"] = "added after signing"
	// The unsigned member is not signed: a server may add it.
	withUnsigned := xs.SelfSigningKey(t)
	withUnsigned["unsigned"] = map[string]any{"x": 1}
	if err := crosssigning.CheckSignedByMaster("self_signing_key", parse(withUnsigned), master); err != nil {
		t.Fatalf("unsigned added: %v", err)
	}
	for name, obj := range map[string]map[string]any{"unsigned": unsignedSSK, "by another key": byOther, "tampered": tampered} {
		if err := crosssigning.CheckSignedByMaster("self_signing_key", parse(obj), master); code(err) != "M_INVALID_SIGNATURE" {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// A user signs their own devices with their self-signing key and other
// users' master keys with their user-signing key; the object signed must
// be the one stored, signatures and unsigned aside.
func TestCheckUploadSigners(t *testing.T) {
	const alice, bob = "@alice:x", "@bob:x"
	axs, bxs := testutil.NewCrossSigning(alice), testutil.NewCrossSigning(bob)
	ssk := crosssigning.ParseStored(raw(t, axs.SelfSigningKey(t)), storage.UsageSelfSigning)
	usk := crosssigning.ParseStored(raw(t, axs.UserSigningKey(t)), storage.UsageUserSigning)
	signer := crosssigning.Signer{UserID: alice, SelfSigning: ssk, UserSigning: usk}

	devKey := testutil.NewCrossSigning(alice).Master
	device := map[string]any{"user_id": alice, "device_id": "DEV", "algorithms": []string{"m.olm.v1.curve25519-aes-sha2"},
		"keys": map[string]string{"ed25519:DEV": testutil.PublicKey(devKey)}}
	storedDevice := testutil.Sign(t, device, alice, "DEV", devKey)
	devTarget := crosssigning.Target{UserID: alice, KeyID: "DEV", Stored: raw(t, storedDevice)}

	signed := testutil.SignWith(t, storedDevice, alice, axs.SelfSigning)
	sigs, err := crosssigning.CheckUpload(signer, devTarget, raw(t, signed))
	if err != nil || len(sigs) != 1 {
		t.Fatalf("own device signed by the self-signing key: %v %v", sigs, err)
	}
	want := storage.CrossSigningSignature{TargetUserID: alice, TargetKeyID: "DEV", SignerUserID: alice, SignerKeyID: ssk.KeyID(),
		Signature: crosssigning.Signature(raw(t, signed), alice, ssk.KeyID())}
	if sigs[0] != want || want.Signature == "" {
		t.Fatalf("signature %+v, want %+v", sigs[0], want)
	}
	// unsigned differs from the stored: still the same object.
	withUnsigned := testutil.SignWith(t, storedDevice, alice, axs.SelfSigning)
	withUnsigned["unsigned"] = map[string]any{"device_display_name": "phone"}
	if _, err := crosssigning.CheckUpload(signer, devTarget, raw(t, withUnsigned)); err != nil {
		t.Fatalf("with unsigned: %v", err)
	}

	changed := testutil.SignWith(t, map[string]any{"user_id": alice, "device_id": "DEV", "algorithms": []string{"other"},
		"keys": device["keys"]}, alice, axs.SelfSigning)
	byUSK := testutil.SignWith(t, storedDevice, alice, axs.UserSigning)
	forged := testutil.SignWith(t, storedDevice, alice, axs.SelfSigning)
	forged["signatures"].(map[string]any)[alice].(map[string]any)[ssk.KeyID()] = crosssigning.Signature(raw(t, byUSK), alice, usk.KeyID())
	for name, c := range map[string]struct {
		signer crosssigning.Signer
		obj    map[string]any
	}{
		"another object":        {signer, changed},
		"no self-signing sig":   {signer, byUSK},
		"a signature that lies": {signer, forged},
		"no self-signing key":   {crosssigning.Signer{UserID: alice, UserSigning: usk}, signed},
	} {
		if _, err := crosssigning.CheckUpload(c.signer, devTarget, raw(t, c.obj)); code(err) != "M_INVALID_SIGNATURE" {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := crosssigning.CheckUpload(signer, devTarget, json.RawMessage(`[1]`)); code(err) != "M_INVALID_SIGNATURE" {
		t.Errorf("not an object: %v", err)
	}

	// Bob's master key, signed by alice's user-signing key.
	bobMaster := crosssigning.ParseStored(raw(t, bxs.MasterKey()), storage.UsageMaster)
	bobTarget := crosssigning.Target{UserID: bob, KeyID: bobMaster.PublicKey, Master: true, Stored: bobMaster.Canonical}
	sigs, err = crosssigning.CheckUpload(signer, bobTarget, raw(t, testutil.SignWith(t, bxs.MasterKey(), alice, axs.UserSigning)))
	if err != nil || len(sigs) != 1 || sigs[0].SignerKeyID != usk.KeyID() || sigs[0].TargetUserID != bob || sigs[0].TargetKeyID != bobMaster.PublicKey {
		t.Fatalf("bob's master key by alice's user-signing key: %+v %v", sigs, err)
	}
	for name, c := range map[string]struct {
		signer crosssigning.Signer
		obj    map[string]any
	}{
		"by the self-signing key": {signer, testutil.SignWith(t, bxs.MasterKey(), alice, axs.SelfSigning)},
		"no user-signing key":     {crosssigning.Signer{UserID: alice, SelfSigning: ssk}, testutil.SignWith(t, bxs.MasterKey(), alice, axs.UserSigning)},
		"another master key":      {signer, testutil.SignWith(t, testutil.NewCrossSigning(bob).MasterKey(), alice, axs.UserSigning)},
	} {
		if _, err := crosssigning.CheckUpload(c.signer, bobTarget, raw(t, c.obj)); code(err) != "M_INVALID_SIGNATURE" {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// ByTarget groups the signatures a viewer may see by the key they sign,
// ordered by signer.
func TestByTarget(t *testing.T) {
	const owner, viewer, stranger = "@o:x", "@v:x", "@s:x"
	sigs := []storage.CrossSigningSignature{
		{TargetKeyID: "K", SignerUserID: viewer, SignerKeyID: "ed25519:USK", Signature: "v"},
		{TargetKeyID: "K", SignerUserID: owner, SignerKeyID: "ed25519:B", Signature: "o2"},
		{TargetKeyID: "K", SignerUserID: owner, SignerKeyID: "ed25519:A", Signature: "o1"},
		{TargetKeyID: "DEV", SignerUserID: stranger, SignerKeyID: "ed25519:USK", Signature: "s"},
	}
	order := func(list []storage.CrossSigningSignature) []string {
		var out []string
		for _, s := range list {
			out = append(out, s.Signature)
		}
		return out
	}
	got := crosssigning.ByTarget(sigs, owner, viewer)
	if len(got) != 1 || !slices.Equal(order(got["K"]), []string{"o1", "o2", "v"}) {
		t.Fatalf("the viewer's view %v", got)
	}
	if got := crosssigning.ByTarget(sigs, owner, ""); !slices.Equal(order(got["K"]), []string{"o1", "o2"}) || len(got) != 1 {
		t.Fatalf("another server's view %v", got)
	}
	if crosssigning.ByTarget(nil, owner, viewer) != nil {
		t.Fatal("no signatures grouped as some")
	}
}
