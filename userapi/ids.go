package userapi

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strings"

	"github.com/keyserver/keyserver/internal/mxerr"
)

// validLocalpart is the grammar of new localparts: a-z 0-9 . _ = - / +.
func validLocalpart(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("._=-/+", c) >= 0) {
			return false
		}
	}
	return true
}

// validDeviceID accepts client-chosen device IDs of 1 to 255 characters
// from the RFC 3986 unreserved set.
func validDeviceID(s string) bool {
	if s == "" || len(s) > 255 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-._~", c) >= 0) {
			return false
		}
	}
	return true
}

func checkDeviceID(id string) error {
	if !validDeviceID(id) {
		return mxerr.InvalidParam("device_id must be 1 to 255 characters of A-Z a-z 0-9 - . _ ~")
	}
	return nil
}

// randomString returns n characters drawn uniformly from alphabet.
func randomString(n int, alphabet string) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // the system's random source never fails on supported platforms
	}
	// 256 is a multiple of neither alphabet length, so reject the top of the
	// range to keep the draw uniform.
	limit := 256 - 256%len(alphabet)
	out := make([]byte, 0, n)
	for len(out) < n {
		for _, c := range b {
			if int(c) < limit && len(out) < n {
				out = append(out, alphabet[int(c)%len(alphabet)])
			}
		}
		if _, err := rand.Read(b); err != nil {
			panic(err)
		}
	}
	return string(out)
}

// newDeviceID makes a device ID of ten upper-case letters.
func newDeviceID() string { return randomString(10, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") }

// newAccessToken makes a token with 256 bits of randomness.
func newAccessToken() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return "ksat_" + base64.RawURLEncoding.EncodeToString(b)
}

// hashToken is how tokens are stored: a token is random enough that a
// plain SHA-256 cannot be reversed, and it keeps lookups a single index hit.
func hashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// newSessionID names a user-interactive auth session.
func newSessionID() string {
	return randomString(24, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
}
