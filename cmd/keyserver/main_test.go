package main

import (
	"bytes"
	"context"
	"encoding/json"
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
	if err := run(context.Background(), []string{"generate-config"}, nil, &out, &out); err != nil {
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
		err := run(context.Background(), args, nil, &out, &out)
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
	err := run(context.Background(), []string{"--config", path, "--server-name", "not a name", "--federation-send-wait", "soon"}, nil, &out, &out)
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"abc", "registration", "server_name", "--federation-send-wait", "soon"} {
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
			"--federation-listen", freePort(t), "--data-dir", filepath.Join(dir, "data"), "--server-name", "example.test"}, nil, &logs, &logs)
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
	stdin := ""
	admin := func(args ...string) (string, error) {
		var out, errs bytes.Buffer
		a := append([]string{"admin", args[0]}, common...)
		err := run(context.Background(), append(a, args[1:]...), strings.NewReader(stdin), &out, &errs)
		return out.String(), err
	}
	stdin = "secret\nnot this line\n"
	if out, err := admin("create-user", "Alice"); err != nil || !strings.Contains(out, "@alice:example.test") {
		t.Fatalf("create-user: %q %v", out, err)
	}
	stdin = "again\n"
	if _, err := admin("create-user", "alice"); err == nil {
		t.Fatal("created a user twice")
	}
	// A password on the command line is refused, and not repeated.
	stdin = "pw\n"
	if _, err := admin("create-user", "carol", "hunter2-on-the-command-line"); err == nil || strings.Contains(err.Error(), "hunter2") ||
		!strings.Contains(err.Error(), "standard input") {
		t.Fatalf("password as an argument: %v", err)
	}
	stdin = ""
	if _, err := admin("create-user", "carol"); err == nil || !strings.Contains(err.Error(), "no password") {
		t.Fatalf("no password on standard input: %v", err)
	}
	stdin = "\r\n"
	if _, err := admin("create-user", "carol"); err == nil {
		t.Fatal("empty password accepted")
	}
	// The last line may lack its newline; a CR before it is not part of
	// the password.
	stdin = "bobpw\r\n"
	if _, err := admin("create-user", "bob"); err != nil {
		t.Fatal(err)
	}
	stdin = "davepw"
	if _, err := admin("create-user", "dave"); err != nil {
		t.Fatal(err)
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
	for _, bad := range [][]string{{"frobnicate"}, {"devices"}, {"create-user"}, {"create-user", "x", "y", "z"}} {
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
		done <- run(ctx, append([]string{"--client-listen", client, "--federation-listen", freePort(t), "--registration", "closed"}, common...), nil, &logs, &logs)
	}()
	deadline := time.Now().Add(20 * time.Second)
	login := func(user, password string) (int, error) {
		body, _ := json.Marshal(map[string]any{"type": "m.login.password", "identifier": map[string]string{"type": "m.id.user", "user": user}, "password": password})
		resp, err := http.Post("http://"+client+"/_matrix/client/v3/login", "application/json", bytes.NewReader(body))
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	for {
		code, err := login("alice", "secret")
		if err == nil {
			if code != 200 {
				t.Fatalf("login: %d", code)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon did not listen: %v\n%s", err, logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for user, pw := range map[string]string{"bob": "bobpw", "dave": "davepw"} {
		if code, err := login(user, pw); err != nil || code != 200 {
			t.Errorf("login %s: %d %v", user, code, err)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// The admin usage is asked for with --help, -h or "help" (stdout, success),
// and shown on stdout when the command is missing.
func TestAdminHelp(t *testing.T) {
	for _, args := range [][]string{{"admin", "--help"}, {"admin", "-h"}, {"admin", "help"}, {"admin"}} {
		var out, errs bytes.Buffer
		err := run(context.Background(), args, nil, &out, &errs)
		if !strings.Contains(out.String(), "create-user LOCALPART") {
			t.Errorf("%v: usage not on stdout: %q (stderr %q)", args, out.String(), errs.String())
		}
		if wantErr := len(args) == 1; (err != nil) != wantErr {
			t.Errorf("%v: error %v", args, err)
		}
	}
	// A command's --help lists the flags, on stdout, and is a success.
	var out, errs bytes.Buffer
	err := run(context.Background(), []string{"admin", "queue", "--help"}, nil, &out, &errs)
	if exitCode(err) != 0 || !strings.Contains(out.String(), "-data-dir value") || errs.Len() != 0 {
		t.Errorf("admin queue --help: %v, stdout %q, stderr %q", err, out.String(), errs.String())
	}
	// A mistake still shows the usage on stderr, and fails.
	out.Reset()
	errs.Reset()
	err = run(context.Background(), []string{"admin", "queue", "--no-such-flag"}, nil, &out, &errs)
	if exitCode(err) == 0 || !strings.Contains(errs.String(), "no-such-flag") || out.Len() != 0 {
		t.Errorf("admin queue --no-such-flag: %v, stdout %q, stderr %q", err, out.String(), errs.String())
	}
}
