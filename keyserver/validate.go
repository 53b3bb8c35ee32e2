package keyserver

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/tidwall/gjson"

	"github.com/keyserver/keyserver/internal/canonicaljson"
	"github.com/keyserver/keyserver/internal/mxerr"
)

// DeviceKeys is the DeviceKeys object of the spec, as parsed for checking.
type DeviceKeys struct {
	UserID     string
	DeviceID   string
	Algorithms []string
	Keys       map[string]string
	// Canonical is the whole object as canonical JSON without "unsigned",
	// the form it is stored and compared in.
	Canonical []byte
}

// Ed25519 returns the device's ed25519 identity key.
func (d *DeviceKeys) Ed25519() string { return d.Keys["ed25519:"+d.DeviceID] }

// Curve25519 returns the device's curve25519 identity key.
func (d *DeviceKeys) Curve25519() string { return d.Keys["curve25519:"+d.DeviceID] }

// decodeBase64 accepts unpadded (as sent) and padded standard base64.
func decodeBase64(s string) ([]byte, error) {
	return base64.RawStdEncoding.DecodeString(strings.TrimRight(s, "="))
}

// canonical returns the canonical JSON of an object without "unsigned".
// Most objects have neither "unsigned" nor a repeated member name, and are
// made canonical as they are; the rest are decoded first, which drops
// "unsigned" and keeps the last of repeated members, as a decoder does.
func canonical(raw json.RawMessage) ([]byte, error) {
	if plainObject(raw) {
		return gomatrixserverlib.CanonicalJSON(raw)
	}
	return canonicaljson.WithoutUnsigned(raw)
}

// canonicalOfDecoded is canonical for raw that was just decoded whole, and
// so is known to be valid JSON: it skips CanonicalJSON's second check.
func canonicalOfDecoded(raw json.RawMessage) ([]byte, error) {
	if plainObject(raw) {
		return gomatrixserverlib.CanonicalJSONAssumeValid(raw), nil
	}
	return canonicaljson.WithoutUnsigned(raw)
}

// plainObject reports whether raw is an object whose top-level member names
// are all distinct and none is "unsigned". Names are compared unescaped.
func plainObject(raw []byte) bool {
	v := gjson.ParseBytes(raw)
	if !v.IsObject() {
		return false
	}
	plain := true
	var seen [8]string
	names := seen[:0]
	v.ForEach(func(k, _ gjson.Result) bool {
		name := k.String()
		if name == "unsigned" || slices.Contains(names, name) {
			plain = false
		}
		names = append(names, name)
		return plain
	})
	return plain
}

// canonicalValue returns the canonical JSON of any JSON value.
func canonicalValue(raw json.RawMessage) ([]byte, error) {
	if t := bytes.TrimSpace(raw); len(t) > 0 && t[0] == '{' {
		return canonical(raw)
	}
	return gomatrixserverlib.CanonicalJSON(raw)
}

// ParseDeviceKeys checks a DeviceKeys object as strict validation does
// (see parseDeviceKeys). It does not check the signature.
func ParseDeviceKeys(raw json.RawMessage) (*DeviceKeys, error) { return parseDeviceKeys(raw, true) }

// parseDeviceKeys checks a DeviceKeys object an uploader sent.
//
// Strict (keys.strict_validation: true, the default): every field present
// with its type (user_id and device_id strings, algorithms a list of
// non-empty strings, keys an object of strings, signatures an object of
// objects of strings), key names "<algorithm>:<device_id>", an
// ed25519:<device_id> key among them, and ed25519 and curve25519 values
// that are 32-byte base64.
//
// Lax (false, for test tools' placeholder keys): user_id and device_id
// present as strings; algorithms, keys and signatures may be missing, and
// when present have the types above; key names are "<algorithm>:<key id>"
// with any key ID; key values are any string.
func parseDeviceKeys(raw json.RawMessage, strict bool) (*DeviceKeys, error) {
	var f struct {
		UserID     *string                      `json:"user_id"`
		DeviceID   *string                      `json:"device_id"`
		Algorithms []string                     `json:"algorithms"`
		Keys       map[string]string            `json:"keys"`
		Signatures map[string]map[string]string `json:"signatures"`
	}
	if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '{' {
		return nil, mxerr.BadJSON("device_keys must be an object")
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, mxerr.BadJSON("device_keys has the wrong shape: %v", err)
	}
	switch {
	case f.UserID == nil:
		return nil, mxerr.BadJSON("device_keys.user_id is required")
	case f.DeviceID == nil:
		return nil, mxerr.BadJSON("device_keys.device_id is required")
	case strict && f.Algorithms == nil:
		return nil, mxerr.BadJSON("device_keys.algorithms is required")
	case strict && f.Keys == nil:
		return nil, mxerr.BadJSON("device_keys.keys is required")
	case strict && f.Signatures == nil:
		return nil, mxerr.BadJSON("device_keys.signatures is required")
	}
	d := &DeviceKeys{UserID: *f.UserID, DeviceID: *f.DeviceID, Algorithms: f.Algorithms, Keys: f.Keys}
	for _, a := range f.Algorithms {
		if a == "" {
			return nil, mxerr.InvalidParam("device_keys.algorithms must not contain empty names")
		}
	}
	for name, value := range f.Keys {
		alg, id, ok := strings.Cut(name, ":")
		switch {
		case strict && (!ok || alg == "" || id != d.DeviceID):
			return nil, mxerr.InvalidParam("device_keys.keys: key name %q must be <algorithm>:%s", name, d.DeviceID)
		case !ok || alg == "" || id == "":
			return nil, mxerr.InvalidParam("device_keys.keys: key name %q must be <algorithm>:<key id>", name)
		}
		if strict && (alg == "ed25519" || alg == "curve25519") {
			if b, err := decodeBase64(value); err != nil || len(b) != 32 {
				return nil, mxerr.InvalidParam("device_keys.keys: %s is not a 32-byte base64 key", name)
			}
		}
	}
	if strict && d.Ed25519() == "" {
		return nil, mxerr.InvalidParam("device_keys.keys must contain ed25519:%s", d.DeviceID)
	}
	var err error
	if d.Canonical, err = canonical(raw); err != nil {
		return nil, mxerr.BadJSON("device_keys is not valid canonical JSON: %v", err)
	}
	return d, nil
}

// storedIdentityKeys reads the ed25519 and curve25519 keys from device keys
// this server checked and stored before, without checking them again.
func storedIdentityKeys(raw []byte) (ed25519Key, curve25519Key string, err error) {
	if ed, curve, ok := walkIdentityKeys(raw); ok {
		return ed, curve, nil
	}
	var f struct {
		DeviceID string            `json:"device_id"`
		Keys     map[string]string `json:"keys"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return "", "", fmt.Errorf("stored device keys: %w", err)
	}
	return f.Keys["ed25519:"+f.DeviceID], f.Keys["curve25519:"+f.DeviceID], nil
}

// walkIdentityKeys is storedIdentityKeys in one walk of the object, for
// the canonical JSON this server stores; ok is false where a decoder might
// read it otherwise (escapes, names outside ASCII or matching a field by
// case folding only, values of other types), and the caller decodes it.
func walkIdentityKeys(raw []byte) (ed25519Key, curve25519Key string, ok bool) {
	obj := gjson.ParseBytes(raw)
	if !gjson.ValidBytes(raw) || !obj.IsObject() {
		return "", "", false
	}
	var deviceID string
	var keys gjson.Result
	ok = true
	seenID, seenKeys := false, false
	obj.ForEach(func(k, v gjson.Result) bool {
		switch {
		case !plainString(k):
			ok = false
		case k.Str == "device_id" && v.Type == gjson.String && plainString(v) && !seenID:
			deviceID, seenID = v.Str, true
		case k.Str == "keys" && v.IsObject() && !seenKeys:
			keys, seenKeys = v, true // a decoder merges repeated ones
		case strings.EqualFold(k.Str, "device_id") || strings.EqualFold(k.Str, "keys"):
			ok = false // repeated, of another type, or matched by case folding
		}
		return ok
	})
	if !ok {
		return "", "", false
	}
	keys.ForEach(func(k, v gjson.Result) bool {
		if !plainString(k) || v.Type != gjson.String || !plainString(v) {
			ok = false
			return false
		}
		switch k.Str {
		case "ed25519:" + deviceID:
			ed25519Key = v.Str
		case "curve25519:" + deviceID:
			curve25519Key = v.Str
		}
		return true
	})
	return ed25519Key, curve25519Key, ok
}

// VerifySelfSignature checks the device's signature of its own keys.
func (d *DeviceKeys) VerifySelfSignature() error {
	if err := verifySignedBy(d.Canonical, d.UserID, d.DeviceID, newIdentityKey(d.Ed25519())); err != nil {
		return mxerr.InvalidParam("device_keys: %v", err)
	}
	return nil
}

// parseKeyName splits a one-time or fallback key name "<algorithm>:<id>".
func parseKeyName(name string) (alg, id string, err error) {
	alg, id, ok := strings.Cut(name, ":")
	if !ok || alg == "" || id == "" || len(name) > 255 {
		return "", "", mxerr.InvalidParam("key name %q must be <algorithm>:<key id>", name)
	}
	return alg, id, nil
}

// checkOneTimeKey checks one one-time or fallback key and returns its
// canonical JSON. Signed algorithms ("signed_curve25519") must be objects
// with a key and a valid signature by the device; the legacy "curve25519"
// is a bare base64 string; other algorithms must be a string or an object.
func checkOneTimeKey(field, name string, raw json.RawMessage, userID, deviceID string, key *identityKey) ([]byte, error) {
	alg, _, err := parseKeyName(name)
	if err != nil {
		return nil, err
	}
	t := bytes.TrimSpace(raw)
	isObject := len(t) > 0 && t[0] == '{'
	isString := len(t) > 0 && t[0] == '"'
	switch {
	case isSignedAlgorithm(alg):
		if !isObject {
			return nil, mxerr.BadJSON("%s.%s must be an object", field, name)
		}
		value, plain, ok := signedKeyValue(raw)
		if !ok {
			// What the walk does not answer for sure, a decoder does.
			var k struct {
				Key *string `json:"key"`
			}
			if err := json.Unmarshal(raw, &k); err != nil || k.Key == nil {
				return nil, mxerr.BadJSON("%s.%s must have a string \"key\"", field, name)
			}
			value, plain = *k.Key, plainObject(raw)
		}
		if alg == "signed_curve25519" {
			if b, err := decodeBase64(value); err != nil || len(b) != 32 {
				return nil, mxerr.InvalidParam("%s.%s: key is not a 32-byte base64 key", field, name)
			}
		}
		if key.missing() {
			return nil, mxerr.InvalidParam("%s: the device has no identity keys to verify %s with; upload device_keys first", field, name)
		}
		// raw is valid JSON: the walk or the decoder checked it.
		var c []byte
		if plain {
			c = gomatrixserverlib.CanonicalJSONAssumeValid(raw)
		} else if c, err = canonicaljson.WithoutUnsigned(raw); err != nil {
			return nil, mxerr.BadJSON("%s.%s: %v", field, name, err)
		}
		if err := verifySignedBy(c, userID, deviceID, key); err != nil {
			return nil, mxerr.InvalidParam("%s.%s: %v", field, name, err)
		}
		return c, nil
	case alg == "curve25519":
		var s string
		if !isString || json.Unmarshal(raw, &s) != nil {
			return nil, mxerr.BadJSON("%s.%s must be a string", field, name)
		}
		if b, err := decodeBase64(s); err != nil || len(b) != 32 {
			return nil, mxerr.InvalidParam("%s.%s is not a 32-byte base64 key", field, name)
		}
	default:
		if !isObject && !isString {
			return nil, mxerr.BadJSON("%s.%s must be a string or an object", field, name)
		}
	}
	c, err := canonicalValue(raw)
	if err != nil {
		return nil, mxerr.BadJSON("%s.%s: %v", field, name, err)
	}
	return c, nil
}

// signedKeyValue reads the string "key" of a signed key object in one walk
// of its members, with the answer json.Unmarshal into a struct with a
// *string "key" field would give, and reports whether the object is plain
// (see plainObject). ok is false where the walk cannot be sure of that
// answer, and the caller decodes instead: raw not valid JSON, member names
// with escapes or outside ASCII (a decoder unescapes them, and matches
// names by Unicode case folding), "key" under two names matching it, or
// its value not a string free of escapes and outside ASCII. A real client's key has none of
// these.
func signedKeyValue(raw []byte) (value string, plain, ok bool) {
	if !gjson.ValidBytes(raw) {
		return "", false, false
	}
	obj := gjson.ParseBytes(raw)
	if !obj.IsObject() {
		return "", false, false
	}
	ok, plain = true, true
	found := false
	var seen [8]string
	names := seen[:0]
	obj.ForEach(func(k, v gjson.Result) bool {
		name := k.Str
		if !plainString(k) {
			ok = false
			return false
		}
		if strings.EqualFold(name, "key") {
			if found || name != "key" || v.Type != gjson.String || !plainString(v) {
				ok = false
				return false
			}
			found, value = true, v.Str
		}
		if name == "unsigned" || slices.Contains(names, name) {
			plain = false
		}
		names = append(names, name)
		return true
	})
	return value, plain, ok && found
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// checkOneTimeKeyShape checks one one-time or fallback key as
// checkOneTimeKey does, but only its shape, with neither the key value nor
// a signature checked (keys.strict_validation: false, for placeholder
// keys): a signed algorithm's key is an object with a string "key" and a
// "signatures" object of objects of strings; a "curve25519" key is a
// string; other algorithms a string or an object. It returns the key's
// canonical JSON.
func checkOneTimeKeyShape(field, name string, raw json.RawMessage) ([]byte, error) {
	alg, _, err := parseKeyName(name)
	if err != nil {
		return nil, err
	}
	t := bytes.TrimSpace(raw)
	isObject := len(t) > 0 && t[0] == '{'
	isString := len(t) > 0 && t[0] == '"'
	switch {
	case isSignedAlgorithm(alg):
		var k struct {
			Key        *string                      `json:"key"`
			Signatures map[string]map[string]string `json:"signatures"`
		}
		if !isObject || json.Unmarshal(raw, &k) != nil || k.Key == nil || k.Signatures == nil {
			return nil, mxerr.BadJSON("%s.%s must be an object with a string \"key\" and a \"signatures\" object", field, name)
		}
	case alg == "curve25519":
		if !isString {
			return nil, mxerr.BadJSON("%s.%s must be a string", field, name)
		}
	default:
		if !isObject && !isString {
			return nil, mxerr.BadJSON("%s.%s must be a string or an object", field, name)
		}
	}
	c, err := canonicalValue(raw)
	if err != nil {
		return nil, mxerr.BadJSON("%s.%s: %v", field, name, err)
	}
	return c, nil
}

// orderedObject decodes a JSON object into its members in document order:
// one-time keys are stored (and so claimed) in the order a client lists
// them. A null or absent value yields no members.
type member struct {
	Name  string
	Value json.RawMessage
}

func orderedObject(field string, raw json.RawMessage) ([]member, error) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || string(t) == "null" {
		return nil, nil
	}
	if t[0] != '{' {
		return nil, mxerr.BadJSON("%s must be an object", field)
	}
	// gjson walks the members without decoding them, several times faster
	// than json.Decoder's tokens; it does not check the syntax, so that is
	// done first (a value from a decoded request is valid already, but
	// this must not depend on the caller).
	if !gjson.ValidBytes(t) {
		return nil, mxerr.BadJSON("%s is not valid JSON", field)
	}
	var out []member
	gjson.ParseBytes(t).ForEach(func(k, v gjson.Result) bool {
		out = append(out, member{Name: k.String(), Value: json.RawMessage(v.Raw)})
		return true
	})
	return out, nil
}

// isSignedAlgorithm reports whether keys of the algorithm carry a device
// signature ("signed_curve25519").
func isSignedAlgorithm(alg string) bool { return strings.HasPrefix(alg, "signed_") }
