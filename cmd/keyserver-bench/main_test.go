package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/daemon"
	"github.com/keyserver/keyserver/internal/testutil"
)

// A short run against a real server: set-up works, every phase runs
// without errors, and the claim and signature checks are exercised.
func TestBenchAgainstServer(t *testing.T) {
	srv := testutil.NewServer(t, testutil.SQLite(t), testutil.ServerOptions{})
	var out bytes.Buffer
	o := options{urls: []string{srv.URL}, users: 4, devices: 2, otks: 5, clients: 2, queryUsers: 3, upload: 2,
		duration: 300 * time.Millisecond, phases: "query,claim,upload,mixed,room-create,room-join,room-send", seed: 1,
		presign:    3,                    // few enough that uploads also sign keys as they go
		claimStock: 400,                  // more than the claims of the phase: none comes back empty
		keyCap:     500, uploadRoom: 400, // the server's cap; uploads find room
		pids: []int{os.Getpid()}} // the server runs in this process
	if err := run(context.Background(), o, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log(out.String())
	for _, want := range []string{"set-up: 4 users, 8 devices", "query", "claim", "upload", "mixed",
		"room-create", "room-join", "room-send", "keys handed out twice: 0",
		"claim stock: every device topped up to 400", "upload room: every device at most 100 one-time keys",
		"claims that found no key (not in requests or req/s): 0\n",
		"daemon CPU µs/req (1)"} {
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
// to a full one when every device is full; the room is reserved at once,
// so that clients picking at the same moment never fill a device past the
// cap between them.
func TestUploadsGoWhereThereIsRoom(t *testing.T) {
	b := &bench{o: options{keyCap: 20}}
	for i := 0; i < 8; i++ {
		d := &device{deviceID: fmt.Sprint("D", i)}
		d.unclaimed.Store(18)
		b.devices = append(b.devices, d)
	}
	b.devices[5].unclaimed.Store(15)
	rng := mrand.New(mrand.NewPCG(1, 2))
	if d, reserved := b.deviceWithRoom(rng, 5); d != b.devices[5] || !reserved || d.unclaimed.Load() != 20 {
		t.Fatalf("picked %s (%d keys, reserved %v), the only device with room for 5 is D5", d.deviceID, d.unclaimed.Load(), reserved)
	}
	seen := map[*device]bool{}
	for range 200 {
		d, reserved := b.deviceWithRoom(rng, 5)
		if reserved {
			t.Fatalf("reserved room on %s with every device full", d.deviceID)
		}
		seen[d] = true
	}
	if len(seen) < 6 {
		t.Fatalf("with every device full the pick stays random; %d of 8 devices picked", len(seen))
	}

	// 64 clients at once, room for one upload on each of 8 devices: 8
	// reservations, one per device.
	for _, d := range b.devices {
		d.unclaimed.Store(15)
	}
	var wg sync.WaitGroup
	var got atomic.Int32
	for c := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, reserved := b.deviceWithRoom(mrand.New(mrand.NewPCG(uint64(c), 3)), 5); reserved {
				got.Add(1)
			}
		}()
	}
	wg.Wait()
	if got.Load() != 8 {
		t.Fatalf("%d reservations for 8 devices with room for one upload each", got.Load())
	}
	for _, d := range b.devices {
		if d.unclaimed.Load() != 20 {
			t.Fatalf("%s counts %d after the reservations, want 20", d.deviceID, d.unclaimed.Load())
		}
	}
}

// Without a stock the claims run the devices dry: the empty answers are
// counted apart and left out of the requests and the rate.
func TestEmptyClaimsCountedApart(t *testing.T) {
	srv := testutil.NewServer(t, testutil.SQLite(t), testutil.ServerOptions{})
	var out bytes.Buffer
	o := options{urls: []string{srv.URL}, users: 2, devices: 2, otks: 1, clients: 2, queryUsers: 2, upload: 2,
		duration: 300 * time.Millisecond, phases: "claim", seed: 1}
	if err := run(context.Background(), o, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	var requests, empty int
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) == 7 && f[0] == "claim" {
			fmt.Sscan(f[1], &requests)
		}
		fmt.Sscanf(line, "claims that found no key (not in requests or req/s): %d", &empty)
	}
	if requests != 4 || empty == 0 {
		t.Fatalf("4 keys in all: want 4 claims that found one and the rest empty, got %d and %d\n%s", requests, empty, out.String())
	}
}

// When the room made for uploads runs out, the uploads the server refuses
// at its cap are counted apart, not as errors and not in the rate: one
// device of 450 keys under a cap of 500 takes exactly ten uploads of 5.
func TestUploadsRefusedAtTheCapCountedApart(t *testing.T) {
	srv := testutil.NewServer(t, testutil.SQLite(t), testutil.ServerOptions{})
	var out bytes.Buffer
	o := options{urls: []string{srv.URL}, users: 1, devices: 1, otks: 450, clients: 2, queryUsers: 1, upload: 5,
		duration: time.Second, phases: "upload", seed: 1, keyCap: 500}
	if err := run(context.Background(), o, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	requests, errs, full := -1, -1, -1
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) == 7 && f[0] == "upload" {
			fmt.Sscan(f[1], &requests)
			fmt.Sscan(f[6], &errs)
		}
		fmt.Sscanf(line, "uploads refused with every device at the cap (not in requests or req/s): %d", &full)
	}
	if requests != 10 || errs != 0 || full <= 0 {
		t.Fatalf("want 10 uploads, no errors and the refused ones apart; got %d, %d errors, %d refused\n%s",
			requests, errs, full, out.String())
	}
	if !strings.Contains(out.String(), "the room made before the phase ran out") {
		t.Fatalf("the output does not say why uploads were refused:\n%s", out.String())
	}
}

// An upload refused at the cap on a device the tool had reserved room on
// (an upload sent without room took it at the same moment) leaves the
// device counted full: giving the room back would have every later upload
// there refused.
func TestUploadRefusedOnReservedRoomLeavesTheDeviceFull(t *testing.T) {
	var uploads atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		uploads.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"errcode":"M_INVALID_PARAM","error":"a device may hold at most 500 unclaimed one-time keys"}`)
	}))
	t.Cleanup(srv.Close)
	_, key, _ := ed25519.GenerateKey(nil)
	d := &device{userID: "@u:example.org", deviceID: "D", token: "t", key: key}
	d.unclaimed.Store(495) // room for one upload of 5
	b := &bench{o: options{upload: 5, keyCap: 500}, devices: []*device{d}}
	cl := &client{rng: mrand.New(mrand.NewPCG(1, 2)), url: srv.URL}
	defer func() {
		if cl.conn != nil {
			cl.conn.close()
		}
	}()
	for i := range 2 {
		if err := b.uploadKeys(context.Background(), cl); !errors.Is(err, errUploadFull) {
			t.Fatalf("upload %d: %v, want it counted as refused at the cap", i, err)
		}
		if n := d.unclaimed.Load(); n != 500 {
			t.Fatalf("after upload %d the tool counts %d keys on the device, want 500 (full)", i, n)
		}
	}
	if n := uploads.Load(); n != 2 {
		t.Fatalf("%d uploads reached the server, want 2", n)
	}
}

// Claims go to devices the tool knows to have keys left.
func TestClaimsGoWhereThereAreKeys(t *testing.T) {
	b := &bench{}
	for i := 0; i < 8; i++ {
		b.devices = append(b.devices, &device{deviceID: fmt.Sprint("D", i)})
	}
	b.devices[3].unclaimed.Store(1)
	rng := mrand.New(mrand.NewPCG(1, 2))
	for range 50 {
		if d := b.deviceWithKeys(rng); d != b.devices[3] {
			t.Fatalf("picked %s, the only device with a key is D3", d.deviceID)
		}
	}
}

// Clients are spread over every URL given, and set-up too.
func TestClientsSpreadOverURLs(t *testing.T) {
	srv := testutil.NewServer(t, testutil.SQLite(t), testutil.ServerOptions{})
	target, _ := url.Parse(srv.URL)
	var urls []string
	var counts [3]atomic.Int64
	for i := range counts {
		proxy := httputil.NewSingleHostReverseProxy(target)
		front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			counts[i].Add(1)
			proxy.ServeHTTP(w, r)
		}))
		t.Cleanup(front.Close)
		urls = append(urls, front.URL)
	}
	var out bytes.Buffer
	o := options{urls: urls, users: 3, devices: 1, otks: 2, clients: 3, queryUsers: 2, upload: 2,
		duration: 200 * time.Millisecond, phases: "query", seed: 1}
	if err := run(context.Background(), o, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for i := range counts {
		if counts[i].Load() < 3 { // its user's registration and upload, and queries
			t.Fatalf("URL %d got %d requests\n%s", i, counts[i].Load(), out.String())
		}
	}
}

func TestParseTargets(t *testing.T) {
	urls, pids, err := parseTargets("http://a:1, http://b:2,", "12,34")
	if err != nil || !slices.Equal(urls, []string{"http://a:1", "http://b:2"}) || !slices.Equal(pids, []int{12, 34}) {
		t.Fatalf("got %v %v %v", urls, pids, err)
	}
	for _, bad := range [][2]string{{"", ""}, {"http://a", "x"}, {"http://a", "-3"}} {
		if _, _, err := parseTargets(bad[0], bad[1]); err == nil {
			t.Fatalf("%q %q accepted", bad[0], bad[1])
		}
	}
}

// The sync phase against a daemon: the waiters in the room wake with the
// change, the others do not, and the daemon's memory and statements are
// read.
func TestSyncPhase(t *testing.T) {
	cfg := config.Default()
	cfg.DataDir = filepath.Join(t.TempDir(), "data")
	cfg.Database = testutil.SQLite(t).URI
	cfg.ClientAPI.Listen = "127.0.0.1:0"
	cfg.Federation.Listen = "127.0.0.1:0"
	cfg.Metrics.Listen = "127.0.0.1:0"
	cfg.ClientAPI.BcryptCost = 4
	cfg.ClientAPI.RegistrationRateLimit.PerSecond = 0
	cfg.ClientAPI.MaxConnectionsPerAddress = 10 // below the waiters: they come from several addresses
	cfg.AdminToken = "admin"
	logger := logrus.New()
	logger.SetOutput(io.Discard)
	d, err := daemon.Start(context.Background(), cfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Shutdown(context.Background())
	var out bytes.Buffer
	o := options{urls: []string{"http://" + d.ClientAddr()}, users: 2, devices: 1, otks: 1, clients: 4, queryUsers: 1, upload: 1,
		phases: "sync", seed: 1, pids: []int{os.Getpid()}, metricsURLs: []string{"http://" + d.MetricsAddr() + "/metrics"},
		adminToken: "admin", syncWaiters: 40, syncRoom: 7, syncTimeout: 30 * time.Second, syncGrace: 300 * time.Millisecond}
	if err := run(context.Background(), o, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log(out.String())
	for _, want := range []string{"sync: 40 waiting /sync requests, 7 of them", "woke: 7 of 7 in the room, 0 others",
		"KB per waiting request", "change to answer (ms): p50", "database statements per woken request: "} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q:\n%s", want, out.String())
		}
	}
	for _, bad := range []string{"did not see the change", "failed waits"} {
		if strings.Contains(out.String(), bad) {
			t.Fatalf("output has %q:\n%s", bad, out.String())
		}
	}
}

func TestMetricValue(t *testing.T) {
	text := "# HELP keyserver_sync_waiting x\nkeyserver_sync_waiting_other 3\nkeyserver_sync_waiting 42\n"
	if v, err := metricValue(strings.NewReader(text), "keyserver_sync_waiting"); err != nil || v != 42 {
		t.Fatalf("got %v %v", v, err)
	}
	if _, err := metricValue(strings.NewReader(text), "absent"); err == nil {
		t.Fatal("an absent metric was read")
	}
}

// The server of fixed answers answers every phase the tool runs, so that
// the ceiling is measured for each.
func TestFixedServerAnswersEveryPhase(t *testing.T) {
	srv := httptest.NewServer(fixedHandler())
	defer srv.Close()
	var phases []string
	for name := range (&bench{}).ops() {
		phases = append(phases, name)
	}
	slices.Sort(phases)
	var out bytes.Buffer
	o := options{urls: []string{srv.URL}, users: 3, devices: 1, otks: 2, clients: 2, queryUsers: 2, upload: 2,
		duration: 100 * time.Millisecond, phases: strings.Join(phases, ","), seed: 1, claimStock: 10}
	if err := run(context.Background(), o, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) == 7 && f[0] != "phase" && (f[6] != "0" || f[1] == "0") {
			t.Fatalf("a phase without answers or with errors: %s\n%s", line, out.String())
		}
	}
}

// Before an upload phase, keys are claimed from every device over the
// mark until none is, so that the phase's uploads find room; the keys
// claimed count as handed out.
func TestUploadRoomMade(t *testing.T) {
	srv := testutil.NewServer(t, testutil.SQLite(t), testutil.ServerOptions{})
	o := options{urls: []string{srv.URL}, users: 2, devices: 2, otks: 50, clients: 2, keyCap: 500, uploadRoom: 460, seed: 1}
	b := &bench{o: o, claimed: map[string]bool{}, http: http.DefaultClient}
	ctx := context.Background()
	if err := b.setup(ctx); err != nil {
		t.Fatal(err)
	}
	b.devices[1].unclaimed.Store(30) // the tool's count is the server's or lower: this one is left alone
	if err := b.makeRoom(ctx); err != nil {
		t.Fatal(err)
	}
	for i, d := range b.devices {
		var counts uploadCounts
		if err := b.do(ctx, srv.URL, "POST", "/_matrix/client/v3/keys/upload", d.token, map[string]any{}, &counts); err != nil {
			t.Fatal(err)
		}
		want := int64(40)
		if i == 1 {
			want = 50
		}
		if got := counts.OneTimeKeyCounts["signed_curve25519"]; got != want || d.unclaimed.Load() > 40 {
			t.Fatalf("%s: the server holds %d keys (want %d), the tool counts %d", d.deviceID, got, want, d.unclaimed.Load())
		}
	}
	if len(b.claimed) != 30 || b.twice.Load() != 0 {
		t.Fatalf("%d keys recorded as handed out, %d twice; want 30 and 0", len(b.claimed), b.twice.Load())
	}
}

// An upload's answer does not undo the room other clients reserved on the
// device meanwhile: with room for two uploads, both reserved, the first
// one's answer (which counts only its own keys) leaves no room for a
// third.
func TestUploadAnswerKeepsOthersReservations(t *testing.T) {
	b := &bench{o: options{keyCap: 500}, devices: []*device{{userID: "@u:x", deviceID: "D"}}}
	d := b.devices[0]
	d.unclaimed.Store(490)
	rng := mrand.New(mrand.NewPCG(1, 2))
	for range 2 {
		if _, reserved := b.deviceWithRoom(rng, 5); !reserved {
			t.Fatal("no room reserved where there was room for two uploads")
		}
	}
	d.noteUploadCount(495) // the first upload's answer
	if _, reserved := b.deviceWithRoom(rng, 5); reserved {
		t.Fatalf("a third upload reserved room on a full device (count %d)", d.unclaimed.Load())
	}
	d.noteUploadCount(503) // the server holds more than the tool counted
	if d.unclaimed.Load() != 503 {
		t.Fatalf("count %d, want the server's higher 503", d.unclaimed.Load())
	}
}
