// Package crosssigning holds the rules of cross-signing: what a
// cross-signing key object must look like, which signatures prove what,
// which uploaded signatures are allowed, and who may see which signature.
// It knows nothing of HTTP or of the database: package keyserver reads
// the stored keys, asks these rules, and writes what they allow.
package crosssigning

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"sort"
	"strings"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/tidwall/gjson"

	"github.com/keyserver/keyserver/internal/canonicaljson"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// Errcodes of per-key failures of a signature upload that mxerr has no
// constructor for.
const codeInvalidSignature = "M_INVALID_SIGNATURE"

// InvalidSignature is the 400 error for a signature that does not verify.
func InvalidSignature(format string, a ...any) *mxerr.Error {
	return mxerr.New(400, codeInvalidSignature, format, a...)
}

// Key is a checked cross-signing key.
type Key struct {
	UserID string
	Usage  string // storage.UsageMaster...
	// PublicKey is the ed25519 public key as unpadded base64, which is
	// also the key's ID.
	PublicKey string
	// Canonical is the object as canonical JSON without "unsigned", the
	// form it is stored and compared in.
	Canonical []byte
}

// KeyID is the key's name in "keys" and "signatures".
func (k *Key) KeyID() string { return "ed25519:" + k.PublicKey }

// Parse checks a cross-signing key sent in the slot of usage (named field
// in errors) for userID: the caller's user ID, exactly that usage, and
// exactly one ed25519 key named after itself.
func Parse(field string, raw json.RawMessage, usage, userID string) (*Key, error) {
	var obj struct {
		UserID *string           `json:"user_id"`
		Usage  []string          `json:"usage"`
		Keys   map[string]string `json:"keys"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil || !gjson.ParseBytes(raw).IsObject() {
		return nil, mxerr.InvalidParam("%s is not a cross-signing key object", field)
	}
	if obj.UserID == nil {
		return nil, mxerr.MissingParam("%s.user_id is required", field)
	}
	if *obj.UserID != userID {
		return nil, mxerr.InvalidParam("%s.user_id %q is not the caller %q", field, *obj.UserID, userID)
	}
	if len(obj.Usage) != 1 || obj.Usage[0] != usage {
		return nil, mxerr.InvalidParam("%s.usage must be [%q]", field, usage)
	}
	if len(obj.Keys) != 1 {
		return nil, mxerr.InvalidParam("%s.keys must hold exactly one key, it holds %d", field, len(obj.Keys))
	}
	var name, value string
	for name, value = range obj.Keys {
	}
	pub, ok := strings.CutPrefix(name, "ed25519:")
	if !ok || pub != value {
		return nil, mxerr.InvalidParam("%s.keys must name its ed25519 key \"ed25519:<public key>\"", field)
	}
	if b, err := base64.RawStdEncoding.DecodeString(pub); err != nil || len(b) != ed25519.PublicKeySize {
		return nil, mxerr.InvalidParam("%s: %q is not an ed25519 public key in unpadded base64", field, pub)
	}
	canon, err := canonicaljson.WithoutUnsigned(raw)
	if err != nil {
		return nil, mxerr.InvalidParam("%s is not valid JSON", field)
	}
	return &Key{UserID: userID, Usage: usage, PublicKey: pub, Canonical: canon}, nil
}

// ParseStored reads a key this server stored (so already checked).
func ParseStored(js []byte, usage string) *Key {
	if js == nil {
		return nil
	}
	return &Key{UserID: gjson.GetBytes(js, "user_id").Str, Usage: usage, PublicKey: PublicKeyOf(js), Canonical: js}
}

// PublicKeyOf returns the public key of a stored cross-signing key object.
func PublicKeyOf(js []byte) string {
	var pub string
	gjson.GetBytes(js, "keys").ForEach(func(k, v gjson.Result) bool {
		pub = v.Str
		return false
	})
	return pub
}

// Unsigned returns the canonical JSON of an object without "signatures"
// and "unsigned": what its signatures cover, and what must be equal for a
// signature uploaded on its own to be about the stored object.
func Unsigned(raw []byte) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, err
	}
	delete(obj, "signatures")
	delete(obj, "unsigned")
	js, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	return gomatrixserverlib.CanonicalJSON(js)
}

// Signature returns signatures[userID][keyID] of an object, "" when absent.
func Signature(obj []byte, userID, keyID string) string {
	return signaturesOf(obj, userID)[keyID]
}

// signaturesOf returns signatures[userID] of an object.
func signaturesOf(obj []byte, userID string) map[string]string {
	var sigs map[string]map[string]string
	if json.Unmarshal([]byte(gjson.GetBytes(obj, "signatures").Raw), &sigs) != nil {
		return nil
	}
	return sigs[userID]
}

// SignedBy reports whether obj carries a valid signature by userID's
// ed25519 key pub (unpadded base64) named keyID ("ed25519:<id>"), by the
// rules of gomatrixserverlib.VerifyJSON.
func SignedBy(obj []byte, userID, keyID, pub string) bool {
	key, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(pub, "="))
	if err != nil || len(key) != ed25519.PublicKeySize {
		return false
	}
	return gomatrixserverlib.VerifyJSON(userID, gomatrixserverlib.KeyID(keyID), ed25519.PublicKey(key), obj) == nil
}

// CheckSignedByMaster checks that a self-signing or user-signing key
// carries a valid signature by the master key.
func CheckSignedByMaster(field string, k, master *Key) error {
	if !SignedBy(k.Canonical, master.UserID, master.KeyID(), master.PublicKey) {
		return InvalidSignature("%s has no valid signature by the master key %s", field, master.PublicKey)
	}
	return nil
}

// Visible reports whether a signature on owner's keys may be shown to
// viewer ("" for another server): those the owner made, and the viewer's
// own. A signature by a third user's user-signing key is theirs alone.
func Visible(sig storage.CrossSigningSignature, owner, viewer string) bool {
	return sig.SignerUserID == owner || (viewer != "" && sig.SignerUserID == viewer)
}

// WithSignatures returns the canonical object js with sigs added to its
// "signatures"; js itself when sigs is empty.
func WithSignatures(js []byte, sigs []storage.CrossSigningSignature) ([]byte, error) {
	if len(sigs) == 0 {
		return js, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(js, &obj); err != nil {
		return nil, err
	}
	all := map[string]map[string]string{}
	if raw, ok := obj["signatures"]; ok {
		if err := json.Unmarshal(raw, &all); err != nil {
			return nil, err
		}
	}
	for _, s := range sigs {
		if all[s.SignerUserID] == nil {
			all[s.SignerUserID] = map[string]string{}
		}
		all[s.SignerUserID][s.SignerKeyID] = s.Signature
	}
	raw, err := json.Marshal(all)
	if err != nil {
		return nil, err
	}
	obj["signatures"] = raw
	out, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	return gomatrixserverlib.CanonicalJSONAssumeValid(out), nil
}

// ByTarget groups signatures by the key they sign, keeping those viewer
// may see, in a fixed order.
func ByTarget(sigs []storage.CrossSigningSignature, owner, viewer string) map[string][]storage.CrossSigningSignature {
	if len(sigs) == 0 {
		return nil
	}
	out := map[string][]storage.CrossSigningSignature{}
	for _, s := range sigs {
		if Visible(s, owner, viewer) {
			out[s.TargetKeyID] = append(out[s.TargetKeyID], s)
		}
	}
	for _, list := range out {
		sort.Slice(list, func(i, j int) bool {
			if list[i].SignerUserID != list[j].SignerUserID {
				return list[i].SignerUserID < list[j].SignerUserID
			}
			return list[i].SignerKeyID < list[j].SignerKeyID
		})
	}
	return out
}
