package testutil

import (
	"crypto/ed25519"
	"crypto/rand"
	"testing"
)

// CrossSigning is a user's set of cross-signing keys, as a client makes
// them.
type CrossSigning struct {
	UserID                           string
	Master, SelfSigning, UserSigning ed25519.PrivateKey
}

// NewCrossSigning makes fresh keys for a user.
func NewCrossSigning(userID string) *CrossSigning {
	gen := func() ed25519.PrivateKey { _, k, _ := ed25519.GenerateKey(rand.Reader); return k }
	return &CrossSigning{UserID: userID, Master: gen(), SelfSigning: gen(), UserSigning: gen()}
}

// PublicKey is a key's public half in unpadded base64, its ID.
func PublicKey(k ed25519.PrivateKey) string { return B64(k.Public().(ed25519.PublicKey)) }

// KeyObject is the CrossSigningKey object of key for usage, unsigned.
func KeyObject(userID, usage string, key ed25519.PrivateKey) map[string]any {
	pub := PublicKey(key)
	return map[string]any{"user_id": userID, "usage": []string{usage}, "keys": map[string]string{"ed25519:" + pub: pub}}
}

// SignWith signs obj with a cross-signing key of userID.
func SignWith(t testing.TB, obj map[string]any, userID string, key ed25519.PrivateKey) map[string]any {
	t.Helper()
	return Sign(t, obj, userID, PublicKey(key), key)
}

// MasterKey is the master key object.
func (c *CrossSigning) MasterKey() map[string]any { return KeyObject(c.UserID, "master", c.Master) }

// SelfSigningKey is the self-signing key object, signed by the master key.
func (c *CrossSigning) SelfSigningKey(t testing.TB) map[string]any {
	return SignWith(t, KeyObject(c.UserID, "self_signing", c.SelfSigning), c.UserID, c.Master)
}

// UserSigningKey is the user-signing key object, signed by the master key.
func (c *CrossSigning) UserSigningKey(t testing.TB) map[string]any {
	return SignWith(t, KeyObject(c.UserID, "user_signing", c.UserSigning), c.UserID, c.Master)
}

// Upload is the body of a /keys/device_signing/upload with all three keys.
func (c *CrossSigning) Upload(t testing.TB) map[string]any {
	return map[string]any{"master_key": c.MasterKey(), "self_signing_key": c.SelfSigningKey(t), "user_signing_key": c.UserSigningKey(t)}
}
