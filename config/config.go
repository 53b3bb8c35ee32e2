// Package config defines the keyserver's configuration: the YAML file format,
// the default for every setting, validation, and helpers that turn settings
// which may be left empty into the effective values the daemon uses.
package config

import (
	"bytes"
	_ "embed" // for the default configuration file
	"encoding"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/matrix-org/gomatrixserverlib/spec"
	"golang.org/x/crypto/bcrypt"
	"gopkg.in/yaml.v3"

	"github.com/keyserver/keyserver/internal/iprange"
)

// defaultYAML is a complete, commented configuration at default values. It is
// embedded rather than generated so that the comments can be written for
// people; a test keeps it equal to Default().
//
//go:embed default.yaml
var defaultYAML []byte

// Config is the complete daemon configuration. Every field has a usable
// default (see Default), so a configuration file only needs the settings an
// operator wants to change.
type Config struct {
	// ServerName is the Matrix server name, the part after the colon in
	// user IDs. Default "localhost:8448".
	ServerName string `yaml:"server_name"`
	// DataDir holds the state the daemon creates itself (SQLite database,
	// signing key, generated TLS pair). Default "./data".
	DataDir string `yaml:"data_dir"`
	// Database is empty for a SQLite file <data_dir>/keyserver.db, a SQLite
	// path or "file:" URI, or a "postgres://" / "postgresql://" URL. Use
	// DatabaseURI for the effective value.
	Database string `yaml:"database"`
	// AdminToken is the bearer token for the admin API; empty disables
	// that API entirely.
	AdminToken string `yaml:"admin_token"`
	// SigningKeyPath is the ed25519 signing key file; empty means
	// <data_dir>/signing.key. Use SigningKeyFile for the effective value.
	SigningKeyPath string `yaml:"signing_key_path"`

	Log        LogConfig        `yaml:"log"`
	ClientAPI  ClientAPIConfig  `yaml:"client_api"`
	Federation FederationConfig `yaml:"federation"`
	Metrics    MetricsConfig    `yaml:"metrics"`
	Keys       KeysConfig       `yaml:"keys"`
	Media      MediaConfig      `yaml:"media"`
	Push       PushConfig       `yaml:"push"`
	Presence   PresenceConfig   `yaml:"presence"`
}

// LogConfig is the "log" section.
type LogConfig struct {
	// Level is debug, info, warn or error. Default info.
	Level string `yaml:"level"`
	// Format is text or json. Default text.
	Format string `yaml:"format"`
}

// ClientAPIConfig is the "client_api" section: the client-server API.
type ClientAPIConfig struct {
	// Listen is the host:port of the listener. Default "127.0.0.1:8008".
	Listen string `yaml:"listen"`
	// Registration is "open" (default) or "closed".
	Registration string `yaml:"registration"`
	// MaxRequestBytes caps request bodies. Default 1 MiB; at least 1024.
	MaxRequestBytes int64 `yaml:"max_request_bytes"`
	// BcryptCost is the bcrypt work factor for passwords. Default 12; 4..31.
	BcryptCost int `yaml:"bcrypt_cost"`
	// MaxOneTimeKeysPerDevice caps stored one-time keys per device.
	// Default 500; at least 1.
	MaxOneTimeKeysPerDevice int `yaml:"max_one_time_keys_per_device"`
	// SyncMaxTimeout caps the /sync long-poll, whatever the client asks
	// for. Default 60s.
	SyncMaxTimeout Duration `yaml:"sync_max_timeout"`
	// RateLimitPerSecond and RateLimitBurst bound the requests of each
	// access token (a token bucket); 0 per second turns the limit off.
	// Defaults 50 and 200.
	RateLimitPerSecond int `yaml:"rate_limit_per_second"`
	RateLimitBurst     int `yaml:"rate_limit_burst"`
	// ReadTimeout, WriteTimeout and IdleTimeout bound reading a request
	// (headers and body), answering it, and a kept-alive connection's
	// wait for the next request. Requests that wait (/sync, queries of
	// other servers) get their longest wait on top of WriteTimeout.
	// Defaults 30s, 60s and 2m.
	ReadTimeout  Duration `yaml:"read_timeout"`
	WriteTimeout Duration `yaml:"write_timeout"`
	IdleTimeout  Duration `yaml:"idle_timeout"`
	// MaxConnectionsPerAddress caps the connections open at once from one
	// remote (TCP peer) address; more are closed at once. 0 turns the cap
	// off. Addresses in TrustedProxies are exempt. Default 100.
	MaxConnectionsPerAddress int `yaml:"max_connections_per_address"`
	// TrustedProxies are the reverse proxies (IPs or CIDRs) whose
	// X-Forwarded-For is believed (the right-most address that is not a
	// trusted proxy is the client's) and whose connections are exempt from
	// MaxConnectionsPerAddress, on both listeners. Default none: the
	// header is ignored.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// LoginRateLimit bounds POST /login per remote address. Default 0.003
	// per second after a burst of 5 (Synapse's rc_login.address).
	LoginRateLimit RateLimit `yaml:"login_rate_limit"`
	// RegistrationRateLimit bounds the accounts registered per remote
	// address: every POST /register is checked, those that make an account
	// are counted (the auth round trip before one is not). Default 0.17
	// per second after a burst of 6.
	RegistrationRateLimit RateLimit `yaml:"registration_rate_limit"`
	// FailedLoginRateLimit bounds wrong passwords per account, at login
	// and in user-interactive auth; while it is exceeded every attempt on
	// the account is refused. Default 0.17 per second after a burst of 3
	// (Synapse's rc_login.failed_attempts).
	FailedLoginRateLimit RateLimit `yaml:"failed_login_rate_limit"`
	// ToDeviceRateLimit bounds PUT /sendToDevice per sending user.
	// Default 10 per second after a burst of 100.
	ToDeviceRateLimit RateLimit `yaml:"to_device_rate_limit"`
	// BcryptConcurrency is how many password hashes are computed at once;
	// the others wait. 0 (the default) means half of GOMAXPROCS, at least 1.
	BcryptConcurrency int `yaml:"bcrypt_concurrency"`
	// UserDirectory is how POST /user_directory/search finds users.
	UserDirectory UserDirectoryConfig `yaml:"user_directory"`
	// TURN is what GET /voip/turnServer hands out for calls.
	TURN TURNConfig `yaml:"turn"`
}

// UserDirectoryConfig is the "client_api.user_directory" section.
type UserDirectoryConfig struct {
	// SearchAllUsers finds every local user, not only those who share a
	// room with the searcher or are in a room of the public directory
	// (Synapse's user_directory.search_all_users). Default false.
	SearchAllUsers bool `yaml:"search_all_users"`
}

// TURNConfig is the "client_api.turn" section: the TURN server clients use
// for calls (Synapse's turn_* settings). With no URIs nothing is handed
// out.
type TURNConfig struct {
	// URIs are the TURN server's URIs ("turn:turn.example.org:3478?transport=udp").
	URIs []string `yaml:"uris"`
	// SharedSecret makes time-limited credentials (the TURN REST API that
	// coturn's use-auth-secret serves); it is used when set.
	SharedSecret string `yaml:"shared_secret"`
	// Username and Password are fixed credentials, for servers without a
	// shared secret.
	Username string `yaml:"username"`
	Password string `yaml:"password"`
	// UserLifetime is how long a credential made with SharedSecret is
	// valid. Default 1h.
	UserLifetime Duration `yaml:"user_lifetime"`
}

// RateLimit is a token bucket: Burst requests at once, then PerSecond.
// PerSecond 0 turns the limit off.
type RateLimit struct {
	PerSecond float64 `yaml:"per_second"`
	Burst     int     `yaml:"burst"`
}

// FederationConfig is the "federation" section: the server-server API.
type FederationConfig struct {
	// Listen is the host:port of the TLS listener. Default "127.0.0.1:8448".
	Listen string `yaml:"listen"`
	// TLSCert is the PEM certificate file; empty (together with TLSKey)
	// means a self-signed <data_dir>/tls.crt generated on first start.
	TLSCert string `yaml:"tls_cert"`
	// TLSKey is the PEM private key file; empty means <data_dir>/tls.key.
	TLSKey string `yaml:"tls_key"`
	// TLSInsecureSkipVerify disables verification of remote servers'
	// certificates. Default false; only for test set-ups.
	TLSInsecureSkipVerify bool `yaml:"tls_insecure_skip_verify"`
	// AllowDeviceNames shows device display names over federation.
	// Default false, because names often reveal more than users expect.
	AllowDeviceNames bool `yaml:"allow_device_names"`
	// KeyValidity sets valid_until_ts of our published server keys.
	// Default 24h.
	KeyValidity Duration `yaml:"key_validity"`
	// SendWait bounds how long /send waits for device-list updates.
	// Default 10s.
	SendWait Duration `yaml:"send_wait"`
	// SenderWorkers is how many servers our device-list updates are sent
	// to at once: a fixed pool, so memory and goroutines stay bounded
	// however many servers are waiting for updates. Default 32.
	SenderWorkers int `yaml:"sender_workers"`
	// OldVerifyKeys are signing keys this server used before a key
	// rotation, published under old_verify_keys so that other servers can
	// still check what they signed. Keyed by key ID ("ed25519:a_old").
	OldVerifyKeys map[string]OldVerifyKey `yaml:"old_verify_keys"`
	// RateLimitPerSecond and RateLimitBurst bound the requests of each
	// remote server; 0 per second turns the limit off. Defaults 100 and 400.
	RateLimitPerSecond int `yaml:"rate_limit_per_second"`
	RateLimitBurst     int `yaml:"rate_limit_burst"`
	// IPRangeDenylist are the addresses (CIDRs or single IPs) outbound
	// requests may not connect to, checked after DNS resolution. Default
	// every non-public range (iprange.NonPublic).
	IPRangeDenylist []string `yaml:"ip_range_denylist"`
	// IPRangeAllowlist are addresses allowed even though the denylist
	// names them (test set-ups on loopback: 127.0.0.0/8). Default none.
	IPRangeAllowlist []string `yaml:"ip_range_allowlist"`
	// ReadTimeout, WriteTimeout, IdleTimeout and MaxConnectionsPerAddress
	// are those of client_api for the federation listener. WriteTimeout
	// must exceed SendWait. Defaults 30s, 60s, 2m and 100.
	ReadTimeout              Duration `yaml:"read_timeout"`
	WriteTimeout             Duration `yaml:"write_timeout"`
	IdleTimeout              Duration `yaml:"idle_timeout"`
	MaxConnectionsPerAddress int      `yaml:"max_connections_per_address"`
}

// MetricsConfig is the operators' listener: Prometheus metrics and, when
// asked for, Go's profiler.
type MetricsConfig struct {
	// Listen is the host:port of the metrics listener; empty (the default)
	// turns it off. Keep it off the public network.
	Listen string `yaml:"listen"`
	// PProf serves /debug/pprof/ on the metrics listener. Default false.
	PProf bool `yaml:"pprof"`
}

// KeysConfig is the "keys" section: how keys uploaded by clients are
// checked.
type KeysConfig struct {
	// StrictValidation requires device keys signed by the device itself,
	// ed25519 and curve25519 values that are 32-byte base64, and signed
	// one-time and fallback keys signed by the device. false checks only
	// the shape of what is uploaded, as Synapse does, for deployments whose
	// clients or test tools upload placeholder keys. Default true.
	StrictValidation bool `yaml:"strict_validation"`
}

// PushConfig is the "push" section: the delivery of push notifications
// to the push gateways of users' pushers. Gateways are reached through
// federation.ip_range_denylist and ip_range_allowlist, as other servers
// are.
type PushConfig struct {
	// MinBackoff is the first wait after a failed delivery; each further
	// failure doubles it. Default 1s.
	MinBackoff Duration `yaml:"min_backoff"`
	// MaxBackoff: once the wait would pass it, the notification is given
	// up and the pusher's next one tried. Default 1h.
	MaxBackoff Duration `yaml:"max_backoff"`
	// RequestTimeout bounds one request to a gateway. Default 15s.
	RequestTimeout Duration `yaml:"request_timeout"`
}

// PresenceConfig is the "presence" section (Synapse's presence.enabled).
type PresenceConfig struct {
	// Enabled keeps the users' presence, shows it in /sync and exchanges
	// it with other servers. Off, nothing is stored or sent, other
	// servers' m.presence EDUs are ignored, /sync has no presence section
	// and GET /presence/{userId}/status answers "offline" for everyone.
	// Default true.
	Enabled bool `yaml:"enabled"`
}

// OldVerifyKey is a retired signing key's public half and when it stopped
// being used.
type OldVerifyKey struct {
	Key       string `yaml:"key"`        // unpadded base64 ed25519 public key
	ExpiredTS int64  `yaml:"expired_ts"` // milliseconds since the epoch
}

// Duration is a time.Duration written in configuration files as a Go duration
// string ("10s", "1m30s", "24h"). yaml.v3 only does that for time.Duration
// itself; a named type would otherwise be an unreadable count of nanoseconds.
// Convert with time.Duration(d) or d.Duration().
type Duration time.Duration

// Duration returns d as a time.Duration.
func (d Duration) Duration() time.Duration { return time.Duration(d) }

// String formats d like time.Duration does, e.g. "1m30s".
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalYAML writes d as a duration string.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// UnmarshalYAML reads a duration string. Problems are reported as a
// *yaml.TypeError carrying the line number, so that yaml.v3 collects them
// alongside its own errors instead of aborting with a message that has no
// position in it.
func (d *Duration) UnmarshalYAML(node *yaml.Node) error {
	if node.Kind != yaml.ScalarNode {
		return &yaml.TypeError{Errors: []string{
			fmt.Sprintf("line %d: expected a duration such as \"10s\" or \"1m30s\"", node.Line),
		}}
	}
	parsed, err := parseDuration(node.Value)
	if err != nil {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: %v", node.Line, err)}}
	}
	*d = parsed
	return nil
}

// MarshalText writes d as a duration string, for encoders other than YAML.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText reads a duration string. Set relies on it, which keeps
// command-line overrides and the file format in agreement.
func (d *Duration) UnmarshalText(text []byte) error {
	parsed, err := parseDuration(string(text))
	if err != nil {
		return err
	}
	*d = parsed
	return nil
}

func parseDuration(s string) (Duration, error) {
	parsed, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		// time's own message ("missing unit in duration") does not tell
		// the operator what a valid value looks like.
		return 0, fmt.Errorf("invalid duration %q: use a number with a unit, such as \"10s\", \"1m30s\" or \"24h\"", s)
	}
	return Duration(parsed), nil
}

// Default returns a configuration with every setting at its default. The
// result is a fresh value that the caller may modify.
func Default() *Config {
	return &Config{
		ServerName: "localhost:8448",
		DataDir:    "./data",
		Log: LogConfig{
			Level:  "info",
			Format: "text",
		},
		ClientAPI: ClientAPIConfig{
			Listen:                   "127.0.0.1:8008",
			Registration:             "open",
			MaxRequestBytes:          1 << 20,
			BcryptCost:               12,
			MaxOneTimeKeysPerDevice:  500,
			SyncMaxTimeout:           Duration(60 * time.Second),
			RateLimitPerSecond:       50,
			RateLimitBurst:           200,
			ReadTimeout:              Duration(30 * time.Second),
			WriteTimeout:             Duration(60 * time.Second),
			IdleTimeout:              Duration(2 * time.Minute),
			MaxConnectionsPerAddress: 100,
			TrustedProxies:           []string{},
			LoginRateLimit:           RateLimit{PerSecond: 0.003, Burst: 5},
			RegistrationRateLimit:    RateLimit{PerSecond: 0.17, Burst: 6},
			FailedLoginRateLimit:     RateLimit{PerSecond: 0.17, Burst: 3},
			ToDeviceRateLimit:        RateLimit{PerSecond: 10, Burst: 100},
			TURN:                     TURNConfig{URIs: []string{}, UserLifetime: Duration(time.Hour)},
		},
		Federation: FederationConfig{
			Listen:                   "127.0.0.1:8448",
			KeyValidity:              Duration(24 * time.Hour),
			SendWait:                 Duration(10 * time.Second),
			SenderWorkers:            32,
			OldVerifyKeys:            map[string]OldVerifyKey{},
			RateLimitPerSecond:       100,
			RateLimitBurst:           400,
			IPRangeDenylist:          slices.Clone(iprange.NonPublic),
			IPRangeAllowlist:         []string{},
			ReadTimeout:              Duration(30 * time.Second),
			WriteTimeout:             Duration(60 * time.Second),
			IdleTimeout:              Duration(2 * time.Minute),
			MaxConnectionsPerAddress: 100,
		},
		Keys: KeysConfig{
			StrictValidation: true,
		},
		Media: defaultMedia(),
		Push: PushConfig{
			MinBackoff:     Duration(time.Second),
			MaxBackoff:     Duration(time.Hour),
			RequestTimeout: Duration(15 * time.Second),
		},
		Presence: PresenceConfig{Enabled: true},
	}
}

// DefaultYAML returns a complete configuration file with every setting at its
// default and a comment explaining each, suitable as a starting point for
// operators. The slice is a copy and may be modified.
func DefaultYAML() []byte {
	return bytes.Clone(defaultYAML)
}

// Load reads the YAML file at path over Default(), so the file only needs the
// settings that differ. Unknown keys are an error, because a misspelt key
// would otherwise be silently ignored and its default used. An empty file
// gives the defaults. Load does not call Validate.
//
// When the file is well-formed YAML but some values do not fit their
// settings (a wrong type, an unknown key), the error lists them all and
// Load returns the configuration too, with the file's other values, so
// that the caller can go on to validate it and report every problem in one
// message (see Problems). On any other error the configuration is nil.
func Load(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		// The *PathError already names the file.
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()

	c := Default()
	if err := decodeInto(f, c); err != nil {
		err = fmt.Errorf("config: %s: %w", path, err)
		var pe *partialError
		if errors.As(err, &pe) {
			return c, err
		}
		return nil, err
	}
	return c, nil
}

// Problems joins the errors of Load and Validate (nil ones ignored) into
// one error of one line, so that an operator can fix a configuration in
// one pass.
func Problems(errs ...error) error {
	var msgs []string
	for _, err := range errs {
		if err != nil {
			msgs = append(msgs, strings.TrimPrefix(err.Error(), "config: "))
		}
	}
	if len(msgs) == 0 {
		return nil
	}
	return errors.New("config: " + strings.Join(msgs, "; "))
}

// partialError is a decoding error after which the rest of the document
// was still read (yaml.v3 goes on past values that do not fit).
type partialError struct{ msg string }

func (e *partialError) Error() string { return e.msg }

// decodeInto overlays the YAML document read from r onto c.
func decodeInto(r io.Reader, c *Config) error {
	dec := yaml.NewDecoder(r)
	dec.KnownFields(true)
	if err := dec.Decode(c); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // empty file, or only comments
		}
		return tidyYAMLError(err)
	}
	// yaml.v3 reads one document per Decode call, so anything after a
	// "---" would be ignored without this check.
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
		return nil
	case err != nil:
		return tidyYAMLError(err)
	default:
		return fmt.Errorf("line %d: only one YAML document is allowed", extra.Line)
	}
}

var unknownFieldRE = regexp.MustCompile(`^(line \d+): field (.*) not found in type .*$`)

// tidyYAMLError rewrites yaml.v3 errors for operators: one line instead of a
// multi-line list, no "yaml:" prefix (the caller already says which file),
// and unknown keys described as such rather than in terms of Go types.
func tidyYAMLError(err error) error {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs := make([]string, len(te.Errors))
		for i, m := range te.Errors {
			msgs[i] = unknownFieldRE.ReplaceAllString(m, `$1: unknown key "$2"`)
		}
		return &partialError{strings.Join(msgs, "; ")}
	}
	return errors.New(strings.TrimPrefix(err.Error(), "yaml: "))
}

// Validate checks every setting and reports all problems in one error, so an
// operator can fix a configuration in one pass rather than one restart per
// mistake. It returns nil for a usable configuration.
func (c *Config) Validate() error {
	var problems []string
	add := func(format string, args ...any) {
		problems = append(problems, fmt.Sprintf(format, args...))
	}

	if msg := checkServerName(c.ServerName); msg != "" {
		add("%s", msg)
	}
	if c.ClientAPI.TURN.UserLifetime <= 0 {
		add("client_api.turn.user_lifetime must be positive")
	}
	if c.DataDir == "" {
		add("data_dir must not be empty")
	}
	c.validateMedia(add)
	if _, err := databaseKind(c.Database); err != nil {
		add("%v", err)
	}

	if !oneOf(c.Log.Level, "debug", "info", "warn", "error") {
		add(`log.level must be "debug", "info", "warn" or "error", not %q`, c.Log.Level)
	}
	if !oneOf(c.Log.Format, "text", "json") {
		add(`log.format must be "text" or "json", not %q`, c.Log.Format)
	}

	if msg := checkListen("client_api.listen", c.ClientAPI.Listen); msg != "" {
		add("%s", msg)
	}
	if !oneOf(c.ClientAPI.Registration, "open", "closed") {
		add(`client_api.registration must be "open" or "closed", not %q`, c.ClientAPI.Registration)
	}
	if c.ClientAPI.MaxRequestBytes < 1024 {
		add("client_api.max_request_bytes must be at least 1024, not %d", c.ClientAPI.MaxRequestBytes)
	}
	if c.ClientAPI.BcryptCost < bcrypt.MinCost || c.ClientAPI.BcryptCost > bcrypt.MaxCost {
		add("client_api.bcrypt_cost must be between %d and %d, not %d",
			bcrypt.MinCost, bcrypt.MaxCost, c.ClientAPI.BcryptCost)
	}
	if c.ClientAPI.MaxOneTimeKeysPerDevice < 1 {
		add("client_api.max_one_time_keys_per_device must be at least 1, not %d", c.ClientAPI.MaxOneTimeKeysPerDevice)
	}
	if c.ClientAPI.SyncMaxTimeout <= 0 {
		add("client_api.sync_max_timeout must be positive, not %s", c.ClientAPI.SyncMaxTimeout)
	}

	if msg := checkListen("federation.listen", c.Federation.Listen); msg != "" {
		add("%s", msg)
	}
	if (c.Federation.TLSCert == "") != (c.Federation.TLSKey == "") {
		// A configured certificate with a generated key (or the reverse)
		// can never match, so refuse it here rather than at TLS start-up.
		add("federation.tls_cert and federation.tls_key must be set together or both left empty")
	}
	if c.Federation.KeyValidity <= 0 {
		add("federation.key_validity must be positive, not %s", c.Federation.KeyValidity)
	}
	for id, k := range c.Federation.OldVerifyKeys {
		alg, version, _ := strings.Cut(id, ":")
		if alg != "ed25519" || !oldKeyVersion.MatchString(version) {
			add("federation.old_verify_keys: key ID %q must be ed25519:<version of a-z A-Z 0-9 _>", id)
		}
		if b, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(k.Key, "=")); err != nil || len(b) != 32 {
			add("federation.old_verify_keys: %s: key must be a 32-byte base64 ed25519 public key", id)
		}
		if k.ExpiredTS <= 0 {
			add("federation.old_verify_keys: %s: expired_ts must be a time in milliseconds", id)
		}
	}
	for _, rl := range []struct {
		key         string
		rate, burst int
	}{
		{"client_api", c.ClientAPI.RateLimitPerSecond, c.ClientAPI.RateLimitBurst},
		{"federation", c.Federation.RateLimitPerSecond, c.Federation.RateLimitBurst},
	} {
		if rl.rate < 0 {
			add("%s.rate_limit_per_second must be 0 (off) or positive, not %d", rl.key, rl.rate)
		}
		if rl.rate > 0 && rl.burst < 1 {
			add("%s.rate_limit_burst must be at least 1, not %d", rl.key, rl.burst)
		}
	}
	for _, rl := range []struct {
		key string
		RateLimit
	}{
		{"client_api.login_rate_limit", c.ClientAPI.LoginRateLimit},
		{"client_api.registration_rate_limit", c.ClientAPI.RegistrationRateLimit},
		{"client_api.failed_login_rate_limit", c.ClientAPI.FailedLoginRateLimit},
		{"client_api.to_device_rate_limit", c.ClientAPI.ToDeviceRateLimit},
	} {
		if rl.PerSecond < 0 || math.IsNaN(rl.PerSecond) || math.IsInf(rl.PerSecond, 0) {
			add("%s.per_second must be 0 (off) or positive, not %v", rl.key, rl.PerSecond)
		}
		if rl.PerSecond > 0 && rl.Burst < 1 {
			add("%s.burst must be at least 1, not %d", rl.key, rl.Burst)
		}
	}
	if c.ClientAPI.BcryptConcurrency < 0 {
		add("client_api.bcrypt_concurrency must be 0 (automatic) or positive, not %d", c.ClientAPI.BcryptConcurrency)
	}
	if c.Metrics.Listen != "" {
		if msg := checkListen("metrics.listen", c.Metrics.Listen); msg != "" {
			add("%s", msg)
		}
	}
	if c.Push.MinBackoff <= 0 || c.Push.MaxBackoff < c.Push.MinBackoff {
		add("push.min_backoff (%s) must be positive and no longer than push.max_backoff (%s)", c.Push.MinBackoff, c.Push.MaxBackoff)
	}
	if c.Push.RequestTimeout <= 0 {
		add("push.request_timeout must be positive, not %s", c.Push.RequestTimeout)
	}
	if c.Federation.SendWait <= 0 {
		add("federation.send_wait must be positive, not %s", c.Federation.SendWait)
	}
	if c.Federation.SenderWorkers < 1 {
		add("federation.sender_workers must be at least 1, not %d", c.Federation.SenderWorkers)
	}
	for _, l := range []struct {
		key     string
		entries []string
	}{
		{"federation.ip_range_denylist", c.Federation.IPRangeDenylist},
		{"federation.ip_range_allowlist", c.Federation.IPRangeAllowlist},
		{"client_api.trusted_proxies", c.ClientAPI.TrustedProxies},
	} {
		if _, err := iprange.Parse(l.entries); err != nil {
			add("%s: %v", l.key, err)
		}
	}
	for _, l := range []struct {
		key                string
		read, write, idle  Duration
		maxConnsPerAddress int
	}{
		{"client_api", c.ClientAPI.ReadTimeout, c.ClientAPI.WriteTimeout, c.ClientAPI.IdleTimeout, c.ClientAPI.MaxConnectionsPerAddress},
		{"federation", c.Federation.ReadTimeout, c.Federation.WriteTimeout, c.Federation.IdleTimeout, c.Federation.MaxConnectionsPerAddress},
	} {
		for _, d := range []struct {
			name string
			v    Duration
		}{{"read_timeout", l.read}, {"write_timeout", l.write}, {"idle_timeout", l.idle}} {
			if d.v <= 0 {
				add("%s.%s must be positive, not %s", l.key, d.name, d.v)
			}
		}
		if l.maxConnsPerAddress < 0 {
			add("%s.max_connections_per_address must be 0 (off) or positive, not %d", l.key, l.maxConnsPerAddress)
		}
	}
	if c.Federation.SendWait > 0 && c.Federation.WriteTimeout > 0 && c.Federation.WriteTimeout <= c.Federation.SendWait {
		// /send answers after up to send_wait: the answer must still be
		// allowed to go out.
		add("federation.write_timeout (%s) must be longer than federation.send_wait (%s)", c.Federation.WriteTimeout, c.Federation.SendWait)
	}

	if len(problems) == 0 {
		return nil
	}
	return errors.New("config: " + strings.Join(problems, "; "))
}

func oneOf(s string, allowed ...string) bool {
	for _, a := range allowed {
		if s == a {
			return true
		}
	}
	return false
}

// checkServerName applies the Matrix server name grammar: an IPv4 address,
// a bracketed IPv6 address or a DNS name of [A-Za-z0-9.-] (at most 255
// characters), optionally followed by ":" and a port 1-65535. It returns a
// problem description, or "" when the name is valid.
func checkServerName(name string) string {
	invalid := fmt.Sprintf("server_name %q is not a valid Matrix server name", name)
	if name == "" {
		return "server_name must not be empty"
	}
	host, port, ok := spec.ParseAndValidateServerName(spec.ServerName(name))
	if !ok {
		return invalid
	}
	// The library accepts port 0 and does not enforce the stricter parts of
	// the grammar, so check those here.
	if port == 0 {
		return invalid + " (port must be 1-65535)"
	}
	if strings.HasPrefix(host, "[") {
		if !strings.Contains(host, ":") {
			return invalid + " (only IPv6 addresses go in brackets)"
		}
	} else if len(host) > 255 {
		return invalid + " (host name longer than 255 characters)"
	}
	return ""
}

// checkListen reports whether addr is a host:port with a numeric port. The
// host may be empty (all interfaces) and port 0 is allowed (any free port),
// which tests rely on. It returns a problem description or "".
func checkListen(key, addr string) string {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Sprintf("%s %q is not a host:port address", key, addr)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Sprintf("%s %q must have a numeric port 0-65535", key, addr)
	}
	return ""
}

// schemeRE matches a URI scheme followed by ":". Single letters are excluded
// so that Windows drive letters ("C:\...") count as plain paths.
var schemeRE = regexp.MustCompile(`^([A-Za-z][A-Za-z0-9+.-]+):`)

type dbKind int

const (
	dbSQLite dbKind = iota
	dbPostgres
)

// databaseKind classifies a database setting. The prefixes are matched
// case-sensitively because that is what the SQLite and PostgreSQL drivers
// do; anything else that looks like a URI is refused, since treating
// "mysql://..." as a SQLite file name would silently create a stray file.
func databaseKind(db string) (dbKind, error) {
	switch {
	case db == "", strings.HasPrefix(db, "file:"):
		return dbSQLite, nil
	case strings.HasPrefix(db, "postgres://"), strings.HasPrefix(db, "postgresql://"):
		if _, err := url.Parse(db); err != nil {
			// Avoid echoing the URL: it may contain a password.
			return dbPostgres, errors.New("database is not a valid PostgreSQL URL")
		}
		return dbPostgres, nil
	}
	if m := schemeRE.FindStringSubmatch(db); m != nil {
		return dbSQLite, fmt.Errorf(`database has unrecognised scheme %q: use a SQLite path, a "file:" URI or a "postgres://" URL`, m[1])
	}
	return dbSQLite, nil
}

// DatabaseURI returns the effective database: the configured value, or
// "file:<data_dir>/keyserver.db" when none is configured.
func (c *Config) DatabaseURI() string {
	if c.Database == "" {
		return "file:" + filepath.Join(c.DataDir, "keyserver.db")
	}
	return c.Database
}

// IsPostgres reports whether the database is PostgreSQL rather than SQLite.
func (c *Config) IsPostgres() bool {
	kind, _ := databaseKind(c.Database)
	return kind == dbPostgres
}

// SigningKeyFile returns the effective signing key path.
func (c *Config) SigningKeyFile() string {
	if c.SigningKeyPath != "" {
		return c.SigningKeyPath
	}
	return filepath.Join(c.DataDir, "signing.key")
}

// TLSCertFile returns the effective federation TLS certificate path.
func (c *Config) TLSCertFile() string {
	if c.Federation.TLSCert != "" {
		return c.Federation.TLSCert
	}
	return filepath.Join(c.DataDir, "tls.crt")
}

// TLSKeyFile returns the effective federation TLS private key path.
func (c *Config) TLSKeyFile() string {
	if c.Federation.TLSKey != "" {
		return c.Federation.TLSKey
	}
	return filepath.Join(c.DataDir, "tls.key")
}

// GeneratedTLS reports whether no TLS certificate is configured, in which
// case the daemon generates a self-signed pair at TLSCertFile and TLSKeyFile.
func (c *Config) GeneratedTLS() bool {
	return c.Federation.TLSCert == "" && c.Federation.TLSKey == ""
}

// Set sets one setting, named by its dotted YAML key (for example
// "client_api.bcrypt_cost"), from its string form. It is meant for
// command-line and environment overrides. Booleans use strconv.ParseBool,
// durations the same syntax as the file, and lists are comma-separated. Set does not call Validate.
//
// Keys are found by reflection over the yaml tags, so a new setting is
// settable as soon as it is added to the structs.
func (c *Config) Set(key, value string) error {
	v := reflect.ValueOf(c).Elem()
	parts := strings.Split(key, ".")
	for i, part := range parts {
		field, ok := fieldByYAMLName(v, part)
		if !ok {
			return fmt.Errorf("config: unknown key %q", key)
		}
		v = field
		if isSection(v.Type()) != (i < len(parts)-1) {
			if i < len(parts)-1 {
				return fmt.Errorf("config: unknown key %q", key)
			}
			return fmt.Errorf("config: %q is a section, not a key; set one of its keys, such as %q", key, key+"."+firstKey(v.Type()))
		}
	}
	if err := setFromString(v, value); err != nil {
		return fmt.Errorf("config: %s: %w", key, err)
	}
	return nil
}

// Keys returns every dotted key that Set accepts, sorted, for help output.
func Keys() []string {
	var keys []string
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for i := 0; i < t.NumField(); i++ {
			name, ok := yamlName(t.Field(i))
			if !ok {
				continue
			}
			if ft := t.Field(i).Type; isSection(ft) {
				walk(ft, prefix+name+".")
			} else if ft.Kind() == reflect.Map || (ft.Kind() == reflect.Slice && ft.Elem().Kind() != reflect.String) {
				continue // structured settings live only in the file
			} else {
				keys = append(keys, prefix+name)
			}
		}
	}
	walk(reflect.TypeOf(Config{}), "")
	sort.Strings(keys)
	return keys
}

var oldKeyVersion = regexp.MustCompile(`^[a-zA-Z0-9_]+$`)

var textUnmarshalerType = reflect.TypeOf((*encoding.TextUnmarshaler)(nil)).Elem()

// isSection reports whether values of type t are YAML mappings of further
// keys rather than single values.
func isSection(t reflect.Type) bool {
	return t.Kind() == reflect.Struct && !reflect.PointerTo(t).Implements(textUnmarshalerType)
}

// yamlName returns the key yaml.v3 uses for a struct field, following its
// rules: the tag name if given, otherwise the lower-cased field name; "-"
// and unexported fields are not keys.
func yamlName(f reflect.StructField) (string, bool) {
	if !f.IsExported() {
		return "", false
	}
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	switch name {
	case "-":
		return "", false
	case "":
		return strings.ToLower(f.Name), true
	}
	return name, true
}

func fieldByYAMLName(v reflect.Value, name string) (reflect.Value, bool) {
	if v.Kind() != reflect.Struct {
		return reflect.Value{}, false
	}
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		if n, ok := yamlName(t.Field(i)); ok && n == name {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}

// firstKey names the first key of a section, for error hints.
func firstKey(t reflect.Type) string {
	for i := 0; i < t.NumField(); i++ {
		if n, ok := yamlName(t.Field(i)); ok {
			return n
		}
	}
	return ""
}

// setFromString parses s according to v's type and stores it in v.
func setFromString(v reflect.Value, s string) error {
	// Types with their own text form (Duration) come first: their Kind
	// alone (int64) would give the wrong syntax.
	if u, ok := v.Addr().Interface().(encoding.TextUnmarshaler); ok {
		return u.UnmarshalText([]byte(s))
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(s)
	case reflect.Slice:
		if v.Type().Elem().Kind() != reflect.String {
			return fmt.Errorf("settings of type %s cannot be set from a string", v.Type())
		}
		// A comma-separated list; an empty value is the empty list.
		list := []string{}
		for _, e := range strings.Split(s, ",") {
			if e = strings.TrimSpace(e); e != "" {
				list = append(list, e)
			}
		}
		v.Set(reflect.ValueOf(list))
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("%q is not a boolean (use true or false)", s)
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(s, 10, v.Type().Bits())
		if err != nil {
			return fmt.Errorf("%q is not an integer in range", s)
		}
		v.SetInt(n)
	case reflect.Float32, reflect.Float64:
		f, err := strconv.ParseFloat(s, v.Type().Bits())
		if err != nil {
			return fmt.Errorf("%q is not a number", s)
		}
		v.SetFloat(f)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, err := strconv.ParseUint(s, 10, v.Type().Bits())
		if err != nil {
			return fmt.Errorf("%q is not a non-negative integer in range", s)
		}
		v.SetUint(n)
	default:
		// Only reachable if a field of a new kind is added to Config.
		return fmt.Errorf("settings of type %s cannot be set from a string", v.Type())
	}
	return nil
}
