package identity

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// Synapse's well-known test key: the seed and the public key it yields.
const (
	testSeed   = "YJDBA9Xnr2sVqXD9Vj7XVUnmFZcZrlw8Md7kMW+3XA1"
	testPublic = "XGX0JRS2Af3be3knz2fBiRbApjm2Dh61gXDJA8kcJNI"
)

func fileMode(t *testing.T, path string) os.FileMode {
	t.Helper()
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return info.Mode().Perm()
}

func TestSigningKeyCreateAndReload(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	path := filepath.Join(dir, "signing.key")

	key, created, err := LoadOrCreateSigningKey(path)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if !created {
		t.Error("created = false for a new key")
	}
	if !regexp.MustCompile(`^ed25519:a_[a-zA-Z0-9]{4}$`).MatchString(string(key.KeyID)) {
		t.Errorf("KeyID = %q, want ed25519:a_ and four alphanumerics", key.KeyID)
	}
	if got := fileMode(t, path); got != 0o600 {
		t.Errorf("key file mode = %o, want 600", got)
	}
	if got := fileMode(t, dir); got != 0o700 {
		t.Errorf("key directory mode = %o, want 700", got)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^ed25519 a_[a-zA-Z0-9]{4} [A-Za-z0-9+/]{43}\n$`).Match(data) {
		t.Errorf("key file %q is not one Synapse-format line", data)
	}

	again, created, err := LoadOrCreateSigningKey(path)
	if err != nil {
		t.Fatalf("reload: %v", err)
	}
	if created {
		t.Error("created = true when reloading an existing key")
	}
	if again.KeyID != key.KeyID || !again.PrivateKey.Equal(key.PrivateKey) {
		t.Errorf("reloaded key %s differs from created key %s", again.KeyID, key.KeyID)
	}
}

func TestSigningKeySignatureVerifies(t *testing.T) {
	key, _, err := LoadOrCreateSigningKey(filepath.Join(t.TempDir(), "signing.key"))
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte(`{"server_name":"example.org"}`)
	sig := ed25519.Sign(key.PrivateKey, msg)
	if !ed25519.Verify(key.PublicKey(), msg, sig) {
		t.Error("signature does not verify with PublicKey()")
	}
	if ed25519.Verify(key.PublicKey(), append(msg, ' '), sig) {
		t.Error("signature verifies for a different message")
	}
}

func TestSigningKeyParsesSynapseFormat(t *testing.T) {
	tests := []struct {
		name, content, wantKeyID string
	}{
		{"unpadded", "ed25519 a_test " + testSeed + "\n", "ed25519:a_test"},
		{"padded", "ed25519 a_test " + testSeed + "=\n", "ed25519:a_test"},
		{"no final newline", "ed25519 auto " + testSeed, "ed25519:auto"},
		{"CRLF", "ed25519 a_1 " + testSeed + "\r\n", "ed25519:a_1"},
		{"comments and blank lines", "# moved from synapse\n\n  \ned25519 a_test " + testSeed + "\n", "ed25519:a_test"},
		{"first key wins", "ed25519 first " + testSeed + "\ned25519 second " + strings.Repeat("A", 43) + "\n", "ed25519:first"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "signing.key")
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			key, created, err := LoadOrCreateSigningKey(path)
			if err != nil {
				t.Fatal(err)
			}
			if created {
				t.Error("created = true for an existing key")
			}
			if string(key.KeyID) != tt.wantKeyID {
				t.Errorf("KeyID = %q, want %q", key.KeyID, tt.wantKeyID)
			}
			if got := base64.RawStdEncoding.EncodeToString(key.PublicKey()); got != testPublic {
				t.Errorf("public key = %s, want %s", got, testPublic)
			}
		})
	}
}

func TestSigningKeyMalformed(t *testing.T) {
	tests := []struct {
		name, content, wantErr string
	}{
		{"empty", "", "no key found"},
		{"only comments", "# nothing\n\n", "no key found"},
		{"missing seed", "ed25519 a_test\n", "line 1"},
		{"extra field", "ed25519 a_test " + testSeed + " extra\n", "line 1"},
		{"wrong algorithm", "rsa a_test " + testSeed + "\n", `unsupported algorithm "rsa"`},
		{"bad version", "ed25519 a-test " + testSeed + "\n", `key version "a-test"`},
		{"bad base64", "# c\ned25519 a_test !!!notbase64!!!\n", "line 2: key is not valid base64"},
		{"short seed", "ed25519 a_test " + testSeed[:20] + "\n", "want 32"},
		{"long seed", "ed25519 a_test " + base64.RawStdEncoding.EncodeToString(make([]byte, 64)) + "\n", "want 32"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "signing.key")
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, _, err := LoadOrCreateSigningKey(path)
			if err == nil {
				t.Fatal("malformed key file accepted")
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %q does not name %s and contain %q", err, path, tt.wantErr)
			}
			if data, _ := os.ReadFile(path); string(data) != tt.content {
				t.Errorf("malformed key file was rewritten to %q", data)
			}
		})
	}
}

func TestSigningKeyPathIsDirectory(t *testing.T) {
	if _, _, err := LoadOrCreateSigningKey(t.TempDir()); err == nil {
		t.Error("a directory was accepted as a signing key file")
	}
}

func TestTLSGenerateAndReload(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")

	cert, created, err := LoadOrCreateTLS(certFile, keyFile, "example.org:8448", true)
	if err != nil {
		t.Fatalf("generate: %v", err)
	}
	if !created {
		t.Error("created = false for a generated certificate")
	}
	if got := fileMode(t, keyFile); got != 0o600 {
		t.Errorf("key file mode = %o, want 600", got)
	}
	leaf := cert.Leaf
	if leaf == nil {
		t.Fatal("certificate has no parsed leaf")
	}
	for _, name := range []string{"example.org", "localhost"} {
		if !slices.Contains(leaf.DNSNames, name) {
			t.Errorf("DNS SANs %q lack %q", leaf.DNSNames, name)
		}
	}
	for _, ip := range []string{"127.0.0.1", "::1"} {
		if !hasIP(leaf.IPAddresses, ip) {
			t.Errorf("IP SANs %v lack %s", leaf.IPAddresses, ip)
		}
	}
	if years := leaf.NotAfter.Sub(time.Now()).Hours() / 24 / 365; years < 9.9 || years > 10.1 {
		t.Errorf("certificate valid for %.1f years, want 10", years)
	}
	// A client that pins the certificate must be able to verify it for
	// the server's host name.
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	if _, err := leaf.Verify(x509.VerifyOptions{DNSName: "example.org", Roots: roots}); err != nil {
		t.Errorf("generated certificate does not verify for its host: %v", err)
	}

	again, created, err := LoadOrCreateTLS(certFile, keyFile, "example.org:8448", true)
	if err != nil {
		t.Fatalf("reload: %v", err)
	}
	if created {
		t.Error("created = true when reloading")
	}
	if !bytes.Equal(again.Certificate[0], cert.Certificate[0]) {
		t.Error("reloaded certificate differs from the generated one")
	}
}

func TestTLSSubjectAltNames(t *testing.T) {
	tests := []struct {
		serverName string
		wantIP     string // "" for a DNS name
		wantDNS    string
	}{
		{serverName: "matrix.example.org", wantDNS: "matrix.example.org"},
		{serverName: "localhost:8448", wantDNS: "localhost"},
		{serverName: "192.0.2.7:8448", wantIP: "192.0.2.7"},
		{serverName: "192.0.2.7", wantIP: "192.0.2.7"},
		{serverName: "[2001:db8::1]:8448", wantIP: "2001:db8::1"},
		{serverName: "[2001:db8::1]", wantIP: "2001:db8::1"},
	}
	for _, tt := range tests {
		t.Run(tt.serverName, func(t *testing.T) {
			dir := t.TempDir()
			cert, _, err := LoadOrCreateTLS(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), tt.serverName, true)
			if err != nil {
				t.Fatal(err)
			}
			leaf := cert.Leaf
			if tt.wantIP != "" {
				if !hasIP(leaf.IPAddresses, tt.wantIP) {
					t.Errorf("IP SANs %v lack %s", leaf.IPAddresses, tt.wantIP)
				}
				if slices.Contains(leaf.DNSNames, tt.wantIP) {
					t.Errorf("IP literal %s given as a DNS SAN", tt.wantIP)
				}
			} else if !slices.Contains(leaf.DNSNames, tt.wantDNS) {
				t.Errorf("DNS SANs %q lack %q", leaf.DNSNames, tt.wantDNS)
			}
			// No name should be listed twice, e.g. "localhost" when it is
			// the server name.
			if len(slices.Compact(slices.Sorted(slices.Values(leaf.DNSNames)))) != len(leaf.DNSNames) {
				t.Errorf("duplicate DNS SANs %q", leaf.DNSNames)
			}
		})
	}
}

func TestTLSHalfAPair(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if _, _, err := LoadOrCreateTLS(certFile, keyFile, "example.org", true); err != nil {
		t.Fatal(err)
	}
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name, remove, keep string
		keepPEM            []byte
	}{
		{"key missing", keyFile, certFile, certPEM},
		{"certificate missing", certFile, keyFile, keyPEM},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := os.Remove(tt.remove); err != nil {
				t.Fatal(err)
			}
			_, _, err := LoadOrCreateTLS(certFile, keyFile, "example.org", true)
			if err == nil || !strings.Contains(err.Error(), tt.remove) {
				t.Errorf("error = %v, want one naming %s", err, tt.remove)
			}
			if _, err := os.Stat(tt.remove); err == nil {
				t.Errorf("%s was generated although its partner exists", tt.remove)
			}
			if data, _ := os.ReadFile(tt.keep); !bytes.Equal(data, tt.keepPEM) {
				t.Errorf("%s was modified", tt.keep)
			}
			// Restore the pair for the next case.
			if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestTLSNoGenerate(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if _, _, err := LoadOrCreateTLS(certFile, keyFile, "example.org", false); err == nil {
		t.Error("missing configured certificate accepted with generate=false")
	}
	if _, err := os.Stat(certFile); err == nil {
		t.Error("certificate generated with generate=false")
	}
}

func TestTLSInvalidServerName(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if _, _, err := LoadOrCreateTLS(certFile, keyFile, "not a server name", true); err == nil {
		t.Error("invalid server name accepted")
	}
	for _, f := range []string{certFile, keyFile} {
		if _, err := os.Stat(f); err == nil {
			t.Errorf("%s written despite the error", f)
		}
	}
}

func TestTLSMalformedPairIsNotReplaced(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for _, f := range []string{certFile, keyFile} {
		if err := os.WriteFile(f, []byte("garbage\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := LoadOrCreateTLS(certFile, keyFile, "example.org", true); err == nil {
		t.Error("malformed certificate accepted")
	}
	if data, _ := os.ReadFile(certFile); string(data) != "garbage\n" {
		t.Error("malformed certificate was replaced")
	}
}

func hasIP(ips []net.IP, s string) bool {
	want := net.ParseIP(s)
	return slices.ContainsFunc(ips, want.Equal)
}
