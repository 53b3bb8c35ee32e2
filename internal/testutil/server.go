package testutil

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/devicelist"
	"github.com/keyserver/keyserver/internal/ratelimit"
	"github.com/keyserver/keyserver/internal/server"
	"github.com/keyserver/keyserver/keyserver"
	"github.com/keyserver/keyserver/storage/sqlstore"
	"github.com/keyserver/keyserver/voip"
)

// AdminToken is the admin token of test servers.
const AdminToken = "test-admin-token"

// ServerOptions adjust a test server.
type ServerOptions struct {
	ServerName         string
	RegistrationClosed bool
	MaxOneTimeKeys     int
	MaxRequestBytes    int64
	// A rate limit per access token (off when RateLimitPerSecond is 0).
	RateLimitPerSecond, RateLimitBurst int
	// LaxKeyValidation checks only the shape of uploaded keys
	// (keys.strict_validation: false).
	LaxKeyValidation bool
	// SearchAllUsers makes the user directory find every local user.
	SearchAllUsers bool
	// TURN is the TURN server /voip/turnServer hands out (none: {}).
	TURN voip.Config
	// Limits of /login and /register per remote address and of wrong
	// passwords per account: off unless set, since tests log in many
	// users from one address.
	Login, Register, FailedLogins RateLimit
	// ToDevice limits /sendToDevice per sending user (off unless set).
	ToDevice RateLimit
	// BcryptConcurrency bounds the password hashes computed at once
	// (0: the daemon's default).
	BcryptConcurrency int
	// Now is the domain's clock (time.Now when nil).
	Now func() time.Time
}

// RateLimit is a token bucket of a test server (off when PerSecond is 0).
type RateLimit struct {
	PerSecond float64
	Burst     int
}

func (rl RateLimit) limiter(now func() time.Time) *ratelimit.Limiter {
	return ratelimit.New(rl.PerSecond, rl.Burst, now)
}

// Server is a client API on a loopback listener, backed by a real store.
type Server struct {
	URL        string
	ServerName string
	Service    *keyserver.Service
	Store      *sqlstore.Store
	// Updater resyncs stale remote device lists (nodes only: nil for a
	// server without federation).
	Updater *devicelist.Updater
	// Parts are the server's parts, as the builder made them.
	Parts *server.Server
}

// NewServer starts a client API for the test on db.
func NewServer(t testing.TB, db Database, o ServerOptions) *Server {
	t.Helper()
	if o.ServerName == "" {
		o.ServerName = "test.local"
	}
	cfg := config.Default()
	cfg.ServerName = o.ServerName
	cfg.Database = db.URI
	cfg.AdminToken = AdminToken
	if o.RegistrationClosed {
		cfg.ClientAPI.Registration = "closed"
	}
	cfg.ClientAPI.BcryptCost = 4 // the minimum: tests check passwords, not bcrypt's strength
	cfg.ClientAPI.BcryptConcurrency = o.BcryptConcurrency
	if o.MaxOneTimeKeys > 0 {
		cfg.ClientAPI.MaxOneTimeKeysPerDevice = o.MaxOneTimeKeys
	}
	if o.MaxRequestBytes > 0 {
		cfg.ClientAPI.MaxRequestBytes = o.MaxRequestBytes
	}
	cfg.ClientAPI.WriteTimeout = 0 // httptest's server has none
	cfg.ClientAPI.RateLimitPerSecond, cfg.ClientAPI.RateLimitBurst = o.RateLimitPerSecond, o.RateLimitBurst
	cfg.ClientAPI.LoginRateLimit = config.RateLimit(o.Login)
	cfg.ClientAPI.RegistrationRateLimit = config.RateLimit(o.Register)
	cfg.ClientAPI.FailedLoginRateLimit = config.RateLimit(o.FailedLogins)
	cfg.ClientAPI.ToDeviceRateLimit = config.RateLimit(o.ToDevice)
	cfg.ClientAPI.UserDirectory.SearchAllUsers = o.SearchAllUsers
	cfg.ClientAPI.TURN = config.TURNConfig{URIs: o.TURN.URIs, SharedSecret: o.TURN.SharedSecret,
		Username: o.TURN.Username, Password: o.TURN.Password, UserLifetime: config.Duration(o.TURN.UserLifetime)}
	cfg.Keys.StrictValidation = !o.LaxKeyValidation
	log := logrus.New()
	log.SetOutput(io.Discard)
	srv, err := server.Build(context.Background(), cfg, server.Options{Logger: log, Now: o.Now})
	if err != nil {
		t.Fatalf("build a server on %s: %v", db.Name, err)
	}
	ts := httptest.NewServer(srv.Client)
	t.Cleanup(func() {
		srv.ReleaseWaiting()
		ts.Close()
		if err := srv.Close(context.Background()); err != nil {
			t.Errorf("close the server: %v", err)
		}
	})
	return &Server{URL: ts.URL, ServerName: o.ServerName, Service: srv.Keys, Store: srv.Store, Parts: srv}
}

// Response is a decoded answer.
type Response struct {
	Status int
	Body   map[string]any
	Raw    []byte
}

// Errcode returns the body's errcode.
func (r Response) Errcode() string { s, _ := r.Body["errcode"].(string); return s }

// Do sends a request. body is sent as is when it is a string or []byte,
// and as JSON otherwise (nil: no body). token may be empty.
func (s *Server) Do(t testing.TB, method, path, token string, body any) Response {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		js, err := json.Marshal(b)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		rd = bytes.NewReader(js)
	}
	req, err := http.NewRequest(method, s.URL+path, rd)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	out := Response{Status: resp.StatusCode, Raw: raw}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &out.Body); err != nil {
			t.Fatalf("%s %s: answer is not a JSON object (%d): %s", method, path, resp.StatusCode, raw)
		}
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s %s: Content-Type %q", method, path, ct)
	}
	return out
}

// Must sends a request and fails the test unless the answer is 200.
func (s *Server) Must(t testing.TB, method, path, token string, body any) map[string]any {
	t.Helper()
	r := s.Do(t, method, path, token, body)
	if r.Status != http.StatusOK {
		t.Fatalf("%s %s: status %d: %s", method, path, r.Status, r.Raw)
	}
	return r.Body
}

// User is a registered user with one logged-in device and its identity key.
type User struct {
	UserID, DeviceID, Token string
	Password                string
	Key                     ed25519.PrivateKey
}

// Register creates an account with a device (an ID is generated when
// deviceID is empty).
func (s *Server) Register(t testing.TB, username, deviceID string) *User {
	t.Helper()
	body := map[string]any{"username": username, "password": "pw-" + username, "auth": map[string]any{"type": "m.login.dummy"}}
	if deviceID != "" {
		body["device_id"] = deviceID
	}
	r := s.Must(t, "POST", "/_matrix/client/v3/register", "", body)
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	return &User{UserID: r["user_id"].(string), DeviceID: r["device_id"].(string), Token: r["access_token"].(string),
		Password: "pw-" + username, Key: priv}
}

// Login logs the user in on another device, returning it as a new User
// with its own identity key.
func (s *Server) Login(t testing.TB, u *User, deviceID string) *User {
	t.Helper()
	body := map[string]any{"type": "m.login.password", "identifier": map[string]any{"type": "m.id.user", "user": u.UserID}, "password": u.Password}
	if deviceID != "" {
		body["device_id"] = deviceID
	}
	r := s.Must(t, "POST", "/_matrix/client/v3/login", "", body)
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	return &User{UserID: u.UserID, DeviceID: r["device_id"].(string), Token: r["access_token"].(string), Password: u.Password, Key: priv}
}

// B64 is unpadded standard base64.
func B64(b []byte) string { return base64.RawStdEncoding.EncodeToString(b) }

// RandomKey returns a random 32-byte key in base64, standing in for a
// curve25519 public key.
func RandomKey() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return B64(b)
}

// Sign signs obj as the device would, returning the signed object.
func Sign(t testing.TB, obj map[string]any, userID, deviceID string, key ed25519.PrivateKey) map[string]any {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	signed, err := gomatrixserverlib.SignJSON(userID, gomatrixserverlib.KeyID("ed25519:"+deviceID), key, raw)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(signed, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

// DeviceKeys returns the device's signed DeviceKeys object.
func (u *User) DeviceKeys(t testing.TB) map[string]any {
	t.Helper()
	return Sign(t, map[string]any{
		"user_id":    u.UserID,
		"device_id":  u.DeviceID,
		"algorithms": []string{"m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"},
		"keys": map[string]string{
			"curve25519:" + u.DeviceID: RandomKeyFor(u.Key),
			"ed25519:" + u.DeviceID:    B64(u.Key.Public().(ed25519.PublicKey)),
		},
	}, u.UserID, u.DeviceID, u.Key)
}

// RandomKeyFor derives a stable stand-in curve25519 key from a device key,
// so that repeated DeviceKeys calls give identical identity keys.
func RandomKeyFor(k ed25519.PrivateKey) string { return B64(k.Seed()[:32]) }

// OneTimeKeys returns n signed one-time keys with IDs prefix0..prefix(n-1).
func (u *User) OneTimeKeys(t testing.TB, prefix string, n int) map[string]any {
	t.Helper()
	out := map[string]any{}
	for i := 0; i < n; i++ {
		out[fmt.Sprintf("signed_curve25519:%s%04d", prefix, i)] = u.SignedKey(t, false)
	}
	return out
}

// SignedKey returns one signed curve25519 key object.
func (u *User) SignedKey(t testing.TB, fallback bool) map[string]any {
	obj := map[string]any{"key": RandomKey()}
	if fallback {
		obj["fallback"] = true
	}
	return Sign(t, obj, u.UserID, u.DeviceID, u.Key)
}

// Upload uploads keys and fails the test unless it is accepted.
func (s *Server) Upload(t testing.TB, u *User, body map[string]any) map[string]any {
	t.Helper()
	return s.Must(t, "POST", "/_matrix/client/v3/keys/upload", u.Token, body)
}

// Join records a room membership through the admin API.
func (s *Server) Join(t testing.TB, roomID, userID string) {
	s.setMembership(t, roomID, userID, "join")
}

// Leave records that a user left a room.
func (s *Server) Leave(t testing.TB, roomID, userID string) {
	s.setMembership(t, roomID, userID, "leave")
}

func (s *Server) setMembership(t testing.TB, roomID, userID, m string) {
	t.Helper()
	s.Must(t, "PUT", "/_keyserver/admin/v1/rooms/"+url.PathEscape(roomID)+"/members/"+url.PathEscape(userID), AdminToken,
		map[string]string{"membership": m})
}

// Canonical returns the canonical JSON of v without "unsigned", for
// comparing key objects.
func Canonical(t testing.TB, v any) string {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) == nil {
		delete(m, "unsigned")
		raw, _ = json.Marshal(m)
	}
	c, err := gomatrixserverlib.CanonicalJSON(raw)
	if err != nil {
		t.Fatal(err)
	}
	return string(c)
}

// Eventually waits for a condition, failing the test after 30 seconds. It
// checks often; it is for work the test cannot be told about directly.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
