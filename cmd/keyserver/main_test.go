package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyserver/keyserver/config"
)

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func TestGenerateConfig(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"generate-config"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "k.yaml")
	if err := os.WriteFile(path, out.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil || cfg.Validate() != nil {
		t.Fatalf("generated config does not load: %v", err)
	}
}

func TestBadArgumentsFailWithOneLine(t *testing.T) {
	for _, args := range [][]string{
		{"--registration", "sometimes"},
		{"--server-name", "not a name"},
		{"--client-api-bcrypt-cost", "lots"},
		{"--config", "/nonexistent/keyserver.yaml"},
		{"--no-such-flag"},
		{"extra"},
	} {
		var out bytes.Buffer
		err := run(context.Background(), args, &out, &out)
		if err == nil {
			t.Errorf("%v: accepted", args)
			continue
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error spans lines: %q", args, err)
		}
	}
}

// A type error in the file is reported with every other problem, the
// flags' included, in one line.
func TestConfigProblemsReportedTogether(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k.yaml")
	if err := os.WriteFile(path, []byte("client_api:\n  bcrypt_cost: \"abc\"\n  registration: sometimes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	err := run(context.Background(), []string{"--config", path, "--server-name", "not a name"}, &out, &out)
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"abc", "registration", "server_name"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error spans lines: %q", err)
	}
}

// Flags win over the file, and the daemon runs until its context ends.
func TestFlagsOverrideConfigFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "k.yaml")
	client := freePort(t)
	yaml := "client_api:\n  registration: closed\n  bcrypt_cost: 4\n  listen: 127.0.0.1:1\n"
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var logs bytes.Buffer
	go func() {
		done <- run(ctx, []string{"--config", path, "--registration", "open", "--client-listen", client,
			"--federation-listen", freePort(t), "--data-dir", filepath.Join(dir, "data"), "--server-name", "example.test"}, &logs, &logs)
	}()
	deadline := time.Now().Add(20 * time.Second)
	var resp *http.Response
	for {
		var err error
		resp, err = http.Post("http://"+client+"/_matrix/client/v3/register", "application/json",
			strings.NewReader(`{"username":"alice","password":"pw","auth":{"type":"m.login.dummy"}}`))
		if err == nil {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("daemon exited: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon did not listen: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("registration with --registration open: %d", resp.StatusCode)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	if !strings.Contains(logs.String(), "keyserver stopped") {
		t.Fatalf("no clean stop in the log:\n%s", logs.String())
	}
}

func TestAdminCommands(t *testing.T) {
	dir := t.TempDir()
	common := []string{"--data-dir", dir, "--server-name", "example.test", "--client-api-bcrypt-cost", "4"}
	admin := func(args ...string) (string, error) {
		var out, errs bytes.Buffer
		a := append([]string{"admin", args[0]}, common...)
		err := run(context.Background(), append(a, args[1:]...), &out, &errs)
		return out.String(), err
	}
	if out, err := admin("create-user", "Alice", "secret"); err != nil || !strings.Contains(out, "@alice:example.test") {
		t.Fatalf("create-user: %q %v", out, err)
	}
	if _, err := admin("create-user", "alice", "again"); err == nil {
		t.Fatal("created a user twice")
	}
	if out, err := admin("devices", "@alice:example.test"); err != nil || !strings.Contains(out, "DEVICE") {
		t.Fatalf("devices: %q %v", out, err)
	}
	if _, err := admin("devices", "@nobody:example.test"); err == nil {
		t.Fatal("listed devices of a user that does not exist")
	}
	if _, err := admin("mark-stale", "@bob:remote.test"); err != nil {
		t.Fatalf("mark-stale: %v", err)
	}
	if _, err := admin("mark-stale", "@alice:example.test"); err == nil {
		t.Fatal("marked a local user stale")
	}
	if out, err := admin("queue"); err != nil || !strings.Contains(out, "DESTINATION") {
		t.Fatalf("queue: %q %v", out, err)
	}
	for _, bad := range [][]string{{"frobnicate"}, {"devices"}, {"create-user", "x"}} {
		if _, err := admin(bad...); err == nil {
			t.Errorf("admin %v accepted", bad)
		}
	}
	// The user created from the command line can log in.
	client := freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var logs bytes.Buffer
	go func() {
		done <- run(ctx, append([]string{"--client-listen", client, "--federation-listen", freePort(t), "--registration", "closed"}, common...), &logs, &logs)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Post("http://"+client+"/_matrix/client/v3/login", "application/json",
			strings.NewReader(`{"type":"m.login.password","identifier":{"type":"m.id.user","user":"alice"},"password":"secret"}`))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("login: %d", resp.StatusCode)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon did not listen: %v\n%s", err, logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
