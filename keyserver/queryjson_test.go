package keyserver

import (
	"encoding/json"
	"fmt"
	"testing"
)

// The hand-written encoding of a query answer means the same as json.Marshal's.
func TestQueryResponseAppendJSON(t *testing.T) {
	r := QueryResponse{
		DeviceKeys: map[string]map[string]json.RawMessage{
			"@a:x":    {"D1": json.RawMessage(`{"device_id":"D1","keys":{"ed25519:D1":"é\"<>"}}`), "D2": json.RawMessage(`{}`)},
			"@b\"q:x": {},
		},
		Failures: map[string]any{"y": map[string]any{"status": 503, "message": "down"}},
		MasterKeys: map[string]json.RawMessage{
			"@a:x": json.RawMessage(`{"keys":{"ed25519:M":"M"},"usage":["master"]}`),
			"@c:x": json.RawMessage(`{"b":1}`),
			"@b:x": nil,
		},
		SelfSigningKeys: map[string]json.RawMessage{"@a:x": json.RawMessage(`{"usage":["self_signing"]}`)},
		UserSigningKeys: map[string]json.RawMessage{},
	}
	for _, r := range []QueryResponse{r, {}} {
		checkAppendJSON(t, r)
	}
}

func checkAppendJSON(t *testing.T, r QueryResponse) {
	t.Helper()
	fast, err := r.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	slow, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var a, b any
	if err := json.Unmarshal(fast, &a); err != nil {
		t.Fatalf("not JSON: %s", fast)
	}
	_ = json.Unmarshal(slow, &b)
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("differs:\n%s\n%s", fast, slow)
	}
}

// appendString writes a JSON string that reads back as the same string
// json.Marshal's does (it leaves <, > and & unescaped, as canonical JSON
// does).
func TestAppendString(t *testing.T) {
	for _, s := range []string{"", "@alice:example.org", "DEVICE", `a"b`, `back\slash`, "tab\there", "nul\x00", "é ü 日本", "<html>&", "\x7f", string([]byte{0xff, 'a'})} {
		got := appendString([]byte("x"), s)
		var back string
		if err := json.Unmarshal(got[1:], &back); err != nil {
			t.Fatalf("%q: not a JSON string: %s", s, got)
		}
		want, _ := json.Marshal(s)
		var wantBack string
		_ = json.Unmarshal(want, &wantBack)
		if back != wantBack || got[0] != 'x' {
			t.Fatalf("%q: wrote %s, which reads back as %q, want %q", s, got, back, wantBack)
		}
	}
}

// Adding "unsigned" without decoding the stored object gives the same
// object as decoding and encoding it; objects that already hold "unsigned"
// get it replaced, not duplicated; without a display name it is an empty
// object, never left out.
func TestWithUnsigned(t *testing.T) {
	for _, tc := range []struct {
		keys string
		name *string
		want string
	}{
		{`{"device_id":"D","keys":{"ed25519:D":"k"}}`, displayName("Phone"), `{"device_id":"D","keys":{"ed25519:D":"k"},"unsigned":{"device_display_name":"Phone"}}`},
		{`{"device_id":"D"}`, displayName(`Bob's "work" laptop é`), `{"device_id":"D","unsigned":{"device_display_name":"Bob's \"work\" laptop é"}}`},
		{`{"device_id":"D","unsigned":{"x":1}}`, displayName("N"), `{"device_id":"D","unsigned":{"device_display_name":"N"}}`},
		{`{}`, displayName("N"), `{"unsigned":{"device_display_name":"N"}}`},
		{`{ }`, displayName("N"), `{"unsigned":{"device_display_name":"N"}}`},
		{` {"a":1} `, displayName("N"), `{"a":1,"unsigned":{"device_display_name":"N"}}`},
		{`{"device_id":"D","keys":{"ed25519:D":"k"}}`, nil, `{"device_id":"D","keys":{"ed25519:D":"k"},"unsigned":{}}`},
		{`{"device_id":"D","unsigned":{"x":1}}`, nil, `{"device_id":"D","unsigned":{}}`},
		{`{}`, nil, `{"unsigned":{}}`},
		{` {"a":1} `, nil, `{"a":1,"unsigned":{}}`},
		{`{"a":1}`, displayName(""), `{"a":1,"unsigned":{"device_display_name":""}}`},
	} {
		got, err := withUnsigned([]byte(tc.keys), tc.name)
		if err != nil {
			t.Fatal(err)
		}
		var a, b any
		if err := json.Unmarshal(got, &a); err != nil {
			t.Fatalf("%s: not JSON: %s", tc.keys, got)
		}
		_ = json.Unmarshal([]byte(tc.want), &b)
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("%s + %v:\n got %s\nwant %s", tc.keys, tc.name, got, tc.want)
		}
	}
	for _, bad := range []string{`null`, `[1]`, `"x"`} {
		if _, err := withUnsigned([]byte(bad), nil); err == nil {
			t.Fatalf("%s: no error", bad)
		}
	}
}

func displayName(s string) *string { return &s }
