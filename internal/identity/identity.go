// Package identity loads, and on first start creates, the long-term secrets
// that make up the server's identity: the ed25519 key that signs its
// federation traffic and the TLS certificate of its federation listener.
//
// Existing files are never overwritten. A file that cannot be parsed is
// reported as an error rather than replaced, because replacing a signing key
// silently changes the server's identity for every other server.
package identity

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// SigningKey is the server's ed25519 signing key.
type SigningKey struct {
	KeyID      gomatrixserverlib.KeyID // e.g. "ed25519:a_Xyz1"
	PrivateKey ed25519.PrivateKey
}

// PublicKey returns the public half of the key, as published in the
// server's key responses.
func (k SigningKey) PublicKey() ed25519.PublicKey {
	return k.PrivateKey.Public().(ed25519.PublicKey)
}

// versionRE is the key version syntax Matrix allows in key IDs.
var versionRE = regexp.MustCompile(`^[a-zA-Z0-9_]+$`)

// LoadOrCreateSigningKey reads the key at path; when the file does not exist
// it generates a new key with a random version ("a_" and four characters of
// [a-zA-Z0-9]), writes it with mode 0600 (creating parent directories with
// mode 0700), and returns it. created reports whether a new key was made.
//
// The file uses Synapse's one-line format, "ed25519 <version> <base64 seed>",
// so keys can be moved between servers.
func LoadOrCreateSigningKey(path string) (key SigningKey, created bool, err error) {
	key, err = loadSigningKey(path)
	if !errors.Is(err, fs.ErrNotExist) {
		// Loaded, or failed for a reason other than absence: either
		// way the existing file must be left alone.
		return key, false, err
	}

	key, err = generateSigningKey()
	if err != nil {
		return SigningKey{}, false, fmt.Errorf("identity: generating signing key: %w", err)
	}
	version := strings.TrimPrefix(string(key.KeyID), "ed25519:")
	line := fmt.Sprintf("ed25519 %s %s\n", version, base64.RawStdEncoding.EncodeToString(key.PrivateKey.Seed()))
	if err := writeNewFile(path, []byte(line), 0o600); err != nil {
		if errors.Is(err, fs.ErrExist) {
			// Another process created the key between our read and
			// our write; use its key so that both agree.
			key, err = loadSigningKey(path)
			return key, false, err
		}
		return SigningKey{}, false, fmt.Errorf("identity: writing signing key: %w", err)
	}
	return key, true, nil
}

// loadSigningKey reads an existing key file. A missing file gives an error
// matching fs.ErrNotExist.
func loadSigningKey(path string) (SigningKey, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		// The *PathError names the file.
		return SigningKey{}, fmt.Errorf("identity: reading signing key: %w", err)
	}
	key, err := parseSigningKey(data)
	if err != nil {
		return SigningKey{}, fmt.Errorf("identity: signing key file %s: %w", path, err)
	}
	return key, nil
}

// parseSigningKey parses Synapse's signing key format. Like Synapse it uses
// the first key line; blank lines and '#' comments are skipped so that
// operators can annotate the file.
func parseSigningKey(data []byte) (SigningKey, error) {
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 3 {
			return SigningKey{}, fmt.Errorf("line %d: want \"ed25519 <version> <base64 seed>\"", i+1)
		}
		algorithm, version, encoded := fields[0], fields[1], fields[2]
		if algorithm != "ed25519" {
			return SigningKey{}, fmt.Errorf("line %d: unsupported algorithm %q, want ed25519", i+1, algorithm)
		}
		if !versionRE.MatchString(version) {
			return SigningKey{}, fmt.Errorf("line %d: key version %q may contain only a-z, A-Z, 0-9 and _", i+1, version)
		}
		seed, err := decodeBase64(encoded)
		if err != nil {
			return SigningKey{}, fmt.Errorf("line %d: key is not valid base64", i+1)
		}
		if len(seed) != ed25519.SeedSize {
			return SigningKey{}, fmt.Errorf("line %d: key seed is %d bytes, want %d", i+1, len(seed), ed25519.SeedSize)
		}
		return SigningKey{
			KeyID:      gomatrixserverlib.KeyID("ed25519:" + version),
			PrivateKey: ed25519.NewKeyFromSeed(seed),
		}, nil
	}
	return SigningKey{}, errors.New("no key found")
}

// decodeBase64 accepts padded or unpadded base64 in either the standard or
// the URL-safe alphabet, as Synapse's unpaddedbase64 decoder does, so any
// key Synapse can read can be read here too.
func decodeBase64(s string) ([]byte, error) {
	s = strings.TrimRight(s, "=")
	if strings.ContainsAny(s, "-_") {
		return base64.RawURLEncoding.DecodeString(s)
	}
	return base64.RawStdEncoding.DecodeString(s)
}

func generateSigningKey() (SigningKey, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return SigningKey{}, err
	}
	version, err := randomVersion()
	if err != nil {
		return SigningKey{}, err
	}
	return SigningKey{
		KeyID:      gomatrixserverlib.KeyID("ed25519:" + version),
		PrivateKey: priv,
	}, nil
}

// randomVersion returns "a_" and four random alphanumerics, the style of
// version Synapse generates. The randomness is so that a replacement key is
// unlikely to reuse the ID of the key it replaces, which remote servers may
// still have cached.
func randomVersion() (string, error) {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := []byte("a_")
	for range 4 {
		n, err := rand.Int(rand.Reader, big.NewInt(int64(len(alphabet))))
		if err != nil {
			return "", err
		}
		b = append(b, alphabet[n.Int64()])
	}
	return string(b), nil
}

// writeNewFile creates path with the given mode and contents, failing with an
// fs.ErrExist error rather than overwriting an existing file. Parent
// directories are created with mode 0700 because they hold secrets. A
// partially written file is removed so that the next start does not find a
// truncated secret.
func writeNewFile(path string, data []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// LoadOrCreateTLS returns a certificate for the federation listener. When
// certFile and keyFile both exist they are loaded. When neither exists and
// generate is true, a self-signed ECDSA P-256 certificate valid for ten years
// is generated for serverName's host, written as PEM (the key with mode 0600)
// and returned. One file existing without the other is an error, since
// generating the missing half could never produce a matching pair. created
// reports whether a certificate was generated.
//
// Besides the server's host, the generated certificate names "localhost",
// 127.0.0.1 and ::1, so that local tools and tests can connect by those names.
func LoadOrCreateTLS(certFile, keyFile, serverName string, generate bool) (cert tls.Certificate, created bool, err error) {
	certExists, err := exists(certFile)
	if err != nil {
		return tls.Certificate{}, false, fmt.Errorf("identity: TLS certificate: %w", err)
	}
	keyExists, err := exists(keyFile)
	if err != nil {
		return tls.Certificate{}, false, fmt.Errorf("identity: TLS key: %w", err)
	}

	switch {
	case certExists && keyExists:
		cert, err = tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return tls.Certificate{}, false, fmt.Errorf("identity: loading TLS certificate %s and key %s: %w", certFile, keyFile, err)
		}
		return cert, false, nil
	case certExists:
		return tls.Certificate{}, false, fmt.Errorf("identity: TLS certificate %s exists but its key %s does not", certFile, keyFile)
	case keyExists:
		return tls.Certificate{}, false, fmt.Errorf("identity: TLS key %s exists but its certificate %s does not", keyFile, certFile)
	case !generate:
		return tls.Certificate{}, false, fmt.Errorf("identity: TLS certificate %s and key %s do not exist", certFile, keyFile)
	}

	certPEM, keyPEM, err := selfSigned(serverName, time.Now())
	if err != nil {
		return tls.Certificate{}, false, fmt.Errorf("identity: generating TLS certificate: %w", err)
	}
	// Parse what will be written, so a generated pair is never returned in
	// a form that would fail to load on the next start.
	cert, err = tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, false, fmt.Errorf("identity: generated TLS certificate is unusable: %w", err)
	}
	if err := writeNewFile(keyFile, keyPEM, 0o600); err != nil {
		return tls.Certificate{}, false, fmt.Errorf("identity: writing TLS key: %w", err)
	}
	if err := writeNewFile(certFile, certPEM, 0o644); err != nil {
		// Remove the key written above, so that the next start finds
		// neither file and generates afresh instead of refusing to
		// start because of half a pair.
		os.Remove(keyFile)
		return tls.Certificate{}, false, fmt.Errorf("identity: writing TLS certificate: %w", err)
	}
	return cert, true, nil
}

func exists(path string) (bool, error) {
	_, err := os.Stat(path)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	}
	return false, err
}

// selfSigned generates a PEM certificate and PKCS #8 key for serverName's
// host, valid from an hour before now (to tolerate clock skew on the
// connecting side) for ten years.
func selfSigned(serverName string, now time.Time) (certPEM, keyPEM []byte, err error) {
	host, _, ok := spec.ParseAndValidateServerName(spec.ServerName(serverName))
	if !ok {
		return nil, nil, fmt.Errorf("%q is not a valid server name", serverName)
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")

	tmpl := &x509.Certificate{
		Subject:   pkix.Name{CommonName: host},
		NotBefore: now.Add(-time.Hour),
		NotAfter:  now.AddDate(10, 0, 0),
		// An ECDSA key only signs the handshake; it does not encipher keys.
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
	} else {
		tmpl.DNSNames = append(tmpl.DNSNames, host)
	}
	if host != "localhost" {
		tmpl.DNSNames = append(tmpl.DNSNames, "localhost")
	}
	for _, loopback := range []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback} {
		if !containsIP(tmpl.IPAddresses, loopback) {
			tmpl.IPAddresses = append(tmpl.IPAddresses, loopback)
		}
	}

	// RFC 5280 allows serial numbers of up to 20 octets; 128 random bits
	// make collisions between regenerated certificates negligible.
	tmpl.SerialNumber, err = rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, nil, err
	}

	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		nil
}

func containsIP(ips []net.IP, ip net.IP) bool {
	for _, have := range ips {
		if have.Equal(ip) {
			return true
		}
	}
	return false
}
