package main

import (
	"bytes"
	"context"
	"fmt"
	mrand "math/rand/v2"
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
		duration: 300 * time.Millisecond, phases: "query,claim,upload,mixed,room-create,room-join,room-send", seed: 1,
		presign: 3} // few enough that uploads also sign keys as they go
	if err := run(context.Background(), o, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"set-up: 4 users, 8 devices", "query", "claim", "upload", "mixed",
		"room-create", "room-join", "room-send", "keys handed out twice: 0"} {
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

// Uploads go to devices with room below the cap, as clients' do, and only
// to a full one when every device is full.
func TestUploadsGoWhereThereIsRoom(t *testing.T) {
	b := &bench{o: options{keyCap: 20}}
	for i := 0; i < 8; i++ {
		d := &device{deviceID: fmt.Sprint("D", i)}
		d.unclaimed.Store(18)
		b.devices = append(b.devices, d)
	}
	b.devices[5].unclaimed.Store(15)
	rng := mrand.New(mrand.NewPCG(1, 2))
	for range 100 {
		if d := b.deviceWithRoom(rng, 5); d != b.devices[5] {
			t.Fatalf("picked %s (%d keys), the only device with room for 5 is D5", d.deviceID, d.unclaimed.Load())
		}
	}
	b.devices[5].unclaimed.Store(16)
	seen := map[*device]bool{}
	for range 200 {
		seen[b.deviceWithRoom(rng, 5)] = true
	}
	if len(seen) < 6 {
		t.Fatalf("with every device full the pick stays random; %d of 8 devices picked", len(seen))
	}
}
