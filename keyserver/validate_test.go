package keyserver

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"strings"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/keyserver/keyserver/internal/canonicaljson"
	"github.com/keyserver/keyserver/internal/streamtoken"
	"github.com/keyserver/keyserver/internal/testvectors"
)

func loadRealClientKeys(t *testing.T) testvectors.RealClientKeys {
	t.Helper()
	v, err := testvectors.Load()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestRealClientKeysAccepted(t *testing.T) {
	v := loadRealClientKeys(t)
	for _, c := range v.Clients {
		t.Run(c.UserID, func(t *testing.T) {
			dk, err := ParseDeviceKeys(c.DeviceKeys)
			if err != nil {
				t.Fatalf("%s device keys rejected: %v", c.Library, err)
			}
			if err := dk.VerifySelfSignature(); err != nil {
				t.Fatalf("%s device keys signature rejected: %v", c.Library, err)
			}
			if dk.UserID != c.UserID || dk.DeviceID != c.DeviceID {
				t.Fatalf("parsed %s %s", dk.UserID, dk.DeviceID)
			}
			n := 0
			for name, k := range c.OneTimeKeys {
				if _, err := checkOneTimeKey("one_time_keys", name, k, c.UserID, c.DeviceID, newIdentityKey(dk.Ed25519())); err != nil {
					t.Errorf("%s one-time key %s rejected: %v", c.Library, name, err)
				}
				n++
			}
			for name, k := range c.FallbackKeys {
				if _, err := checkOneTimeKey("fallback_keys", name, k, c.UserID, c.DeviceID, newIdentityKey(dk.Ed25519())); err != nil {
					t.Errorf("%s fallback key %s rejected: %v", c.Library, name, err)
				}
			}
			if n != 3 {
				t.Fatalf("expected 3 one-time keys, have %d", n)
			}
		})
	}
}

func TestRealClientKeysNegativeRejected(t *testing.T) {
	v := loadRealClientKeys(t)
	for _, n := range v.Negative {
		t.Run(n.Name, func(t *testing.T) {
			switch n.Kind {
			case "device_keys":
				dk, err := ParseDeviceKeys(n.Object)
				if err != nil {
					t.Fatalf("shape rejected, expected only the signature to fail: %v", err)
				}
				if err := dk.VerifySelfSignature(); err == nil {
					t.Fatal("altered device keys accepted")
				}
			case "one_time_key":
				if _, err := checkOneTimeKey("one_time_keys", n.KeyID, n.Object, n.UserID, n.DeviceID, newIdentityKey(n.VerifyWith.Ed25519)); err == nil {
					t.Fatal("unsigned one-time key accepted")
				}
			default:
				t.Fatalf("unknown kind %q", n.Kind)
			}
		})
	}
}

// The spec's signing test vectors (seed, public key, signatures).
const (
	specSeed      = "YJDBA9Xnr2sVqXD9Vj7XVUnmFZcZrlw8Md7kMW+3XA1"
	specPublicKey = "XGX0JRS2Af3be3knz2fBiRbApjm2Dh61gXDJA8kcJNI"
)

func TestSpecSigningVectors(t *testing.T) {
	seed, err := decodeBase64(specSeed)
	if err != nil {
		t.Fatal(err)
	}
	priv := ed25519.NewKeyFromSeed(seed)
	if got := encodeB64(priv.Public().(ed25519.PublicKey)); got != specPublicKey {
		t.Fatalf("public key %s", got)
	}
	for _, tc := range []struct{ obj, sig string }{
		{`{}`, "K8280/U9SSy9IVtjBuVeLr+HpOB4BQFWbg+UZaADMtTdGYI7Geitb76LTrr5QV/7Xg4ahLwYGYZzuHGZKM5ZAQ"},
		{`{"one":1,"two":"Two"}`, "KqmLSbO39/Bzb0QIYE82zqLwsA+PDzYIpIRA2sRQ4sL53+sN6/fpNSoqE7BP7vBZhG6kYdD13EIMJpvhJI+6Bw"},
	} {
		signed, err := gomatrixserverlib.SignJSON("domain", "ed25519:1", priv, []byte(tc.obj))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(signed), tc.sig) {
			t.Errorf("signature of %s: %s", tc.obj, signed)
		}
	}

	deviceKeys := `{"algorithms":["m.olm.v1.curve25519-aes-sha2","m.megolm.v1.aes-sha2"],"device_id":"JLAFKJWSCS",
		"keys":{"curve25519:JLAFKJWSCS":"3C5BFWi2Y8MaVvjM8M22DBmh24PmgR0nPvJOIArzgyI","ed25519:JLAFKJWSCS":"XGX0JRS2Af3be3knz2fBiRbApjm2Dh61gXDJA8kcJNI"},
		"user_id":"@alice:domain",
		"signatures":{"@alice:domain":{"ed25519:JLAFKJWSCS":"zoM75Vf9rUlcqTNrFz1BP+1bEf/+jgjTakWx64iUKmUueuBqky0mTZNsWZDozgXC9jlJcMmLdPl2nfxcyjeiCQ"}}}`
	dk, err := ParseDeviceKeys(json.RawMessage(deviceKeys))
	if err != nil {
		t.Fatal(err)
	}
	if err := dk.VerifySelfSignature(); err != nil {
		t.Fatalf("spec device keys: %v", err)
	}
	wantCanonical := `{"algorithms":["m.olm.v1.curve25519-aes-sha2","m.megolm.v1.aes-sha2"],"device_id":"JLAFKJWSCS","keys":{"curve25519:JLAFKJWSCS":"3C5BFWi2Y8MaVvjM8M22DBmh24PmgR0nPvJOIArzgyI","ed25519:JLAFKJWSCS":"XGX0JRS2Af3be3knz2fBiRbApjm2Dh61gXDJA8kcJNI"},"signatures":{"@alice:domain":{"ed25519:JLAFKJWSCS":"zoM75Vf9rUlcqTNrFz1BP+1bEf/+jgjTakWx64iUKmUueuBqky0mTZNsWZDozgXC9jlJcMmLdPl2nfxcyjeiCQ"}},"user_id":"@alice:domain"}`
	if string(dk.Canonical) != wantCanonical {
		t.Errorf("canonical form:\n%s\nwant\n%s", dk.Canonical, wantCanonical)
	}
	otk := `{"key":"zKbLg+NrIjpnagy+pIY6uPL4ZwEG2v+8F9lmgsnlZzs","signatures":{"@alice:domain":{"ed25519:JLAFKJWSCS":"zccrYaM3ieFwqIRh3pve0FOXL66pwljCLMbLXyXMtKdjYyuknQicpCFDQBGS7gtaKk7idfLWboyRqxzDSqZ4BQ"}}}`
	if _, err := checkOneTimeKey("one_time_keys", "signed_curve25519:AAAAHg", json.RawMessage(otk), "@alice:domain", "JLAFKJWSCS", newIdentityKey(specPublicKey)); err != nil {
		t.Errorf("spec one-time key: %v", err)
	}
	fallback := `{"fallback":true,"key":"zKbLg+NrIjpnagy+pIY6uPL4ZwEG2v+8F9lmgsnlZzs","signatures":{"@alice:domain":{"ed25519:JLAFKJWSCS":"X2T38NQ0yRSsppA2IriBDzq83NGLUzj5QEFpLJQkK9+5w1cGlkYfeg9tT9A1K3ZWtCEp5v+qfOdZgnA7GSGnCw"}}}`
	if _, err := checkOneTimeKey("fallback_keys", "signed_curve25519:AAAAHg", json.RawMessage(fallback), "@alice:domain", "JLAFKJWSCS", newIdentityKey(specPublicKey)); err != nil {
		t.Errorf("spec fallback key: %v", err)
	}
	// The one-time key's signature does not cover "fallback": true.
	if _, err := checkOneTimeKey("fallback_keys", "signed_curve25519:AAAAHg",
		json.RawMessage(strings.Replace(otk, `{"key"`, `{"fallback":true,"key"`, 1)), "@alice:domain", "JLAFKJWSCS", newIdentityKey(specPublicKey)); err == nil {
		t.Error("a signature over other content was accepted")
	}
}

func TestParseDeviceKeysShape(t *testing.T) {
	valid := map[string]any{
		"user_id": "@a:x", "device_id": "D", "algorithms": []string{"m.olm.v1.curve25519-aes-sha2"},
		"keys":       map[string]string{"ed25519:D": specPublicKey, "curve25519:D": specPublicKey},
		"signatures": map[string]any{},
	}
	mutate := func(f func(m map[string]any)) json.RawMessage {
		m := map[string]any{}
		for k, v := range valid {
			m[k] = v
		}
		f(m)
		b, _ := json.Marshal(m)
		return b
	}
	for _, tc := range []struct {
		name    string
		raw     json.RawMessage
		errcode string
	}{
		{"valid", mutate(func(map[string]any) {}), ""},
		{"not an object", json.RawMessage(`[1]`), "M_BAD_JSON"},
		{"no user_id", mutate(func(m map[string]any) { delete(m, "user_id") }), "M_BAD_JSON"},
		{"no device_id", mutate(func(m map[string]any) { delete(m, "device_id") }), "M_BAD_JSON"},
		{"no algorithms", mutate(func(m map[string]any) { delete(m, "algorithms") }), "M_BAD_JSON"},
		{"no keys", mutate(func(m map[string]any) { delete(m, "keys") }), "M_BAD_JSON"},
		{"no signatures", mutate(func(m map[string]any) { delete(m, "signatures") }), "M_BAD_JSON"},
		{"user_id not a string", mutate(func(m map[string]any) { m["user_id"] = 5 }), "M_BAD_JSON"},
		{"algorithms not strings", mutate(func(m map[string]any) { m["algorithms"] = []int{1} }), "M_BAD_JSON"},
		{"key not a string", mutate(func(m map[string]any) { m["keys"] = map[string]any{"ed25519:D": 1} }), "M_BAD_JSON"},
		{"no ed25519 key", mutate(func(m map[string]any) { m["keys"] = map[string]string{"curve25519:D": specPublicKey} }), "M_INVALID_PARAM"},
		{"key of another device", mutate(func(m map[string]any) {
			m["keys"] = map[string]string{"ed25519:D": specPublicKey, "curve25519:E": specPublicKey}
		}), "M_INVALID_PARAM"},
		{"short ed25519 key", mutate(func(m map[string]any) { m["keys"] = map[string]string{"ed25519:D": "AAAA"} }), "M_INVALID_PARAM"},
		{"ed25519 key not base64", mutate(func(m map[string]any) { m["keys"] = map[string]string{"ed25519:D": strings.Repeat("!", 43)} }), "M_INVALID_PARAM"},
		{"empty algorithm", mutate(func(m map[string]any) { m["algorithms"] = []string{""} }), "M_INVALID_PARAM"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseDeviceKeys(tc.raw)
			if got := errcodeOf(err); got != tc.errcode {
				t.Fatalf("errcode %q, want %q (%v)", got, tc.errcode, err)
			}
		})
	}
}

func TestCheckOneTimeKeyShapes(t *testing.T) {
	for _, tc := range []struct {
		name, keyName, raw, errcode string
	}{
		{"no algorithm", ":AAAA", `"x"`, "M_INVALID_PARAM"},
		{"no key id", "signed_curve25519:", `{}`, "M_INVALID_PARAM"},
		{"no colon", "signed_curve25519", `{}`, "M_INVALID_PARAM"},
		{"signed key as string", "signed_curve25519:A", `"` + specPublicKey + `"`, "M_BAD_JSON"},
		{"signed key without key", "signed_curve25519:A", `{"signatures":{}}`, "M_BAD_JSON"},
		{"signed key short", "signed_curve25519:A", `{"key":"AAAA","signatures":{}}`, "M_INVALID_PARAM"},
		{"unsigned", "signed_curve25519:A", `{"key":"` + specPublicKey + `"}`, "M_INVALID_PARAM"},
		{"legacy curve25519", "curve25519:A", `"` + specPublicKey + `"`, ""},
		{"legacy curve25519 as object", "curve25519:A", `{"key":"x"}`, "M_BAD_JSON"},
		{"legacy curve25519 short", "curve25519:A", `"AAAA"`, "M_INVALID_PARAM"},
		{"unknown algorithm object", "org.example.alg:A", `{"anything":1}`, ""},
		{"unknown algorithm number", "org.example.alg:A", `5`, "M_BAD_JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := checkOneTimeKey("one_time_keys", tc.keyName, json.RawMessage(tc.raw), "@alice:domain", "JLAFKJWSCS", newIdentityKey(specPublicKey))
			if got := errcodeOf(err); got != tc.errcode {
				t.Fatalf("errcode %q, want %q (%v)", got, tc.errcode, err)
			}
		})
	}
}

func TestStreamTokens(t *testing.T) {
	for _, tc := range []struct {
		tok string
		pos int64
		ok  bool
	}{
		{"s0", 0, true}, {"s42", 42, true}, {"s42_7", 42, true},
		{"", 0, false}, {"42", 0, false}, {"s", 0, false}, {"s-1", 0, false}, {"sx", 0, false}, {"s1.5", 0, false},
	} {
		pos, err := streamtoken.Parse("from", tc.tok)
		if (err == nil) != tc.ok || (tc.ok && int64(pos) != tc.pos) {
			t.Errorf("%q: %d %v", tc.tok, pos, err)
		}
	}
	if streamtoken.Format(17) != "s17" {
		t.Error(streamtoken.Format(17))
	}
}

// canonical takes a fast path for objects without "unsigned" or repeated
// names; it must give exactly what decoding and re-encoding gives.
func TestCanonicalFastPathMatchesDecoded(t *testing.T) {
	inputs := []string{
		`{"key":"<&>","signatures":{"@a:b":{"ed25519:X":"s"}}}`,
		`{ "b" : 1 , "a" : "\u00e9\u2028\ud83d\ude00\n\"\\\/" , "c": [ 1, {"z":null,"y":true} ] }`,
		`{"a":-0,"b":12345,"c":"\u001f\u007f"}`,
		`{"é":1,"e":2,"\u00e9x":3}`,
		`{}`,
	}
	v := loadRealClientKeys(t)
	for _, c := range v.Clients {
		inputs = append(inputs, string(c.DeviceKeys))
		for _, k := range c.OneTimeKeys {
			inputs = append(inputs, string(k))
		}
		for _, k := range c.FallbackKeys {
			inputs = append(inputs, string(k))
		}
	}
	for _, in := range inputs {
		if !plainObject([]byte(in)) {
			t.Fatalf("plainObject(%s) = false", in)
		}
		fast, err1 := canonical([]byte(in))
		slow, err2 := canonicaljson.WithoutUnsigned([]byte(in))
		if err1 != nil || err2 != nil || !bytes.Equal(fast, slow) {
			t.Errorf("canonical(%s):\n fast %s (%v)\n slow %s (%v)", in, fast, err1, slow, err2)
		}
	}
	// Objects the fast path must leave to decoding.
	for in, want := range map[string]string{
		`{"key":"k","unsigned":{"x":1}}`:          `{"key":"k"}`,
		`{"key":"k","unsi\u0067ned":{"x":1}}`:     `{"key":"k"}`,
		`{"key":"first","key":"last"}`:            `{"key":"last"}`,
		`{"k\u0065y":"first","key":"last","a":1}`: `{"a":1,"key":"last"}`,
	} {
		if plainObject([]byte(in)) {
			t.Errorf("plainObject(%s) = true", in)
		}
		if got, err := canonical([]byte(in)); err != nil || string(got) != want {
			t.Errorf("canonical(%s) = %s, %v; want %s", in, got, err, want)
		}
	}
}

// In lax mode a key is stored in the same canonical form as in strict
// mode, so that an identical upload is recognised whichever mode stored it.
func TestCheckOneTimeKeyShapeSameCanonicalForm(t *testing.T) {
	v := loadRealClientKeys(t)
	for _, c := range v.Clients {
		dk, err := ParseDeviceKeys(c.DeviceKeys)
		if err != nil {
			t.Fatal(err)
		}
		lax, err := parseDeviceKeys(c.DeviceKeys, false)
		if err != nil || !bytes.Equal(lax.Canonical, dk.Canonical) {
			t.Fatalf("%s device keys: lax %v %s, strict %s", c.UserID, err, lax.Canonical, dk.Canonical)
		}
		for field, keys := range map[string]map[string]json.RawMessage{"one_time_keys": c.OneTimeKeys, "fallback_keys": c.FallbackKeys} {
			for name, k := range keys {
				strict, err := checkOneTimeKey(field, name, k, c.UserID, c.DeviceID, newIdentityKey(dk.Ed25519()))
				if err != nil {
					t.Fatal(err)
				}
				shape, err := checkOneTimeKeyShape(field, name, k)
				if err != nil || !bytes.Equal(shape, strict) {
					t.Fatalf("%s %s: lax %v %s, strict %s", c.UserID, name, err, shape, strict)
				}
			}
		}
	}
}
