package keyserver

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
	voi "github.com/oasisprotocol/curve25519-voi/primitives/ed25519"
	"github.com/tidwall/gjson"
)

// Device and one-time key signatures are the daemon's largest cost on an
// upload: five one-time keys are five signature checks by the same device
// key. They are checked here by the rules of gomatrixserverlib.VerifyJSON
// (signature_test.go holds the two to the same answers), with two savings:
// the object is already canonical, so the signed bytes are cut out of it
// rather than decoded and encoded again; and the device key is decoded and
// expanded once per request, by curve25519-voi, whose verification is
// faster than crypto/ed25519's with the same (cofactorless) semantics.
// Server keys and X-Matrix requests still go through gomatrixserverlib.

// stdlibSemantics makes curve25519-voi accept exactly the signatures
// crypto/ed25519 (and so VerifyJSON) accepts.
var stdlibSemantics = &voi.Options{Verify: voi.VerifyOptionsStdLib}

// identityKey is a device's ed25519 identity key as uploaded (unpadded
// base64), decoded and expanded on its first use so that all the
// signatures of one request by that device share the work. It is not safe
// for concurrent use; make one per request.
type identityKey struct {
	b64      string
	expanded *voi.ExpandedPublicKey
	err      error
}

func newIdentityKey(b64 string) *identityKey { return &identityKey{b64: b64} }

// missing reports whether the device has no ed25519 key at all.
func (k *identityKey) missing() bool { return k == nil || k.b64 == "" }

func (k *identityKey) expand() (*voi.ExpandedPublicKey, error) {
	if k.expanded != nil || k.err != nil {
		return k.expanded, k.err
	}
	pub, err := decodeBase64(k.b64)
	if err == nil && len(pub) != voi.PublicKeySize {
		err = errors.New("wrong length")
	}
	if err == nil {
		k.expanded, err = voi.NewExpandedPublicKey(voi.PublicKey(pub))
	}
	if err != nil {
		// crypto/ed25519 refuses a key that is not a point as it refuses
		// every signature by it, so VerifyJSON's answer is the same.
		k.err = errors.New("the device's ed25519 key is not valid")
	}
	return k.expanded, k.err
}

// verifySignedBy checks signatures[userID]["ed25519:<deviceID>"] over
// canon, which must be canonical JSON of an object (as canonical returns
// it), with the device's key.
func verifySignedBy(canon []byte, userID, deviceID string, key *identityKey) error {
	if key.missing() {
		return errors.New("the device has no ed25519 key")
	}
	pub, err := key.expand()
	if err != nil {
		return err
	}
	keyID := gomatrixserverlib.KeyID("ed25519:" + deviceID)
	signed, sigsJSON, err := splitSignatures(canon)
	if err != nil {
		return err
	}
	sig, ok := findSignature(sigsJSON, userID, keyID)
	if !ok || len(sig) != voi.SignatureSize ||
		!voi.VerifyExpandedWithOptions(pub, signed, sig, stdlibSemantics) {
		return fmt.Errorf("no valid signature by %s %s", userID, keyID)
	}
	return nil
}

// splitSignatures returns the bytes a signature of a canonical object
// covers (the object without "signatures" and "unsigned") and the raw
// "signatures" member, nil when absent. The members left are still sorted
// and compact, so they are canonical as they stand.
func splitSignatures(canon []byte) (signed, signatures []byte, err error) {
	obj := gjson.ParseBytes(canon)
	if !obj.IsObject() {
		return nil, nil, errors.New("not a JSON object")
	}
	signed = make([]byte, 0, len(canon))
	signed = append(signed, '{')
	obj.ForEach(func(name, value gjson.Result) bool {
		switch name.Str {
		case "signatures":
			signatures = []byte(value.Raw)
		case "unsigned":
		default:
			if len(signed) > 1 {
				signed = append(signed, ',')
			}
			signed = append(signed, name.Raw...)
			signed = append(signed, ':')
			signed = append(signed, value.Raw...)
		}
		return true
	})
	return append(signed, '}'), signatures, nil
}

// findSignature returns signatures[userID][keyID] from the raw
// "signatures" member (nil: absent), decoded as VerifyJSON decodes it:
// every signature in the object must be base64, not only the one looked
// for, or there is none. It walks the object once; should it meet what
// only a decoder answers for sure (escapes, names outside ASCII, values
// other than strings), it decodes the whole.
func findSignature(sigsJSON []byte, userID string, keyID gomatrixserverlib.KeyID) (spec.Base64Bytes, bool) {
	if sigsJSON == nil {
		return nil, false
	}
	var (
		found     spec.Base64Bytes
		ok, plain = false, true
		bad       = false
	)
	walked := gjson.ParseBytes(sigsJSON)
	if !walked.IsObject() {
		plain = false
	}
	walked.ForEach(func(user, keys gjson.Result) bool {
		if !plainString(user) || !keys.IsObject() {
			plain = false
			return false
		}
		if user.Str == userID {
			// A repeated user replaces the keys before, as in a decoder.
			found, ok = nil, false
		}
		keys.ForEach(func(id, value gjson.Result) bool {
			if !plainString(id) || value.Type != gjson.String || !plainString(value) {
				plain = false
				return false
			}
			var sig spec.Base64Bytes
			if sig.Decode(value.Str) != nil {
				bad = true
				return false
			}
			if user.Str == userID && id.Str == string(keyID) {
				found, ok = sig, true // the last of repeated IDs, as in a decoder
			}
			return true
		})
		return plain && !bad
	})
	if !plain {
		var sigs map[string]map[gomatrixserverlib.KeyID]spec.Base64Bytes
		if json.Unmarshal(sigsJSON, &sigs) != nil {
			return nil, false
		}
		found, ok = sigs[userID][keyID]
		return found, ok
	}
	if bad {
		return nil, false
	}
	return found, ok
}

// plainString reports whether a JSON string (a value or a member name) is
// free of escapes and ASCII, so that its raw text is what a decoder reads.
func plainString(r gjson.Result) bool {
	return len(r.Raw) == len(r.Str)+2 && r.Raw[0] == '"' && isASCII(r.Str)
}
