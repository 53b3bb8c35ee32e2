// Package voip hands clients the TURN server to relay calls through (GET
// /voip/turnServer): fixed credentials, or credentials made from a secret
// shared with the TURN server and valid for a while (the TURN REST API:
// username "<expiry>:<user ID>", password the base64 HMAC-SHA1 of the
// username under the secret), as Synapse hands them out.
package voip

import (
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"strconv"
	"time"
)

// Config is the TURN server (package config's client_api.turn).
type Config struct {
	URIs               []string
	SharedSecret       string
	Username, Password string
	UserLifetime       time.Duration
}

// TURN makes the answers of GET /voip/turnServer.
type TURN struct {
	cfg Config
	now func() time.Time
}

// New makes a TURN; now may be nil (the wall clock).
func New(cfg Config, now func() time.Time) *TURN {
	if now == nil {
		now = time.Now
	}
	return &TURN{cfg: cfg, now: now}
}

// Answer is the body of GET /voip/turnServer.
type Answer struct {
	Username string   `json:"username"`
	Password string   `json:"password"`
	URIs     []string `json:"uris"`
	// TTL is how many seconds the credentials are valid.
	TTL int64 `json:"ttl"`
}

// For returns the credentials for userID, or nil when no TURN server is
// configured (the answer is then {}, as Synapse's).
func (t *TURN) For(userID string) *Answer {
	if t == nil || len(t.cfg.URIs) == 0 {
		return nil
	}
	ttl := int64(t.cfg.UserLifetime / time.Second)
	if t.cfg.SharedSecret != "" {
		username := strconv.FormatInt(t.now().Unix()+ttl, 10) + ":" + userID
		mac := hmac.New(sha1.New, []byte(t.cfg.SharedSecret))
		mac.Write([]byte(username))
		return &Answer{Username: username, Password: base64.StdEncoding.EncodeToString(mac.Sum(nil)), URIs: t.cfg.URIs, TTL: ttl}
	}
	if t.cfg.Username == "" {
		return nil // URIs without credentials: nothing a client can use
	}
	return &Answer{Username: t.cfg.Username, Password: t.cfg.Password, URIs: t.cfg.URIs, TTL: ttl}
}
