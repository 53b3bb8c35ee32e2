package fedclient

import (
	"context"
	"encoding/json"
	"net/url"
)

// The key endpoints' answers, with key objects kept as raw JSON: they are
// signed, and must be stored and passed on exactly as their device made them.

// UserDevices is the answer of GET /user/devices/{userId}.
type UserDevices struct {
	UserID         string          `json:"user_id"`
	StreamID       int64           `json:"stream_id"`
	Devices        []UserDevice    `json:"devices"`
	MasterKey      json.RawMessage `json:"master_key,omitempty"`
	SelfSigningKey json.RawMessage `json:"self_signing_key,omitempty"`
}

// UserDevice is one device in UserDevices.
type UserDevice struct {
	DeviceID    string          `json:"device_id"`
	DisplayName *string         `json:"device_display_name,omitempty"`
	Keys        json.RawMessage `json:"keys"`
}

// QueryKeysResponse is the answer of POST /user/keys/query.
type QueryKeysResponse struct {
	DeviceKeys      map[string]map[string]json.RawMessage `json:"device_keys"`
	MasterKeys      map[string]json.RawMessage            `json:"master_keys,omitempty"`
	SelfSigningKeys map[string]json.RawMessage            `json:"self_signing_keys,omitempty"`
}

// ClaimKeysResponse is the answer of POST /user/keys/claim.
type ClaimKeysResponse struct {
	OneTimeKeys map[string]map[string]map[string]json.RawMessage `json:"one_time_keys"`
}

// UserDevices fetches a remote user's whole device list.
func (c *Client) UserDevices(ctx context.Context, dest, userID string) (UserDevices, error) {
	var out UserDevices
	err := c.Do(ctx, "GET", dest, "/_matrix/federation/v1/user/devices/"+url.PathEscape(userID), nil, &out)
	return out, err
}

// QueryKeys asks a server for its users' device keys.
func (c *Client) QueryKeys(ctx context.Context, dest string, users map[string][]string) (QueryKeysResponse, error) {
	var out QueryKeysResponse
	err := c.Do(ctx, "POST", dest, "/_matrix/federation/v1/user/keys/query", map[string]any{"device_keys": users}, &out)
	return out, err
}

// ClaimKeys claims one-time keys of a server's users: user -> device ->
// algorithm.
func (c *Client) ClaimKeys(ctx context.Context, dest string, req map[string]map[string]string) (ClaimKeysResponse, error) {
	var out ClaimKeysResponse
	err := c.Do(ctx, "POST", dest, "/_matrix/federation/v1/user/keys/claim", map[string]any{"one_time_keys": req}, &out)
	return out, err
}

// The specification's bounds on a transaction: what a sender puts in one
// and what a receiver accepts.
const (
	MaxPDUsPerTransaction = 50
	MaxEDUsPerTransaction = 100
)

// Transaction is the body of PUT /send/{txnId}; it carries at most
// MaxPDUsPerTransaction PDUs and MaxEDUsPerTransaction EDUs.
type Transaction struct {
	Origin         string            `json:"origin"`
	OriginServerTS int64             `json:"origin_server_ts"`
	PDUs           []json.RawMessage `json:"pdus"`
	EDUs           []EDU             `json:"edus,omitempty"`
}

// EDU is an ephemeral event in a transaction.
type EDU struct {
	Type    string          `json:"edu_type"`
	Content json.RawMessage `json:"content"`
}

// SendTransaction delivers a transaction. A retry of the same transaction
// must use the same txnID, so the receiver processes it once.
func (c *Client) SendTransaction(ctx context.Context, dest, txnID string, t Transaction) error {
	if t.PDUs == nil {
		t.PDUs = []json.RawMessage{}
	}
	return c.Do(ctx, "PUT", dest, "/_matrix/federation/v1/send/"+url.PathEscape(txnID), t, nil)
}
