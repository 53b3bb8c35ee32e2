package keyserver

import (
	"bytes"
	"encoding/json"
	"testing"
)

// decoderMembers is the plain encoding/json reading of an object's members
// in document order, the reference orderedObject must agree with.
func decoderMembers(t *testing.T, raw string) []member {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
	if _, err := dec.Token(); err != nil {
		t.Fatal(err)
	}
	var out []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, member{Name: tok.(string), Value: v})
	}
	return out
}

func TestOrderedObjectKeepsDocumentOrder(t *testing.T) {
	for _, raw := range []string{
		`{}`,
		`{"b:1": "x", "a:2": "y"}`,
		` { "z:1" : {"key": "k", "signatures": {"@u:x": {"ed25519:D": "s"}}} , "a:1":"v" } `,
		`{"\u0041:\u00e9": "escaped name", "tab\t:1": 1, "q\":1": [1, {"a": "}"}]}`,
		`{"dup:1": "first", "other:1": null, "dup:1": "second"}`,
		`{"s:1": "with \"quotes\" and \\ and \u2028", "n:1": -1.5e3, "t:1": true}`,
		`{"\ud83d\ude00:1": "surrogate pair name"}`,
	} {
		got, err := orderedObject("one_time_keys", json.RawMessage(raw))
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		want := decoderMembers(t, raw)
		if len(got) != len(want) {
			t.Fatalf("%s: %d members, want %d", raw, len(got), len(want))
		}
		for i := range want {
			if got[i].Name != want[i].Name || !bytes.Equal(got[i].Value, want[i].Value) {
				t.Fatalf("%s: member %d is %q=%s, want %q=%s", raw, i, got[i].Name, got[i].Value, want[i].Name, want[i].Value)
			}
		}
	}
	for _, raw := range []string{``, `null`, ` null `} {
		if got, err := orderedObject("f", json.RawMessage(raw)); err != nil || got != nil {
			t.Fatalf("%q: %v %v", raw, got, err)
		}
	}
	for _, raw := range []string{`[]`, `"s"`, `{"a": }`, `{"a" "b"}`, `{"a": "b"`, `{"a": "b"} x`, `{"a": tru}`} {
		if _, err := orderedObject("f", json.RawMessage(raw)); err == nil {
			t.Fatalf("%q accepted", raw)
		}
	}
}
