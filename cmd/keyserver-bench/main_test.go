package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/testutil"
)

// A short run against a real server: set-up works, every phase runs
// without errors, and the claim and signature checks are exercised.
func TestBenchAgainstServer(t *testing.T) {
	srv := testutil.NewServer(t, testutil.SQLite(t), testutil.ServerOptions{})
	var out bytes.Buffer
	o := options{url: srv.URL, users: 4, devices: 2, otks: 5, clients: 2, queryUsers: 3, upload: 2,
		duration: 300 * time.Millisecond, phases: "query,claim,upload,mixed", seed: 1,
		presign: 3} // few enough that uploads also sign keys as they go
	if err := run(context.Background(), o, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"set-up: 4 users, 8 devices", "query", "claim", "upload", "mixed", "keys handed out twice: 0"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) == 7 && f[0] != "phase" && f[6] != "0" {
			t.Fatalf("errors in a phase: %s\n%s", line, out.String())
		}
	}
}
