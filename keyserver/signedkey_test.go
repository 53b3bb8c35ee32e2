package keyserver

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/testvectors"
)

// The one-walk readings of a signed key (signedKeyValue, findSignature)
// give the answers of decoding it with encoding/json, which they stand in
// for, or leave the object to the decoder.

// decodedKeyValue is what signedKeyValue stands in for.
func decodedKeyValue(raw []byte) (value string, isString, plain bool) {
	var k struct {
		Key *string `json:"key"`
	}
	if json.Unmarshal(raw, &k) != nil || k.Key == nil {
		return "", false, false
	}
	return *k.Key, true, plainObject(raw)
}

// decodedSignature is what findSignature stands in for.
func decodedSignature(sigsJSON []byte, userID string, keyID gomatrixserverlib.KeyID) (spec.Base64Bytes, bool) {
	var sigs map[string]map[gomatrixserverlib.KeyID]spec.Base64Bytes
	if sigsJSON == nil || json.Unmarshal(sigsJSON, &sigs) != nil {
		return nil, false
	}
	sig, ok := sigs[userID][keyID]
	return sig, ok
}

func checkKeyValueAgrees(t *testing.T, raw []byte) (walked bool) {
	t.Helper()
	value, plain, ok := signedKeyValue(raw)
	if !ok {
		return false
	}
	wantValue, isString, wantPlain := decodedKeyValue(raw)
	if !isString || value != wantValue || plain != wantPlain {
		t.Errorf("%s: walk says key %q plain %v; decoder says key %q (a string: %v) plain %v",
			raw, value, plain, wantValue, isString, wantPlain)
	}
	return true
}

func checkSignatureAgrees(t *testing.T, sigsJSON []byte, userID string, keyID gomatrixserverlib.KeyID) {
	t.Helper()
	got, ok := findSignature(sigsJSON, userID, keyID)
	want, wantOK := decodedSignature(sigsJSON, userID, keyID)
	if ok != wantOK || !bytes.Equal(got, want) {
		t.Errorf("%s %s %s: found %x (%v), decoder finds %x (%v)", sigsJSON, userID, keyID, got, ok, want, wantOK)
	}
}

const sig64 = "mpJk4wv6KGZJ1x7Bz/Vd7WQK8UoLDbeL8+3CaFI2jIBMjLQ7BsQUuICpWFYxaAVLa6Kkca/wfExbWr8AUiTrCg"

func TestSignedKeyValueAgreesWithDecoder(t *testing.T) {
	key := `"zKbLg+NrIjpnagy+pIY6uPL4ZwEG2v+8F9lmgsnlZzs"`
	sigs := `{"@a:b":{"ed25519:D":"` + sig64 + `"}}`
	walkedOnes := 0
	for _, raw := range []string{
		`{"key":` + key + `,"signatures":` + sigs + `}`,
		`{"signatures":` + sigs + `,"key":` + key + `}`,
		` { "key" : ` + key + ` , "signatures" : ` + sigs + ` } `,
		`{"key":` + key + `,"signatures":` + sigs + `,"unsigned":{}}`,
		`{"key":` + key + `,"signatures":` + sigs + `,"signatures":{}}`,
		`{"key":` + key + `,"fallback":true,"signatures":` + sigs + `}`,
		`{"key":` + key + `,"key":"other"}`,
		`{"key":` + key + `,"KEY":null}`,
		`{"KEY":` + key + `}`,
		`{"Key":` + key + `}`,
		`{"\u006bey":` + key + `}`,
		`{"\u212aey":` + key + `}`,
		`{"ke\u0079":` + key + `,"key":"x"}`,
		`{"key":"zKbL\u0067+NrIjpnagy+pIY6uPL4ZwEG2v+8F9lmgsnlZzs"}`,
		`{"key":null}`,
		`{"key":5}`,
		`{"key":{}}`,
		`{"signatures":` + sigs + `}`,
		`{}`,
		`{"key":"é"}`,
		"{\"key\":\"\xff\"}",
		"{\"k\xffey\":1,\"key\":\"x\"}",
		`{"key":"x","é":1}`,
		`{"key":"x",}`,
		`{"key":"x"`,
		`["key"]`,
		`"key"`,
	} {
		if checkKeyValueAgrees(t, []byte(raw)) {
			walkedOnes++
		}
	}
	// Real clients' keys are read by the walk.
	v, err := testvectors.Load()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range v.Clients {
		for name, k := range c.OneTimeKeys {
			if alg, _, _ := parseKeyName(name); isSignedAlgorithm(alg) && !checkKeyValueAgrees(t, k) {
				t.Errorf("%s %s: a real client's key is left to the decoder", c.Library, name)
			}
		}
	}
	if walkedOnes < 5 {
		t.Errorf("only %d of the cases read by the walk", walkedOnes)
	}
}

func TestFindSignatureAgreesWithDecoder(t *testing.T) {
	const u, id = "@a:b", gomatrixserverlib.KeyID("ed25519:D")
	urlSafe := strings.NewReplacer("+", "-", "/", "_").Replace(sig64)
	for _, sigs := range []string{
		`{"@a:b":{"ed25519:D":"` + sig64 + `"}}`,
		`{"@a:b":{"ed25519:D":"` + urlSafe + `"}}`,
		`{"@a:b":{"ed25519:D":"` + sig64 + `=="}}`,
		`{"@a:b":{"ed25519:D":"` + sig64 + `","ed25519:E":"not base64!"}}`,
		`{"@c:d":{"ed25519:E":"not base64!"},"@a:b":{"ed25519:D":"` + sig64 + `"}}`,
		`{"@a:b":{"ed25519:D":"` + sig64 + `"},"@a:b":{"ed25519:E":"` + sig64 + `"}}`,
		`{"@a:b":{"ed25519:E":"` + sig64 + `"},"@a:b":{"ed25519:D":"` + sig64 + `"}}`,
		`{"@a:b":{"ed25519:D":"AAAA","ed25519:D":"` + sig64 + `"}}`,
		`{"@a:b":{"ed25519:D":"` + sig64 + `","ed25519:D":"AAAA"}}`,
		`{"@a:b":{"ed25519:D":null}}`,
		`{"@a:b":{"ed25519:D":5}}`,
		`{"@a:b":null}`,
		`{"@a:b":[]}`,
		`{"@a:b":{}}`,
		`{"@c:d":{"ed25519:E":null},"@a:b":{"ed25519:D":"` + sig64 + `"}}`,
		`{"@a:b":{"ed25519:D":"` + sig64[:10] + `\/` + sig64[12:] + `"}}`,
		`{"@a:b":{"ed25519:D":"` + sig64[:10] + `\n` + sig64[10:] + `"}}`,
		`{"@a:b":{"ed25519:\u0044":"` + sig64 + `"}}`,
		`{"@a:b":{"ed25519:D":"é` + sig64 + `"}}`,
		"{\"@a:b\":{\"ed25519:D\":\"\xff" + sig64 + "\"}}",
		`{"@\u0061:b":{"ed25519:D":"` + sig64 + `"}}`,
		`{"@é:b":{"ed25519:D":"` + sig64 + `"}}`,
		`{"@A:B":{"ed25519:D":"` + sig64 + `"}}`,
		`{}`,
		`[]`,
		`null`,
		`"x"`,
	} {
		checkSignatureAgrees(t, []byte(sigs), u, id)
	}
	checkSignatureAgrees(t, nil, u, id)
}

// FuzzSignedKeyReading holds the one-walk readings to the decoder's
// answers for any object; the seeds are real client keys.
func FuzzSignedKeyReading(f *testing.F) {
	v, err := testvectors.Load()
	if err != nil {
		f.Fatal(err)
	}
	for _, c := range v.Clients {
		for _, k := range c.OneTimeKeys {
			f.Add([]byte(k), c.UserID, "ed25519:"+c.DeviceID)
		}
	}
	f.Fuzz(func(t *testing.T, raw []byte, userID, keyID string) {
		checkKeyValueAgrees(t, raw)
		checkSignatureAgrees(t, raw, userID, gomatrixserverlib.KeyID(keyID))
		if _, sigs, err := splitSignatures(raw); err == nil && sigs != nil {
			checkSignatureAgrees(t, sigs, userID, gomatrixserverlib.KeyID(keyID))
		}
	})
}

// An upload request is read by the walk as encoding/json reads it.
func TestUploadRequestReadAsDecoded(t *testing.T) {
	type decoded UploadRequest
	walked := 0
	for _, body := range []string{
		`{"device_keys":{"a":1},"one_time_keys":{"signed_curve25519:A":{"key":"k"}},"fallback_keys":{}}`,
		` { "one_time_keys" : { "x:y" : "z" } , "other" : [1, 2] } `,
		`{"device_keys":null,"one_time_keys":null}`,
		`{"one_time_keys":{"a:b":"1"},"one_time_keys":{"a:c":"2"}}`,
		`{"One_Time_Keys":{"a:b":"1"}}`,
		`{"one_time_keys":{"a:b":"1"},"ONE_TIME_KEYS":{"a:c":"2"}}`,
		`{"one_time_key\u0073":{"a:b":"1"}}`,
		`{"dévice":1,"one_time_keys":{}}`,
		`{"fallback_keys":"a string","device_keys":5}`,
		`{}`,
		`[]`,
		`"x"`,
		`null`,
	} {
		var want decoded
		wantErr := json.Unmarshal([]byte(body), &want)
		var got UploadRequest
		err := json.Unmarshal([]byte(body), &got)
		if (err == nil) != (wantErr == nil) || string(got.DeviceKeys) != string(want.DeviceKeys) ||
			string(got.OneTimeKeys) != string(want.OneTimeKeys) || string(got.FallbackKeys) != string(want.FallbackKeys) {
			t.Errorf("%s: read %+v (%v), decoded %+v (%v)", body, got, err, want, wantErr)
		}
		if new(UploadRequest).walk([]byte(body)) {
			walked++
		}
	}
	if walked < 5 {
		t.Errorf("only %d of the bodies read by the walk", walked)
	}
}

// Stored device keys are read by the walk as they are decoded.
func TestStoredIdentityKeysReadAsDecoded(t *testing.T) {
	decodedKeys := func(raw []byte) (string, string, bool) {
		var f struct {
			DeviceID string            `json:"device_id"`
			Keys     map[string]string `json:"keys"`
		}
		if json.Unmarshal(raw, &f) != nil {
			return "", "", false
		}
		return f.Keys["ed25519:"+f.DeviceID], f.Keys["curve25519:"+f.DeviceID], true
	}
	v, err := testvectors.Load()
	if err != nil {
		t.Fatal(err)
	}
	var bodies []string
	for _, c := range v.Clients {
		dk, err := ParseDeviceKeys(c.DeviceKeys)
		if err != nil {
			t.Fatal(err)
		}
		bodies = append(bodies, string(dk.Canonical))
	}
	walked := 0
	for _, raw := range append(bodies,
		`{"device_id":"D","keys":{"ed25519:D":"e","curve25519:D":"c"}}`,
		`{"keys":{"ed25519:D":"e","curve25519:D":"c"},"device_id":"D"}`,
		`{"device_id":"D","keys":{"ed25519:D":"e"},"device_id":"E","keys":{"ed25519:E":"x"}}`,
		`{"device_id":"D","keys":{"ed25519:D":"e","ed25519:D":"f"}}`,
		`{"device_id":"D","keys":{"ed25519:D":"e"},"keys":{"curve25519:D":"c"}}`,
		`{"device_id":"D","device_id":"E","keys":{"ed25519:D":"e","ed25519:E":"f"}}`,
		`{"Device_ID":"D","keys":{"ed25519:D":"e"}}`,
		`{"device_id":"D","KEYS":{"ed25519:D":"e"}}`,
		`{"device_id":"\u0044","keys":{"ed25519:D":"e"}}`,
		`{"device_id":"D","keys":{"ed25519:\u0044":"e"}}`,
		`{"device_id":"D","keys":{"ed25519:D":5}}`,
		`{"device_id":"D","keys":{"ed25519:D":null}}`,
		`{"device_id":null,"keys":{"ed25519:":"e"}}`,
		`{"device_id":5,"keys":{}}`,
		`{"device_id":"D","keys":null}`,
		`{"device_id":"D","keys":[]}`,
		`{"device_id":"D"}`,
		`{}`,
		`[]`,
		`null`,
		`{"device_id":"D",`,
	) {
		ed, curve, err := storedIdentityKeys([]byte(raw))
		wantEd, wantCurve, wantOK := decodedKeys([]byte(raw))
		if ed != wantEd || curve != wantCurve || (err == nil) != wantOK {
			t.Errorf("%s: read %q %q (%v), decoded %q %q (%v)", raw, ed, curve, err, wantEd, wantCurve, wantOK)
		}
		if _, _, ok := walkIdentityKeys([]byte(raw)); ok {
			walked++
		}
	}
	if walked < len(bodies)+2 {
		t.Errorf("only %d of the objects read by the walk; every real client's should be", walked)
	}
}
