package keyserver

import (
	"crypto/ed25519"
	"encoding/json"
	"math/big"
	"strings"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/keyserver/keyserver/internal/testvectors"
)

// signedObject is one signature check: an object, who should have signed
// it and the key to check with.
type signedObject struct {
	name             string
	obj              []byte
	userID, deviceID string
	key              string
}

// referenceVerify is the check verifySignedBy must agree with.
func referenceVerify(c signedObject) bool {
	pub, err := decodeBase64(c.key)
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return false
	}
	return gomatrixserverlib.VerifyJSON(c.userID, gomatrixserverlib.KeyID("ed25519:"+c.deviceID), ed25519.PublicKey(pub), c.obj) == nil
}

// checkAgrees canonicalises c.obj as an upload does and compares the two
// checks; it returns verifySignedBy's answer.
func checkAgrees(t *testing.T, c signedObject) bool {
	t.Helper()
	canon, err := canonical(c.obj)
	if err != nil {
		t.Fatalf("%s: canonical: %v", c.name, err)
	}
	got := verifySignedBy(canon, c.userID, c.deviceID, newIdentityKey(c.key)) == nil
	if want := referenceVerify(signedObject{c.name, canon, c.userID, c.deviceID, c.key}); got != want {
		t.Errorf("%s: verifySignedBy says %v, VerifyJSON says %v\n%s", c.name, got, want, canon)
	}
	return got
}

// resign replaces the signature at signatures[user][ed25519:device] of obj
// with sig (base64 as given).
func resign(t *testing.T, obj []byte, user, device, sig string) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(obj, &m); err != nil {
		t.Fatal(err)
	}
	m["signatures"].(map[string]any)[user].(map[string]any)["ed25519:"+device] = sig
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// addSigner adds a signature by a second signer, after the first in
// document order, with the given value.
func addSigner(t *testing.T, obj []byte, sig any) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(obj, &m); err != nil {
		t.Fatal(err)
	}
	m["signatures"].(map[string]any)["~z:x"] = map[string]any{"ed25519:Z": sig}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func realSignedObjects(t *testing.T) []signedObject {
	v := loadRealClientKeys(t)
	var out []signedObject
	for _, c := range v.Clients {
		dk, err := ParseDeviceKeys(c.DeviceKeys)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, signedObject{c.Library + " device keys", c.DeviceKeys, c.UserID, c.DeviceID, dk.Ed25519()})
		for name, k := range c.OneTimeKeys {
			out = append(out, signedObject{c.Library + " " + name, k, c.UserID, c.DeviceID, dk.Ed25519()})
		}
		for name, k := range c.FallbackKeys {
			out = append(out, signedObject{c.Library + " fallback " + name, k, c.UserID, c.DeviceID, dk.Ed25519()})
		}
	}
	return out
}

// Every real client's signatures, and variations of each that differ in
// one way a client or an attacker could choose, get the same answer from
// verifySignedBy as from gomatrixserverlib.VerifyJSON.
func TestSignatureCheckAgreesWithVerifyJSON(t *testing.T) {
	for _, c := range realSignedObjects(t) {
		if !checkAgrees(t, c) {
			t.Fatalf("%s: a real signature was refused", c.name)
		}
		var m struct {
			Signatures map[string]map[string]string `json:"signatures"`
		}
		if err := json.Unmarshal(c.obj, &m); err != nil {
			t.Fatal(err)
		}
		sig := m.Signatures[c.userID]["ed25519:"+c.deviceID]
		raw, _ := decodeBase64(sig)
		flipped := append([]byte(nil), raw...)
		flipped[10] ^= 1
		// S + L: the same signature in a non-canonical form, which
		// crypto/ed25519 refuses.
		s := new(big.Int).SetBytes(reverse(raw[32:]))
		s.Add(s, curveOrder)
		highS := append(append([]byte(nil), raw[:32]...), reverse(s.FillBytes(make([]byte, 32)))...)
		urlSafe := strings.NewReplacer("+", "-", "/", "_").Replace(sig)
		variants := map[string][]byte{
			"bit flipped":           resign(t, c.obj, c.userID, c.deviceID, encodeB64(flipped)),
			"padded":                resign(t, c.obj, c.userID, c.deviceID, sig+strings.Repeat("=", (4-len(sig)%4)%4)),
			"url-safe alphabet":     resign(t, c.obj, c.userID, c.deviceID, urlSafe),
			"S plus group order":    resign(t, c.obj, c.userID, c.deviceID, encodeB64(highS)),
			"short":                 resign(t, c.obj, c.userID, c.deviceID, encodeB64(raw[:63])),
			"not base64":            resign(t, c.obj, c.userID, c.deviceID, "!"+sig[1:]),
			"unsigned added":        []byte(strings.Replace(string(c.obj), "{", `{"unsigned":{"device_display_name":"x"},`, 1)),
			"member added":          []byte(strings.Replace(string(c.obj), "{", `{"extra":1,`, 1)),
			"other signer invalid":  addSigner(t, c.obj, "!"),
			"other signer number":   addSigner(t, c.obj, 5),
			"signatures not object": []byte(strings.Replace(string(c.obj), `"signatures":{`, `"signatures":[{`, 1)),
		}
		for name, obj := range variants {
			if !json.Valid(obj) {
				continue // the replacement did not apply to this shape
			}
			v := c
			v.name, v.obj = c.name+" "+name, obj
			checkAgrees(t, v)
		}
		// Someone else's key, or a key that is not a point.
		v := c
		v.name, v.key = c.name+" other key", specPublicKey
		checkAgrees(t, v)
		v.name, v.key = c.name+" not a point", encodeB64(append([]byte{2}, make([]byte, 31)...))
		checkAgrees(t, v)
		v.name, v.userID = c.name+" other user", "@someone:else"
		checkAgrees(t, v)
	}
}

// Keys and signatures built from small-order points, which a device could
// choose on purpose, get crypto/ed25519's answers.
func TestSignatureCheckSmallOrderEdgeCases(t *testing.T) {
	identity := append([]byte{1}, make([]byte, 31)...) // the neutral point
	// y = p + 1: a non-canonical encoding of the neutral point.
	nonCanonical := reverse(new(big.Int).Add(fieldPrime, big.NewInt(1)).FillBytes(make([]byte, 32)))
	// A point of order 4: y = 0.
	order4 := make([]byte, 32)
	obj := `{"key":"zKbLg+NrIjpnagy+pIY6uPL4ZwEG2v+8F9lmgsnlZzs","signatures":{"@a:b":{"ed25519:D":"SIG"}}}`
	accepted := 0
	for _, pub := range [][]byte{identity, nonCanonical, order4} {
		for _, r := range [][]byte{identity, nonCanonical, order4} {
			sig := append(append([]byte(nil), r...), make([]byte, 32)...) // S = 0
			c := signedObject{"small order", []byte(strings.Replace(obj, "SIG", encodeB64(sig), 1)), "@a:b", "D", encodeB64(pub)}
			if checkAgrees(t, c) {
				accepted++
			}
		}
	}
	// With the neutral point as key and R, and S = 0, the equation holds
	// for any message: crypto/ed25519 accepts it, and so must we.
	if accepted == 0 {
		t.Error("no small-order signature accepted; the cases no longer test acceptance")
	}
}

// FuzzSignatureCheck holds verifySignedBy to VerifyJSON's answer for any
// object and key; the seeds are real client objects.
func FuzzSignatureCheck(f *testing.F) {
	v, err := testvectors.Load()
	if err != nil {
		f.Fatal(err)
	}
	for _, c := range v.Clients {
		dk, _ := ParseDeviceKeys(c.DeviceKeys)
		f.Add([]byte(c.DeviceKeys), c.UserID, c.DeviceID, dk.Ed25519())
		for _, k := range c.OneTimeKeys {
			f.Add([]byte(k), c.UserID, c.DeviceID, dk.Ed25519())
		}
	}
	f.Fuzz(func(t *testing.T, obj []byte, userID, deviceID, key string) {
		canon, err := canonical(obj)
		if err != nil {
			return
		}
		got := verifySignedBy(canon, userID, deviceID, newIdentityKey(key)) == nil
		if want := referenceVerify(signedObject{"fuzz", canon, userID, deviceID, key}); got != want {
			t.Fatalf("verifySignedBy says %v, VerifyJSON says %v for %s", got, want, canon)
		}
	})
}

var (
	curveOrder, _ = new(big.Int).SetString("7237005577332262213973186563042994240857116359379907606001950938285454250989", 10)
	fieldPrime    = new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 255), big.NewInt(19))
)

// reverse returns b reversed: ed25519 encodes numbers little-endian.
func reverse(b []byte) []byte {
	out := make([]byte, len(b))
	for i := range b {
		out[len(b)-1-i] = b[i]
	}
	return out
}

// BenchmarkOneTimeKeySignatures checks the five signatures of a typical
// upload, by one device, against VerifyJSON doing the same.
func BenchmarkOneTimeKeySignatures(b *testing.B) {
	c, dk := firstRealClient(b)
	var canon [][]byte
	for _, k := range c.OneTimeKeys {
		ck, err := canonical(k)
		if err != nil {
			b.Fatal(err)
		}
		canon = append(canon, ck)
	}
	for len(canon) < 5 {
		canon = append(canon, canon[0])
	}
	canon = canon[:5]
	b.Run("verifySignedBy", func(b *testing.B) {
		for b.Loop() {
			key := newIdentityKey(dk.Ed25519())
			for _, ck := range canon {
				if err := verifySignedBy(ck, c.UserID, c.DeviceID, key); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	b.Run("VerifyJSON", func(b *testing.B) {
		for b.Loop() {
			for _, ck := range canon {
				if !referenceVerify(signedObject{"", ck, c.UserID, c.DeviceID, dk.Ed25519()}) {
					b.Fatal("refused")
				}
			}
		}
	})
}

// BenchmarkCheckOneTimeKeys checks five signed one-time keys as an upload
// does: shape, canonical JSON and signature.
func BenchmarkCheckOneTimeKeys(b *testing.B) {
	c, dk := firstRealClient(b)
	var names []string
	var raws []json.RawMessage
	for name, k := range c.OneTimeKeys {
		names, raws = append(names, name), append(raws, k)
	}
	for len(raws) < 5 {
		names, raws = append(names, names[0]), append(raws, raws[0])
	}
	for b.Loop() {
		key := newIdentityKey(dk.Ed25519())
		for i := range 5 {
			if _, err := checkOneTimeKey("one_time_keys", names[i], raws[i], c.UserID, c.DeviceID, key); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// firstRealClient returns the first real client of the test vectors with
// its parsed device keys, for the benchmarks.
func firstRealClient(b *testing.B) (testvectors.Client, *DeviceKeys) {
	v, err := testvectors.Load()
	if err != nil {
		b.Fatal(err)
	}
	c := v.Clients[0]
	dk, err := ParseDeviceKeys(c.DeviceKeys)
	if err != nil {
		b.Fatal(err)
	}
	return c, dk
}
