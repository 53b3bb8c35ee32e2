package daemon_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/daemon"
	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
)

func testConfig(t *testing.T, db testutil.Database) *config.Config {
	cfg := config.Default()
	cfg.DataDir = filepath.Join(t.TempDir(), "data")
	cfg.Database = db.URI
	cfg.ClientAPI.Listen = "127.0.0.1:0"
	cfg.Federation.Listen = "127.0.0.1:0"
	cfg.ClientAPI.BcryptCost = 4
	return cfg
}

func quietLogger() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

func post(t *testing.T, url string, body any) map[string]any {
	t.Helper()
	js, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(js))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	if resp.StatusCode != 200 {
		t.Fatalf("POST %s: %d %v", url, resp.StatusCode, out)
	}
	return out
}

func serverKey(t *testing.T, d *daemon.Daemon) map[string]any {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := c.Get("https://" + d.FederationAddr() + "/_matrix/key/v2/server")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out["verify_keys"].(map[string]any)
}

// A first start creates the identity files; a restart reuses them and the
// data; shutdown answers a waiting /sync and closes cleanly.
func TestStartRestartShutdown(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		cfg := testConfig(t, db)
		d, err := daemon.Start(ctx, cfg, quietLogger())
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"signing.key", "tls.crt", "tls.key"} {
			if _, err := os.Stat(filepath.Join(cfg.DataDir, f)); err != nil {
				t.Fatalf("%s not created: %v", f, err)
			}
		}
		keys := serverKey(t, d)
		base := "http://" + d.ClientAddr() + "/_matrix/client/v3"
		reg := post(t, base+"/register", map[string]any{"username": "alice", "password": "pw", "auth": map[string]string{"type": "m.login.dummy"}})
		token := reg["access_token"].(string)

		// A sync waiting for news is answered when the daemon stops. One
		// that returns first (news came: the user's own presence, a
		// background write) is asked again from where it ended.
		type answer struct {
			code int
			next string
		}
		longPoll := func(since string) chan answer {
			done := make(chan answer, 1)
			go func() {
				req, _ := http.NewRequest("GET", base+"/sync?timeout=60000&since="+since, nil)
				req.Header.Set("Authorization", "Bearer "+token)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					done <- answer{code: -1}
					return
				}
				defer resp.Body.Close()
				var body struct {
					NextBatch string `json:"next_batch"`
				}
				_ = json.NewDecoder(resp.Body).Decode(&body)
				done <- answer{code: resp.StatusCode, next: body.NextBatch}
			}()
			return done
		}
		since := "s1"
		done := longPoll(since)
		deadline := time.Now().Add(30 * time.Second)
		for d.Server().Sync.WaitingSyncs() == 0 {
			select {
			case a := <-done:
				if a.code != 200 || a.next == "" {
					t.Fatalf("sync answered %d", a.code)
				}
				since = a.next
				done = longPoll(since)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatal("sync never waited")
			}
			time.Sleep(time.Millisecond)
		}
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := d.Shutdown(sctx); err != nil {
			t.Fatalf("shutdown: %v", err)
		}
		if a := <-done; a.code != 200 {
			t.Fatalf("waiting sync ended with %d", a.code)
		}

		d, err = daemon.Start(ctx, cfg, quietLogger())
		if err != nil {
			t.Fatal(err)
		}
		defer d.Shutdown(context.Background())
		again := serverKey(t, d)
		for id := range keys {
			if again[id] == nil {
				t.Fatalf("signing key changed across restart: %v then %v", keys, again)
			}
		}
		base = "http://" + d.ClientAddr() + "/_matrix/client/v3"
		post(t, base+"/login", map[string]any{"type": "m.login.password", "identifier": map[string]string{"type": "m.id.user", "user": "alice"}, "password": "pw"})
	})
}

func TestStartRejectsBadConfig(t *testing.T) {
	cfg := testConfig(t, testutil.SQLite(t))
	cfg.ClientAPI.Registration = "sometimes"
	if _, err := daemon.Start(context.Background(), cfg, quietLogger()); err == nil {
		t.Fatal("started with a bad configuration")
	}
	cfg = testConfig(t, testutil.SQLite(t))
	cfg.Database = "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=2"
	if _, err := daemon.Start(context.Background(), cfg, quietLogger()); err == nil {
		t.Fatal("started without a database")
	}
	// The failed start left no identity files behind.
	for _, f := range []string{"signing.key", "tls.crt", "tls.key"} {
		if _, err := os.Stat(filepath.Join(cfg.DataDir, f)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after a start without a database: %v", f, err)
		}
	}
}

// Metrics are served on their own listener, with request latencies under
// route templates and the key counters.
func TestMetrics(t *testing.T) {
	cfg := testConfig(t, testutil.SQLite(t))
	cfg.Metrics.Listen = "127.0.0.1:0"
	cfg.Metrics.PProf = true
	d, err := daemon.Start(context.Background(), cfg, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Shutdown(context.Background())
	base := "http://" + d.ClientAddr() + "/_matrix/client/v3"
	post(t, base+"/register", map[string]any{"username": "alice", "password": "pw", "auth": map[string]string{"type": "m.login.dummy"}})
	get := func(url string) string {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", url, resp.StatusCode)
		}
		return string(body)
	}
	if err := d.Store().RecordDestinationFailure(context.Background(), storage.DestinationRetry{Destination: "down.test", Attempts: 3,
		FailingSince: time.Now().UnixMilli(), RetryAt: time.Now().Add(time.Hour).UnixMilli()}); err != nil {
		t.Fatal(err)
	}
	// One route serves an endpoint under every version; the label names
	// the version requested.
	if resp, err := http.Get("http://" + d.ClientAddr() + "/_matrix/client/unstable/keys/changes"); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	m := get("http://" + d.MetricsAddr() + "/metrics")
	for _, want := range []string{
		`keyserver_outbound_destination_failed_attempts{destination="down.test"} 3`,
		`keyserver_outbound_destination_pending{destination="down.test"} 0`,
		`keyserver_outbound_destination_lease_held{destination="down.test"} 0`,
		`keyserver_outbound_destination_next_try_seconds{destination="down.test"} 3`,
		`keyserver_http_request_duration_seconds_count{api="client",endpoint="/_matrix/client/v3/register",method="POST",status="200"}`,
		`keyserver_http_request_duration_seconds_count{api="client",endpoint="/_matrix/client/unstable/keys/changes",method="GET",status="401"}`,
		"keyserver_one_time_keys_uploaded_total", "keyserver_outbound_queue_depth 0", "keyserver_outbound_room_events 0", "keyserver_stale_device_lists 0",
		`go_sql_open_connections{db_name="sqlite3"}`, `go_sql_open_connections{db_name="sqlite3_writer"} 1`,
		"process_resident_memory_bytes",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	// The statement counter moves with the requests that reach the database.
	statements := func() int64 {
		var n int64
		for _, line := range strings.Split(get("http://"+d.MetricsAddr()+"/metrics"), "\n") {
			if v, ok := strings.CutPrefix(line, "keyserver_database_statements_total "); ok {
				if _, err := fmt.Sscan(v, &n); err != nil {
					t.Fatalf("%q: %v", line, err)
				}
				return n
			}
		}
		t.Fatal("metrics lack keyserver_database_statements_total")
		return 0
	}
	before := statements()
	post(t, base+"/register", map[string]any{"username": "bob", "password": "pw", "auth": map[string]string{"type": "m.login.dummy"}})
	if after := statements(); after <= before || before <= 0 {
		t.Fatalf("statements went from %d to %d over a registration", before, after)
	}
	get("http://" + d.MetricsAddr() + "/debug/pprof/")
}

// In a data directory that already exists (made by a package, say), the
// SQLite database and its log files are still the daemon user's only.
func TestSQLiteFilesInExistingDataDir(t *testing.T) {
	cfg := testConfig(t, testutil.SQLite(t))
	cfg.Database = "" // the default: keyserver.db in the data directory
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := daemon.Start(context.Background(), cfg, quietLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Shutdown(context.Background())
	post(t, "http://"+d.ClientAddr()+"/_matrix/client/v3/register", map[string]any{"username": "alice", "password": "pw", "auth": map[string]string{"type": "m.login.dummy"}})
	for _, f := range []string{"keyserver.db", "keyserver.db-wal", "keyserver.db-shm"} {
		fi, err := os.Stat(filepath.Join(cfg.DataDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %#o, want 0600", f, fi.Mode().Perm())
		}
	}
}

// federation.sender_workers sizes the pool of the device-list sender.
func TestSenderWorkersFromConfig(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		cfg := testConfig(t, db)
		cfg.Federation.SenderWorkers = 3
		d, err := daemon.Start(context.Background(), cfg, quietLogger())
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := d.Shutdown(context.Background()); err != nil {
				t.Error(err)
			}
		}()
		if n := d.Server().Sender.Workers(); n != 3 {
			t.Fatalf("sender pool of %d workers, want 3", n)
		}
	})
}
