// Package canonicaljson writes Matrix objects in canonical JSON as the
// server compares and stores them: the same object always the same bytes.
package canonicaljson

import (
	"encoding/json"

	"github.com/matrix-org/gomatrixserverlib"
)

// WithoutUnsigned returns the canonical JSON of an object without its
// "unsigned" member, which the object's owner does not sign and servers
// may change.
func WithoutUnsigned(raw json.RawMessage) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, err
	}
	delete(obj, "unsigned")
	js, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	return gomatrixserverlib.CanonicalJSON(js)
}
