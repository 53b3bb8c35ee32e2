package config

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// writeFile writes content to a file in a fresh temporary directory and
// returns its path.
func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keyserver.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestDefaultValidates(t *testing.T) {
	if err := Default().Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
}

func TestDefaultYAMLMatchesDefault(t *testing.T) {
	got, err := Load(writeFile(t, string(DefaultYAML())))
	if err != nil {
		t.Fatalf("Load(default.yaml): %v", err)
	}
	if want := Default(); !reflect.DeepEqual(got, want) {
		t.Errorf("default.yaml and Default() differ:\n file: %+v\n code: %+v", got, want)
	}
}

// TestDefaultYAMLIsComplete checks that default.yaml spells out every key
// with a comment. Equality with Default() alone would not catch a key that
// is missing from the file, since Load fills it in from Default().
func TestDefaultYAMLIsComplete(t *testing.T) {
	var doc yaml.Node
	if err := yaml.Unmarshal(DefaultYAML(), &doc); err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	var walk func(m *yaml.Node, prefix string)
	walk = func(m *yaml.Node, prefix string) {
		for i := 0; i+1 < len(m.Content); i += 2 {
			k, v := m.Content[i], m.Content[i+1]
			key := prefix + k.Value
			if v.Kind == yaml.MappingNode {
				walk(v, key+".")
				continue
			}
			found[key] = true
			if k.HeadComment == "" && k.LineComment == "" && v.LineComment == "" {
				t.Errorf("default.yaml: key %s (line %d) has no comment", key, k.Line)
			}
		}
	}
	walk(doc.Content[0], "")

	for _, key := range Keys() {
		if !found[key] {
			t.Errorf("default.yaml lacks key %s", key)
		}
	}
	if len(found) != len(Keys()) {
		t.Errorf("default.yaml has %d keys, Keys() has %d", len(found), len(Keys()))
	}
}

func TestDefaultYAMLReturnsCopy(t *testing.T) {
	b := DefaultYAML()
	b[0] = 'X'
	if DefaultYAML()[0] == 'X' {
		t.Error("modifying the result of DefaultYAML changed the embedded file")
	}
}

func TestLoad(t *testing.T) {
	tests := []struct {
		name    string
		content string
		check   func(t *testing.T, c *Config)
		wantErr []string // substrings of the error; nil means success
	}{
		{
			name:    "empty file gives defaults",
			content: "",
			check: func(t *testing.T, c *Config) {
				if !reflect.DeepEqual(c, Default()) {
					t.Errorf("got %+v, want defaults", c)
				}
			},
		},
		{
			name:    "comments only gives defaults",
			content: "# nothing here\n",
			check: func(t *testing.T, c *Config) {
				if !reflect.DeepEqual(c, Default()) {
					t.Errorf("got %+v, want defaults", c)
				}
			},
		},
		{
			name: "partial file keeps other defaults",
			content: "server_name: example.org\n" +
				"log:\n  level: debug\n" +
				"federation:\n  send_wait: 1m30s\n  allow_device_names: true\n",
			check: func(t *testing.T, c *Config) {
				want := Default()
				want.ServerName = "example.org"
				want.Log.Level = "debug"
				want.Federation.SendWait = Duration(90 * time.Second)
				want.Federation.AllowDeviceNames = true
				if !reflect.DeepEqual(c, want) {
					t.Errorf("got  %+v\nwant %+v", c, want)
				}
			},
		},
		{
			name:    "unknown top-level key",
			content: "server_name: example.org\nservername: typo\n",
			wantErr: []string{"keyserver.yaml", "line 2", `unknown key "servername"`},
		},
		{
			name:    "unknown nested key",
			content: "log:\n  level: info\n  levle: debug\n",
			wantErr: []string{"keyserver.yaml", "line 3", `unknown key "levle"`},
		},
		{
			name:    "duration without unit",
			content: "client_api:\n  sync_max_timeout: 30\n",
			wantErr: []string{"line 2", `invalid duration "30"`},
		},
		{
			name:    "wrong type",
			content: "client_api:\n  bcrypt_cost: lots\n",
			wantErr: []string{"line 2", "lots"},
		},
		{
			name:    "syntax error",
			content: "server_name: [unclosed\n",
			wantErr: []string{"keyserver.yaml", "line"},
		},
		{
			name:    "second document",
			content: "server_name: a.org\n---\nserver_name: b.org\n",
			wantErr: []string{"only one YAML document"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Load(writeFile(t, tt.content))
			if tt.wantErr != nil {
				if err == nil {
					t.Fatalf("Load succeeded, want error containing %q", tt.wantErr)
				}
				for _, want := range tt.wantErr {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not contain %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			tt.check(t, c)
		})
	}
}

// A value of the wrong type is reported together with the problems of the
// other settings, so that one pass fixes the file.
func TestLoadTypeErrorWithOtherProblems(t *testing.T) {
	c, err := Load(writeFile(t, "server_name: \"not a name\"\nclient_api:\n  bcrypt_cost: \"abc\"\n  registration: sometimes\n"))
	if err == nil {
		t.Fatal("Load accepted a bcrypt_cost of \"abc\"")
	}
	if c == nil {
		t.Fatalf("Load returned no configuration with a type error: %v", err)
	}
	all := Problems(err, c.Validate())
	for _, want := range []string{"keyserver.yaml", "line 3", "abc", "server_name", "registration"} {
		if !strings.Contains(all.Error(), want) {
			t.Errorf("error %q does not mention %q", all, want)
		}
	}
	if strings.Count(all.Error(), "config: ") != 1 || strings.Contains(all.Error(), "\n") {
		t.Errorf("not one message of one line: %q", all)
	}
	// A file that is not YAML at all gives no configuration.
	if c, err := Load(writeFile(t, "server_name: [unclosed\n")); c != nil || err == nil {
		t.Errorf("syntax error: got %v, %v", c, err)
	}
	if Problems(nil, nil) != nil {
		t.Error("Problems of nothing is an error")
	}
}

func TestLoadMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "absent.yaml")
	_, err := Load(path)
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Load(missing) = %v, want an error naming %s", err, path)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		modify  func(c *Config)
		wantErr []string // nil means valid
	}{
		{name: "hostname", modify: func(c *Config) { c.ServerName = "example.org" }},
		{name: "hostname with port", modify: func(c *Config) { c.ServerName = "matrix.example.org:443" }},
		{name: "IPv4", modify: func(c *Config) { c.ServerName = "192.0.2.1:8448" }},
		{name: "IPv6", modify: func(c *Config) { c.ServerName = "[2001:db8::1]:8448" }},
		{name: "IPv6 without port", modify: func(c *Config) { c.ServerName = "[::1]" }},
		{name: "postgres", modify: func(c *Config) { c.Database = "postgres://u:p@db/keys?sslmode=disable" }},
		{name: "sqlite path", modify: func(c *Config) { c.Database = "/var/lib/keyserver/keys.db" }},
		{name: "sqlite URI", modify: func(c *Config) { c.Database = "file:keys.db?_journal=WAL" }},
		{name: "any port listen", modify: func(c *Config) { c.ClientAPI.Listen = ":0" }},
		{name: "both TLS files", modify: func(c *Config) {
			c.Federation.TLSCert, c.Federation.TLSKey = "/etc/ks/tls.crt", "/etc/ks/tls.key"
		}},
		{
			name:    "server name with space",
			modify:  func(c *Config) { c.ServerName = "Bad Name!" },
			wantErr: []string{`server_name "Bad Name!" is not a valid Matrix server name`},
		},
		{
			name:    "server name port 0",
			modify:  func(c *Config) { c.ServerName = "example.org:0" },
			wantErr: []string{`server_name "example.org:0"`},
		},
		{
			name:    "server name port too big",
			modify:  func(c *Config) { c.ServerName = "example.org:65536" },
			wantErr: []string{`server_name "example.org:65536"`},
		},
		{
			name:    "server name unbracketed IPv6",
			modify:  func(c *Config) { c.ServerName = "2001:db8::1" },
			wantErr: []string{`server_name "2001:db8::1"`},
		},
		{
			name:    "server name bracketed IPv4",
			modify:  func(c *Config) { c.ServerName = "[192.0.2.1]" },
			wantErr: []string{`server_name "[192.0.2.1]"`},
		},
		{name: "allowlist", modify: func(c *Config) { c.Federation.IPRangeAllowlist = []string{"127.0.0.0/8", "::1"} }},
		{
			name: "bad IP ranges",
			modify: func(c *Config) {
				c.Federation.IPRangeDenylist = []string{"10.0.0.0/8", "10.0.0.0/40"}
				c.Federation.IPRangeAllowlist = []string{"localhost"}
			},
			wantErr: []string{`federation.ip_range_denylist: not an IP address or CIDR range: "10.0.0.0/40"`,
				`federation.ip_range_allowlist: not an IP address or CIDR range: "localhost"`},
		},
		{name: "no connection cap", modify: func(c *Config) { c.ClientAPI.MaxConnectionsPerAddress = 0 }},
		{
			name: "bad timeouts",
			modify: func(c *Config) {
				c.ClientAPI.ReadTimeout = 0
				c.Federation.IdleTimeout = -1
				c.Federation.MaxConnectionsPerAddress = -1
				c.ClientAPI.TrustedProxies = []string{"proxy.local"}
			},
			wantErr: []string{"client_api.read_timeout must be positive, not 0s", "federation.idle_timeout must be positive",
				"federation.max_connections_per_address must be 0 (off) or positive, not -1",
				`client_api.trusted_proxies: not an IP address or CIDR range: "proxy.local"`},
		},
		{
			name:    "federation write timeout within send_wait",
			modify:  func(c *Config) { c.Federation.WriteTimeout = Duration(10 * time.Second) },
			wantErr: []string{"federation.write_timeout (10s) must be longer than federation.send_wait (10s)"},
		},
		{
			name:    "empty server name",
			modify:  func(c *Config) { c.ServerName = "" },
			wantErr: []string{"server_name must not be empty"},
		},
		{
			name:    "unknown database scheme",
			modify:  func(c *Config) { c.Database = "mysql://db/keys" },
			wantErr: []string{`unrecognised scheme "mysql"`},
		},
		{
			name:    "only TLS cert",
			modify:  func(c *Config) { c.Federation.TLSCert = "/etc/ks/tls.crt" },
			wantErr: []string{"tls_cert and federation.tls_key must be set together"},
		},
		{
			name:    "only TLS key",
			modify:  func(c *Config) { c.Federation.TLSKey = "/etc/ks/tls.key" },
			wantErr: []string{"tls_cert and federation.tls_key must be set together"},
		},
		{
			name: "many problems at once",
			modify: func(c *Config) {
				c.ServerName = "Bad Name!"
				c.DataDir = ""
				c.Log.Level = "verbose"
				c.Log.Format = "xml"
				c.ClientAPI.Listen = "localhost"
				c.ClientAPI.Registration = "maybe"
				c.ClientAPI.MaxRequestBytes = 100
				c.ClientAPI.BcryptCost = 32
				c.ClientAPI.MaxOneTimeKeysPerDevice = 0
				c.ClientAPI.SyncMaxTimeout = 0
				c.Federation.Listen = "127.0.0.1:https"
				c.Federation.KeyValidity = Duration(-time.Hour)
				c.Federation.SendWait = 0
				c.Federation.SenderWorkers = 0
			},
			wantErr: []string{
				`config: server_name "Bad Name!" is not a valid Matrix server name; `,
				"data_dir must not be empty",
				`log.level must be "debug", "info", "warn" or "error", not "verbose"`,
				`log.format must be "text" or "json", not "xml"`,
				`client_api.listen "localhost" is not a host:port address`,
				`client_api.registration must be "open" or "closed", not "maybe"`,
				"client_api.max_request_bytes must be at least 1024, not 100",
				"client_api.bcrypt_cost must be between 4 and 31, not 32",
				"client_api.max_one_time_keys_per_device must be at least 1, not 0",
				"client_api.sync_max_timeout must be positive, not 0s",
				`federation.listen "127.0.0.1:https" must have a numeric port`,
				"federation.key_validity must be positive, not -1h0m0s",
				"federation.send_wait must be positive, not 0s",
				"federation.sender_workers must be at least 1, not 0",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.modify(c)
			err := c.Validate()
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want error containing %q", tt.wantErr)
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

func TestValidateHidesPostgresPassword(t *testing.T) {
	c := Default()
	c.Database = "postgres://user:s3cret@db/%zz"
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate accepted a malformed URL")
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error %q reveals the password", err)
	}
}

func TestSet(t *testing.T) {
	tests := []struct {
		key, value string
		check      func(c *Config) bool
		wantErr    string // substring; "" means success
	}{
		{key: "server_name", value: "example.org", check: func(c *Config) bool { return c.ServerName == "example.org" }},
		{key: "client_api.listen", value: ":9000", check: func(c *Config) bool { return c.ClientAPI.Listen == ":9000" }},
		{key: "log.format", value: "json", check: func(c *Config) bool { return c.Log.Format == "json" }},
		{key: "federation.tls_insecure_skip_verify", value: "true", check: func(c *Config) bool { return c.Federation.TLSInsecureSkipVerify }},
		{key: "federation.allow_device_names", value: "1", check: func(c *Config) bool { return c.Federation.AllowDeviceNames }},
		{key: "client_api.bcrypt_cost", value: "10", check: func(c *Config) bool { return c.ClientAPI.BcryptCost == 10 }},
		{key: "client_api.max_request_bytes", value: "4194304", check: func(c *Config) bool { return c.ClientAPI.MaxRequestBytes == 4<<20 }},
		{key: "federation.sender_workers", value: "4", check: func(c *Config) bool { return c.Federation.SenderWorkers == 4 }},
		{key: "federation.send_wait", value: "1m30s", check: func(c *Config) bool { return c.Federation.SendWait == Duration(90*time.Second) }},
		{key: "client_api.sync_max_timeout", value: "2m", check: func(c *Config) bool { return c.ClientAPI.SyncMaxTimeout.Duration() == 2*time.Minute }},
		{key: "federation.ip_range_allowlist", value: "127.0.0.0/8, ::1,", check: func(c *Config) bool {
			return reflect.DeepEqual(c.Federation.IPRangeAllowlist, []string{"127.0.0.0/8", "::1"})
		}},
		{key: "federation.ip_range_denylist", value: "", check: func(c *Config) bool {
			return c.Federation.IPRangeDenylist != nil && len(c.Federation.IPRangeDenylist) == 0
		}},

		{key: "federation.tls_insecure_skip_verify", value: "perhaps", wantErr: `federation.tls_insecure_skip_verify: "perhaps" is not a boolean`},
		{key: "client_api.bcrypt_cost", value: "twelve", wantErr: `client_api.bcrypt_cost: "twelve" is not an integer`},
		{key: "client_api.bcrypt_cost", value: "99999999999999999999", wantErr: "not an integer in range"},
		{key: "federation.send_wait", value: "10", wantErr: `federation.send_wait: invalid duration "10"`},
		{key: "no_such_key", value: "x", wantErr: `unknown key "no_such_key"`},
		{key: "log.no_such_key", value: "x", wantErr: `unknown key "log.no_such_key"`},
		{key: "server_name.extra", value: "x", wantErr: `unknown key "server_name.extra"`},
		{key: "", value: "x", wantErr: `unknown key ""`},
		{key: "log", value: "x", wantErr: `"log" is a section`},
	}
	for _, tt := range tests {
		t.Run(tt.key+"="+tt.value, func(t *testing.T) {
			c := Default()
			err := c.Set(tt.key, tt.value)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Set = %v, want error containing %q", err, tt.wantErr)
				}
				if !reflect.DeepEqual(c, Default()) {
					t.Errorf("failed Set changed the configuration: %+v", c)
				}
				return
			}
			if err != nil {
				t.Fatalf("Set: %v", err)
			}
			if !tt.check(c) {
				t.Errorf("after Set(%q, %q) config is %+v", tt.key, tt.value, c)
			}
		})
	}
}

func TestKeys(t *testing.T) {
	keys := Keys()
	if !sort.StringsAreSorted(keys) {
		t.Errorf("Keys() not sorted: %q", keys)
	}
	for _, want := range []string{
		"server_name", "data_dir", "database", "admin_token", "signing_key_path",
		"log.level", "log.format",
		"client_api.listen", "client_api.registration", "client_api.max_request_bytes",
		"client_api.bcrypt_cost", "client_api.max_one_time_keys_per_device", "client_api.sync_max_timeout",
		"federation.listen", "federation.tls_cert", "federation.tls_key",
		"federation.tls_insecure_skip_verify", "federation.allow_device_names",
		"federation.key_validity", "federation.send_wait", "federation.sender_workers",
		"metrics.listen", "metrics.pprof",
		"client_api.rate_limit_per_second", "client_api.rate_limit_burst",
		"federation.rate_limit_per_second", "federation.rate_limit_burst",
		"keys.strict_validation",
		"federation.ip_range_denylist", "federation.ip_range_allowlist",
		"client_api.read_timeout", "client_api.write_timeout", "client_api.idle_timeout",
		"client_api.max_connections_per_address", "client_api.trusted_proxies",
		"federation.read_timeout", "federation.write_timeout", "federation.idle_timeout",
		"federation.max_connections_per_address",
		"client_api.login_rate_limit.per_second", "client_api.login_rate_limit.burst",
		"client_api.registration_rate_limit.per_second", "client_api.registration_rate_limit.burst",
		"client_api.failed_login_rate_limit.per_second", "client_api.failed_login_rate_limit.burst",
		"client_api.to_device_rate_limit.per_second", "client_api.to_device_rate_limit.burst",
		"client_api.bcrypt_concurrency",
		"client_api.user_directory.search_all_users", "client_api.turn.uris", "client_api.turn.shared_secret",
		"client_api.turn.username", "client_api.turn.password", "client_api.turn.user_lifetime",
		"media.path", "media.max_upload_size", "media.upload_rate_limit.per_second", "media.upload_rate_limit.burst",
		"media.max_pending_uploads", "media.unused_expiration_time", "media.enable_authenticated_media",
		"media.max_image_pixels", "media.url_preview_enabled", "media.url_preview_max_size",
		"push.min_backoff", "push.max_backoff", "push.request_timeout",
		"presence.enabled",
	} {
		if i := sort.SearchStrings(keys, want); i == len(keys) || keys[i] != want {
			t.Errorf("Keys() lacks %q", want)
		}
	}
	if len(keys) != 68 {
		t.Errorf("Keys() has %d keys, want 68: %q", len(keys), keys)
	}
	// Every listed key must be accepted by Set; a string that is valid
	// for every kind is not possible, so only check the key is known.
	for _, key := range keys {
		if err := Default().Set(key, ""); err != nil && strings.Contains(err.Error(), "unknown key") {
			t.Errorf("Set rejects listed key %q: %v", key, err)
		}
	}
}

func TestDatabase(t *testing.T) {
	tests := []struct {
		dataDir, database string
		wantURI           string
		wantPostgres      bool
	}{
		{"./data", "", "file:data/keyserver.db", false},
		{"/var/lib/ks", "", "file:/var/lib/ks/keyserver.db", false},
		{"/var/lib/ks", "/srv/keys.db", "/srv/keys.db", false},
		{"/var/lib/ks", "file:/srv/keys.db?cache=shared", "file:/srv/keys.db?cache=shared", false},
		{"/var/lib/ks", "postgres://u:p@db/keys", "postgres://u:p@db/keys", true},
		{"/var/lib/ks", "postgresql:///keys?host=/run/postgresql", "postgresql:///keys?host=/run/postgresql", true},
	}
	for _, tt := range tests {
		c := Default()
		c.DataDir, c.Database = tt.dataDir, tt.database
		if got := c.DatabaseURI(); got != tt.wantURI {
			t.Errorf("DatabaseURI() with data_dir %q, database %q = %q, want %q", tt.dataDir, tt.database, got, tt.wantURI)
		}
		if got := c.IsPostgres(); got != tt.wantPostgres {
			t.Errorf("IsPostgres() with database %q = %v, want %v", tt.database, got, tt.wantPostgres)
		}
	}
}

func TestFilePaths(t *testing.T) {
	c := Default()
	c.DataDir = "/var/lib/ks"
	if got, want := c.SigningKeyFile(), "/var/lib/ks/signing.key"; got != want {
		t.Errorf("SigningKeyFile() = %q, want %q", got, want)
	}
	if got, want := c.TLSCertFile(), "/var/lib/ks/tls.crt"; got != want {
		t.Errorf("TLSCertFile() = %q, want %q", got, want)
	}
	if got, want := c.TLSKeyFile(), "/var/lib/ks/tls.key"; got != want {
		t.Errorf("TLSKeyFile() = %q, want %q", got, want)
	}
	if !c.GeneratedTLS() {
		t.Error("GeneratedTLS() = false with no TLS files configured")
	}

	c.SigningKeyPath = "/etc/ks/signing.key"
	c.Federation.TLSCert, c.Federation.TLSKey = "/etc/ks/cert.pem", "/etc/ks/key.pem"
	if got, want := c.SigningKeyFile(), "/etc/ks/signing.key"; got != want {
		t.Errorf("SigningKeyFile() = %q, want %q", got, want)
	}
	if got, want := c.TLSCertFile(), "/etc/ks/cert.pem"; got != want {
		t.Errorf("TLSCertFile() = %q, want %q", got, want)
	}
	if got, want := c.TLSKeyFile(), "/etc/ks/key.pem"; got != want {
		t.Errorf("TLSKeyFile() = %q, want %q", got, want)
	}
	if c.GeneratedTLS() {
		t.Error("GeneratedTLS() = true with TLS files configured")
	}
}

func TestDurationYAML(t *testing.T) {
	out, err := yaml.Marshal(struct {
		D Duration `yaml:"d"`
	}{Duration(90 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(out), "d: 1m30s\n"; got != want {
		t.Errorf("Marshal = %q, want %q", got, want)
	}
}

func TestOldVerifyKeys(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k.yaml")
	good := "federation:\n  old_verify_keys:\n    \"ed25519:a_old\": {key: \"XGX0JRS2Af3be3knz2fBiRbApjm2Dh61gXDJA8kcJNI\", expired_ts: 1700000000000}\n"
	if err := os.WriteFile(path, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("valid old key refused: %v", err)
	}
	if k := c.Federation.OldVerifyKeys["ed25519:a_old"]; k.ExpiredTS != 1700000000000 {
		t.Fatalf("parsed %+v", c.Federation.OldVerifyKeys)
	}
	c.Federation.OldVerifyKeys = map[string]OldVerifyKey{"rsa:x": {Key: "AAAA", ExpiredTS: 0}}
	err = c.Validate()
	for _, want := range []string{"key ID", "32-byte", "expired_ts"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("bad old key: %v, want a mention of %q", err, want)
		}
	}
	for _, k := range Keys() {
		if strings.Contains(k, "old_verify_keys") {
			t.Errorf("structured setting %q offered as a flag", k)
		}
	}
}

func TestAccountRateLimitSettings(t *testing.T) {
	c := Default()
	if err := c.Set("client_api.login_rate_limit.per_second", "0.5"); err != nil {
		t.Fatal(err)
	}
	if c.ClientAPI.LoginRateLimit.PerSecond != 0.5 {
		t.Errorf("per_second %v, want 0.5", c.ClientAPI.LoginRateLimit.PerSecond)
	}
	if err := c.Set("client_api.login_rate_limit.per_second", "fast"); err == nil {
		t.Error("a rate that is not a number was accepted")
	}
	c.ClientAPI.RegistrationRateLimit = RateLimit{PerSecond: -1, Burst: 1}
	c.ClientAPI.FailedLoginRateLimit = RateLimit{PerSecond: 1, Burst: 0}
	c.ClientAPI.BcryptConcurrency = -1
	err := c.Validate()
	for _, want := range []string{"client_api.registration_rate_limit.per_second", "client_api.failed_login_rate_limit.burst",
		"client_api.bcrypt_concurrency"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want a problem with %s", err, want)
		}
	}
	// 0 turns a limit off, whatever the burst.
	c = Default()
	c.ClientAPI.LoginRateLimit = RateLimit{}
	if err := c.Validate(); err != nil {
		t.Errorf("a limit turned off: %v", err)
	}
}
