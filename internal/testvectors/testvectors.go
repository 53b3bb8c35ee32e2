// Package testvectors holds the end-to-end keys real client libraries made
// (mautrix-go with goolm, Element's Rust crypto), with vectors derived from
// them that must be rejected, for the tests of every package that checks keys.
package testvectors

import (
	_ "embed" // the vectors file
	"encoding/json"
	"fmt"
)

//go:embed real-client-keys.json
var realClientKeys []byte

// Client is one device as a client library made it.
type Client struct {
	Library      string                     `json:"library"`
	UserID       string                     `json:"user_id"`
	DeviceID     string                     `json:"device_id"`
	DeviceKeys   json.RawMessage            `json:"device_keys"`
	OneTimeKeys  map[string]json.RawMessage `json:"one_time_keys"`
	FallbackKeys map[string]json.RawMessage `json:"fallback_keys"`
}

// Negative is a vector derived from a real one that must be rejected.
type Negative struct {
	Name       string                   `json:"name"`
	UserID     string                   `json:"user_id"`
	DeviceID   string                   `json:"device_id"`
	Kind       string                   `json:"kind"` // "device_keys" or "one_time_key"
	KeyID      string                   `json:"key_id"`
	VerifyWith struct{ Ed25519 string } `json:"verify_with"`
	Object     json.RawMessage          `json:"object"`
}

// RealClientKeys is the whole set.
type RealClientKeys struct {
	Clients  []Client   `json:"clients"`
	Negative []Negative `json:"negative"`
}

// Load parses the vectors, checking that none went missing.
func Load() (RealClientKeys, error) {
	var v RealClientKeys
	if err := json.Unmarshal(realClientKeys, &v); err != nil {
		return v, err
	}
	if len(v.Clients) != 4 || len(v.Negative) != 4 {
		return v, fmt.Errorf("test vectors: %d clients, %d negative, want 4 and 4", len(v.Clients), len(v.Negative))
	}
	return v, nil
}
