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
		Failures:        map[string]any{"y": map[string]any{"status": 503, "message": "down"}},
		MasterKeys:      map[string]json.RawMessage{},
		SelfSigningKeys: map[string]json.RawMessage{},
		UserSigningKeys: map[string]json.RawMessage{},
	}
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
