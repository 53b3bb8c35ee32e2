package crosssigning

import (
	"bytes"
	"sort"
	"strings"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// Signer is what the checks of a signature upload need of the uploader.
type Signer struct {
	UserID string
	// The uploader's self-signing and user-signing keys; nil when none.
	SelfSigning, UserSigning *Key
	// DeviceKeys maps each of the uploader's devices with keys to its
	// ed25519 key.
	DeviceKeys map[string]string
}

// Target is the stored object an uploaded one stands for.
type Target struct {
	UserID string
	KeyID  string // the device ID, or the master key's public key
	Master bool   // a master key; otherwise a device's keys
	Stored []byte // as stored, canonical
}

// CheckUpload checks an object of a signature upload against the stored
// one it stands for, and returns the signatures to store. Allowed are the
// uploader's own devices signed by their self-signing key, their own master
// key signed by their devices, and another user's master key signed by
// their user-signing key; every signature is verified. The error is the
// object's failure (M_INVALID_SIGNATURE, or M_UNKNOWN for a combination
// that is not allowed).
func CheckUpload(s Signer, t Target, uploaded []byte) ([]storage.CrossSigningSignature, error) {
	own := t.UserID == s.UserID
	if !own && !t.Master {
		return nil, mxerr.Unknown("only your own devices can be signed; other users are signed through their master key")
	}
	up, err := Unsigned(uploaded)
	if err != nil {
		return nil, InvalidSignature("the signed object is not a JSON object")
	}
	stored, err := Unsigned(t.Stored)
	if err != nil {
		return nil, err
	}
	if !bytes.Equal(up, stored) {
		return nil, InvalidSignature("the signed object differs from the stored key %s", t.KeyID)
	}
	one := func(k *Key, what string) ([]storage.CrossSigningSignature, error) {
		if k == nil {
			return nil, InvalidSignature("you have no %s key to sign with", what)
		}
		sig := Signature(uploaded, s.UserID, k.KeyID())
		if sig == "" {
			return nil, InvalidSignature("no signature by your %s key %s", what, k.PublicKey)
		}
		if !SignedBy(uploaded, s.UserID, k.KeyID(), k.PublicKey) {
			return nil, InvalidSignature("the signature by your %s key %s does not verify", what, k.PublicKey)
		}
		return []storage.CrossSigningSignature{{TargetUserID: t.UserID, TargetKeyID: t.KeyID,
			SignerUserID: s.UserID, SignerKeyID: k.KeyID(), Signature: sig}}, nil
	}
	switch {
	case own && !t.Master:
		return one(s.SelfSigning, "self-signing")
	case !own:
		return one(s.UserSigning, "user-signing")
	}
	// The uploader's own master key, signed by their devices.
	var out []storage.CrossSigningSignature
	sigs := signaturesOf(uploaded, s.UserID)
	keyIDs := make([]string, 0, len(sigs))
	for keyID := range sigs {
		keyIDs = append(keyIDs, keyID)
	}
	sort.Strings(keyIDs)
	for _, keyID := range keyIDs {
		sig := sigs[keyID]
		device, ok := strings.CutPrefix(keyID, "ed25519:")
		pub := s.DeviceKeys[device]
		if !ok || pub == "" {
			continue // the master key's own signature, or no device of ours
		}
		if !SignedBy(uploaded, s.UserID, keyID, pub) {
			return nil, InvalidSignature("the signature by your device %s does not verify", device)
		}
		out = append(out, storage.CrossSigningSignature{TargetUserID: t.UserID, TargetKeyID: t.KeyID,
			SignerUserID: s.UserID, SignerKeyID: keyID, Signature: sig})
	}
	if len(out) == 0 {
		return nil, InvalidSignature("no signature by one of your devices on your master key")
	}
	return out, nil
}
