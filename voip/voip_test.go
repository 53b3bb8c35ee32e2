package voip

import (
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base64"
	"testing"
	"time"
)

func TestSharedSecretCredentials(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	turn := New(Config{URIs: []string{"turn:turn.example.org:3478?transport=udp"}, SharedSecret: "s3cret",
		UserLifetime: time.Hour}, func() time.Time { return now })
	a := turn.For("@alice:example.org")
	if a == nil || a.Username != "1700003600:@alice:example.org" || a.TTL != 3600 || len(a.URIs) != 1 {
		t.Fatalf("answer %+v", a)
	}
	// The TURN server checks the password as the HMAC-SHA1 of the username
	// under the shared secret (coturn's use-auth-secret).
	mac := hmac.New(sha1.New, []byte("s3cret"))
	mac.Write([]byte(a.Username))
	if a.Password != base64.StdEncoding.EncodeToString(mac.Sum(nil)) {
		t.Fatalf("password %q", a.Password)
	}
	// A known vector: HMAC-SHA1("key", "The quick brown fox jumps over the lazy dog").
	mac = hmac.New(sha1.New, []byte("key"))
	mac.Write([]byte("The quick brown fox jumps over the lazy dog"))
	if got := base64.StdEncoding.EncodeToString(mac.Sum(nil)); got != "3nybhbi3iqa8ino29wqQcBydtNk=" {
		t.Fatalf("HMAC-SHA1 vector %s", got)
	}
}

func TestFixedAndNoCredentials(t *testing.T) {
	fixed := New(Config{URIs: []string{"turns:t.example.org"}, Username: "u", Password: "p", UserLifetime: time.Hour}, nil)
	if a := fixed.For("@bob:example.org"); a == nil || a.Username != "u" || a.Password != "p" || a.TTL != 3600 {
		t.Fatalf("fixed %+v", a)
	}
	if a := New(Config{UserLifetime: time.Hour, SharedSecret: "s"}, nil).For("@bob:example.org"); a != nil {
		t.Fatalf("no URIs: %+v", a)
	}
	if a := New(Config{URIs: []string{"turn:x"}, UserLifetime: time.Hour}, nil).For("@bob:example.org"); a != nil {
		t.Fatalf("URIs without credentials: %+v", a)
	}
}
