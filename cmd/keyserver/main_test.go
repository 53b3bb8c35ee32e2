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
