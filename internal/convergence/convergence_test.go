// Package convergence tests that servers agree on each other's users'
// device lists soon after faults between them end.
//
// Real daemons (processes built from ./cmd/keyserver) run on loopback,
// each server behind a faultproxy.Proxy listening on its name, so that
// every federation request from one server to another crosses a link the
// test can break one way: refused, hanging, answer dropped after
// delivery, delayed. Users of every server share one room; writers add,
// delete and rename devices and upload one-time keys, chosen from a
// printed seed, while links fail and daemons are killed with SIGKILL and
// restarted on the same data. With PostgreSQL, one server runs as two
// instances sharing its database, and the instance that holds the
// server's sending is the one killed. Then every fault ends, and each
// server's /keys/query view of every remote user must equal the user's
// home server's within the deadline. The verdict waits on that condition;
// the pauses in between only shape the faults.
//
//	KEYSERVER_CONVERGENCE_SEED      seed of the operations and faults (default: random, printed)
//	KEYSERVER_CONVERGENCE_DURATION  how long the faults last (default 8s)
//	KEYSERVER_CONVERGENCE_SERVERS   number of servers, 3 or more (default 3)
//	KEYSERVER_CONVERGENCE_USERS     users per server (default 2)
//	KEYSERVER_CONVERGENCE_DEADLINE  the bound on convergence (default 30s)
//	KEYSERVER_CONVERGENCE_FAULTS    "links": link faults only, no daemon killed; "none": the
//	                                writers only (a check of the harness); default both
//
// make soak runs it longer (SEED, DURATION, SERVERS, USERS).
package convergence

import (
	"context"
	"crypto/ed25519"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/rand"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/faultproxy"
	"github.com/keyserver/keyserver/internal/testutil"
)

func envInt(t *testing.T, name string, def int64) int64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return d
}

// user is a user of a server and their logged-in devices.
type user struct {
	id       string
	password string
	home     *server
	mu       sync.Mutex
	devices  []*testutil.User // [0] is never deleted
	next     int
}

const roomPrefix = "!convergence:"

// TestConvergence: after faults end, every server's view of every remote
// user's devices equals the home server's within the deadline.
func TestConvergence(t *testing.T) {
	seed := envInt(t, "KEYSERVER_CONVERGENCE_SEED", time.Now().UnixNano()%1_000_000)
	duration := envDuration(t, "KEYSERVER_CONVERGENCE_DURATION", 8*time.Second)
	nServers := int(envInt(t, "KEYSERVER_CONVERGENCE_SERVERS", 3))
	nUsers := int(envInt(t, "KEYSERVER_CONVERGENCE_USERS", 2))
	deadline := envDuration(t, "KEYSERVER_CONVERGENCE_DEADLINE", 30*time.Second)
	if nServers < 3 {
		t.Fatalf("KEYSERVER_CONVERGENCE_SERVERS must be 3 or more")
	}
	t.Logf("seed %d (KEYSERVER_CONVERGENCE_SEED=%d to repeat), faults for %v, %d servers, %d users each", seed, seed, duration, nServers, nUsers)

	// The last server runs as two instances on one PostgreSQL database
	// when PostgreSQL is there (make test starts one); with four servers
	// or more, the one before it has a PostgreSQL database of its own.
	// The others use SQLite.
	withPG := os.Getenv("KEYSERVER_TEST_POSTGRES") != ""
	if !withPG {
		if os.Getenv("CI") != "" {
			testutil.Postgres(t) // fails: CI must run with PostgreSQL
		}
		t.Logf("PostgreSQL is not configured: every server runs on SQLite, one instance each (KEYSERVER_TEST_POSTGRES enables the shared-database part)")
	}
	h := &harness{t: t}
	for i := 0; i < nServers; i++ {
		database, instances := "", 1
		if withPG && i == nServers-1 {
			database, instances = testutil.Postgres(t).URI, 2
		} else if withPG && nServers >= 4 && i == nServers-2 {
			database = testutil.Postgres(t).URI
		}
		h.addServer(string(rune('A'+i)), database, instances)
	}
	defer h.stopAll()
	h.setup(nUsers)

	// The fault phase: writers and faults from the seed.
	ctx, cancel := context.WithTimeout(context.Background(), duration)
	var wg sync.WaitGroup
	for w := 0; w < 3; w++ {
		rng := rand.New(rand.NewSource(seed*31 + int64(w)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			h.write(ctx, rng)
		}()
	}
	if os.Getenv("KEYSERVER_CONVERGENCE_FAULTS") == "none" {
		<-ctx.Done()
	} else {
		h.chaos(ctx, rand.New(rand.NewSource(seed*17+5)), os.Getenv("KEYSERVER_CONVERGENCE_FAULTS") != "links")
	}
	cancel()
	wg.Wait()

	// The faults end: every link passes, every daemon runs.
	for _, s := range h.servers {
		s.proxy.Clear()
	}
	for _, s := range h.servers {
		for _, p := range s.procs {
			if !p.alive() {
				p.start(t)
			}
		}
	}
	end := time.Now()
	t.Logf("faults ended; %d operations, %d refused or unanswered; %s", h.ops.Load(), h.failedOps.Load(), h.faultSummary())

	// The verdict. No answer may have been a 5xx, whatever the outcome.
	defer func() {
		if n := h.serverErrors.Load(); n > 0 {
			t.Errorf("%d answers were 5xx: %s", n, h.firstServerError.Load())
		}
	}()
	var diff string
	for {
		var ok bool
		ok, diff = h.agree()
		if ok {
			t.Logf("converged %.1f s after the faults ended (seed %d)", time.Since(end).Seconds(), seed)
			break
		}
		if time.Since(end) > deadline {
			t.Fatalf("not converged %v after the faults ended (seed %d): %s", deadline, seed, diff)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

type harness struct {
	t       *testing.T
	servers []*server

	// lastSend: per sending server, the sender's address of its last
	// /send (seen by the proxies), to find the instance holding its leases.
	sendMu   sync.Mutex
	lastSend map[string]string

	ops, failedOps   atomic.Int64
	serverErrors     atomic.Int64
	firstServerError atomic.Value
	faultMu          sync.Mutex
	faultCounts      map[string]int
}

func (h *harness) addServer(label, database string, instances int) {
	t := h.t
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{label: label, name: ln.Addr().String()}
	signingKey := t.TempDir() + "/signing.key"
	for i := 0; i < instances; i++ {
		l := label
		if instances > 1 {
			l += strconv.Itoa(i + 1)
		}
		s.procs = append(s.procs, newProc(t, s, l, database, signingKey))
	}
	var backends []string
	for _, p := range s.procs {
		backends = append(backends, p.fedAddr)
	}
	if s.proxy, err = faultproxy.New(ln, backends...); err != nil {
		t.Fatal(err)
	}
	s.proxy.OnRequest = func(r faultproxy.Request) {
		if r.Status >= 500 && h.serverErrors.Add(1) == 1 {
			h.firstServerError.Store(fmt.Sprintf("federation %s %s from %s to %s: %d", r.Method, r.Path, r.Origin, label, r.Status))
		}
		if strings.HasPrefix(r.Path, "/_matrix/federation/v1/send/") {
			h.sendMu.Lock()
			if h.lastSend == nil {
				h.lastSend = map[string]string{}
			}
			h.lastSend[r.Origin] = r.RemoteAddr
			h.sendMu.Unlock()
		}
	}
	t.Cleanup(func() { _ = s.proxy.Close() })
	for _, p := range s.procs { // one after the other: the first makes the signing key
		p.start(t)
	}
	h.servers = append(h.servers, s)
}

func (h *harness) stopAll() {
	var wg sync.WaitGroup
	for _, s := range h.servers {
		for _, p := range s.procs {
			wg.Add(1)
			go func() { defer wg.Done(); p.stop() }()
		}
	}
	wg.Wait()
	if !h.t.Failed() {
		return
	}
	// The daemons' logs outlive the test's directories.
	keep, err := os.MkdirTemp("", "keyserver-convergence-logs-")
	if err != nil {
		return
	}
	for _, s := range h.servers {
		for _, p := range s.procs {
			if b, err := os.ReadFile(p.logPath); err == nil {
				_ = os.WriteFile(filepath.Join(keep, p.label+".log"), b, 0o600)
			}
			h.t.Logf("%s (server %s, instance %d of %d): log kept as %s", p.label, s.name, slices.Index(s.procs, p)+1, len(s.procs),
				filepath.Join(keep, p.label+".log"))
			var warns []string
			for _, l := range p.logLines("level=warn") {
				if !strings.Contains(l, "tls_insecure_skip_verify") {
					warns = append(warns, l)
				}
			}
			if len(warns) > 10 {
				h.t.Logf("  ... %d warnings before these", len(warns)-10)
				warns = warns[len(warns)-10:]
			}
			for _, l := range warns {
				h.t.Log("  " + l)
			}
		}
	}
}

// must sends a request that must succeed (set-up, no faults yet).
func (h *harness) must(p *proc, method, path, token string, body any) map[string]any {
	h.t.Helper()
	st, out, err := p.call(context.Background(), method, path, token, body)
	if err != nil || st != http.StatusOK {
		h.t.Fatalf("%s: %s %s: %d %v %v", p.label, method, path, st, out, err)
	}
	return out
}

// setup registers the users, uploads their first device's keys and puts
// everyone in one room on every server.
func (h *harness) setup(nUsers int) {
	t := h.t
	room := roomPrefix + h.servers[0].name
	for _, s := range h.servers {
		for i := 0; i < nUsers; i++ {
			name := fmt.Sprintf("u%d%s", i, strings.ToLower(s.label))
			r := h.must(s.procs[0], "POST", "/_matrix/client/v3/register", "", map[string]any{
				"username": name, "password": "pw-" + name, "auth": map[string]any{"type": "m.login.dummy"}})
			u := &user{id: r["user_id"].(string), password: "pw-" + name, home: s}
			d := newDevice(u, r["device_id"].(string), r["access_token"].(string))
			h.must(s.procs[0], "POST", "/_matrix/client/v3/keys/upload", d.Token, map[string]any{
				"device_keys": d.DeviceKeys(t), "one_time_keys": d.OneTimeKeys(t, "a", 3)})
			u.devices = []*testutil.User{d}
			s.users = append(s.users, u)
		}
	}
	for _, s := range h.servers {
		for _, o := range h.servers {
			for _, u := range o.users {
				h.must(s.procs[0], "PUT", "/_keyserver/admin/v1/rooms/"+url.PathEscape(room)+"/members/"+url.PathEscape(u.id), adminToken,
					map[string]string{"membership": "join"})
			}
		}
	}
	// Before any fault, every server knows every list: the starting
	// point is agreement.
	start := time.Now()
	for {
		ok, diff := h.agree()
		if ok {
			t.Logf("set-up agreed after %.1f s", time.Since(start).Seconds())
			return
		}
		if time.Since(start) > 60*time.Second {
			t.Fatalf("servers do not agree after the set-up: %s", diff)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func newDevice(u *user, deviceID, token string) *testutil.User {
	d := &testutil.User{UserID: u.id, DeviceID: deviceID, Token: token, Password: u.password}
	_, d.Key, _ = ed25519.GenerateKey(crand.Reader)
	return d
}

// pick returns a running instance of s, at random, or nil.
func (s *server) pick(rng *rand.Rand) *proc {
	var alive []*proc
	for _, p := range s.procs {
		if p.alive() {
			alive = append(alive, p)
		}
	}
	if len(alive) == 0 {
		return nil
	}
	return alive[rng.Intn(len(alive))]
}

// call makes a client request of the writers: an answer from a running
// daemon is counted, a 5xx recorded as an error.
func (h *harness) call(ctx context.Context, p *proc, method, path, token string, body any) (int, map[string]any, bool) {
	h.ops.Add(1)
	st, out, err := p.call(ctx, method, path, token, body)
	if err != nil {
		h.failedOps.Add(1)
		return st, out, false
	}
	if st >= 500 {
		if h.serverErrors.Add(1) == 1 {
			h.firstServerError.Store(fmt.Sprintf("%s %s %s: %d %v", p.label, method, path, st, out))
		}
	}
	return st, out, st == http.StatusOK
}

// write makes random device and key changes until ctx ends.
func (h *harness) write(ctx context.Context, rng *rand.Rand) {
	var users []*user
	for _, s := range h.servers {
		users = append(users, s.users...)
	}
	for ctx.Err() == nil {
		u := users[rng.Intn(len(users))]
		op := rng.Intn(4)
		p := u.home.pick(rng)
		if p == nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		u.mu.Lock()
		switch {
		case op == 0 && len(u.devices) < 4: // a new device with keys
			st, out, ok := h.call(ctx, p, "POST", "/_matrix/client/v3/login", "", map[string]any{"type": "m.login.password",
				"identifier": map[string]any{"type": "m.id.user", "user": u.id}, "password": u.password})
			if ok && st == http.StatusOK {
				d := newDevice(u, out["device_id"].(string), out["access_token"].(string))
				u.devices = append(u.devices, d)
				h.call(ctx, p, "POST", "/_matrix/client/v3/keys/upload", d.Token, map[string]any{
					"device_keys": d.DeviceKeys(h.t), "one_time_keys": d.OneTimeKeys(h.t, "a", 2)})
			}
		case op == 1 && len(u.devices) > 1: // a device deleted
			i := 1 + rng.Intn(len(u.devices)-1)
			d := u.devices[i]
			body := map[string]any{"auth": map[string]any{"type": "m.login.password",
				"identifier": map[string]any{"type": "m.id.user", "user": u.id}, "password": u.password}}
			st, out, _ := h.call(ctx, p, "DELETE", "/_matrix/client/v3/devices/"+url.PathEscape(d.DeviceID), u.devices[0].Token, body)
			if st == http.StatusUnauthorized {
				if s, _ := out["session"].(string); s != "" {
					body["auth"].(map[string]any)["session"] = s
					st, _, _ = h.call(ctx, p, "DELETE", "/_matrix/client/v3/devices/"+url.PathEscape(d.DeviceID), u.devices[0].Token, body)
				}
			}
			if st == http.StatusOK || st == http.StatusNotFound {
				u.devices = append(u.devices[:i], u.devices[i+1:]...)
			}
		case op == 2: // a rename
			d := u.devices[rng.Intn(len(u.devices))]
			u.next++
			h.call(ctx, p, "PUT", "/_matrix/client/v3/devices/"+url.PathEscape(d.DeviceID), d.Token,
				map[string]any{"display_name": fmt.Sprintf("name %d", u.next)})
		default: // one-time keys
			d := u.devices[rng.Intn(len(u.devices))]
			u.next++
			h.call(ctx, p, "POST", "/_matrix/client/v3/keys/upload", d.Token,
				map[string]any{"one_time_keys": d.OneTimeKeys(h.t, "k"+strconv.Itoa(u.next)+"_", 2)})
		}
		u.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(20+rng.Intn(80)) * time.Millisecond):
		}
	}
}

// chaos breaks links and (with kills) kills daemons until ctx ends,
// restarting each killed daemon a little later.
func (h *harness) chaos(ctx context.Context, rng *rand.Rand, kills bool) {
	type restart struct {
		p  *proc
		at time.Time
	}
	var pending []restart
	modes := []faultproxy.Mode{faultproxy.Refuse, faultproxy.Hang, faultproxy.DropAnswer, faultproxy.Delay, faultproxy.Pass}
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(200+rng.Intn(600)) * time.Millisecond):
		}
		if ctx.Err() != nil {
			break
		}
		now := time.Now()
		for i := 0; i < len(pending); i++ {
			if now.After(pending[i].at) {
				pending[i].p.start(h.t)
				h.count("restart")
				pending = append(pending[:i], pending[i+1:]...)
				i--
			}
		}
		switch n := rng.Intn(10); {
		case n < 7 || !kills: // a one-way link fails, or heals
			dest := h.servers[rng.Intn(len(h.servers))]
			origin := h.servers[rng.Intn(len(h.servers))]
			if origin == dest {
				continue
			}
			f := faultproxy.Fault{Mode: modes[rng.Intn(len(modes))]}
			if f.Mode == faultproxy.Delay {
				f.Delay = time.Duration(100+rng.Intn(2000)) * time.Millisecond
			}
			dest.proxy.Set(origin.name, f)
			h.count(f.Mode.String())
		default: // a daemon killed
			s := h.servers[rng.Intn(len(h.servers))]
			victim, what := s.procs[0], ""
			if len(s.procs) > 1 {
				victim, what = h.leaseHolder(s, rng)
			}
			if victim == nil || !victim.alive() {
				continue
			}
			victim.kill()
			h.count("kill " + victim.label + what)
			pending = append(pending, restart{victim, now.Add(time.Duration(300+rng.Intn(2500)) * time.Millisecond)})
		}
	}
}

// leaseHolder returns the instance of s that sent its last transaction
// (found from the proxies' view of its connection), else one at random;
// what says which.
func (h *harness) leaseHolder(s *server, rng *rand.Rand) (_ *proc, what string) {
	h.sendMu.Lock()
	addr := h.lastSend[s.name]
	h.sendMu.Unlock()
	var pids []int
	for _, p := range s.procs {
		pids = append(pids, p.pid())
	}
	if pid := pidOfPeer(addr, pids); pid != 0 {
		for _, p := range s.procs {
			if p.pid() == pid {
				return p, " (sender)"
			}
		}
	}
	return s.procs[rng.Intn(len(s.procs))], " (at random)"
}

func (h *harness) count(what string) {
	h.faultMu.Lock()
	defer h.faultMu.Unlock()
	if h.faultCounts == nil {
		h.faultCounts = map[string]int{}
	}
	h.faultCounts[what]++
}

func (h *harness) faultSummary() string {
	h.faultMu.Lock()
	defer h.faultMu.Unlock()
	var parts []string
	for k, v := range h.faultCounts {
		parts = append(parts, fmt.Sprintf("%s %d", k, v))
	}
	sort.Strings(parts)
	return "faults: " + strings.Join(parts, ", ")
}

// view is what /keys/query on p shows of users' devices: user -> device
// -> the device's keys and display name, as canonical JSON.
func (h *harness) view(p *proc, token string, users []string) (map[string]string, error) {
	q := map[string]any{}
	for _, u := range users {
		q[u] = []string{}
	}
	st, out, err := p.call(context.Background(), "POST", "/_matrix/client/v3/keys/query", token, map[string]any{"device_keys": q})
	if err != nil || st != http.StatusOK {
		return nil, fmt.Errorf("%s: /keys/query: %d %v %v", p.label, st, out, err)
	}
	dk, _ := out["device_keys"].(map[string]any)
	res := map[string]string{}
	for _, u := range users {
		devs, _ := dk[u].(map[string]any)
		var parts []string
		for id, d := range devs {
			b, _ := json.Marshal(d) // encoding/json sorts map keys
			name, _ := d.(map[string]any)["unsigned"].(map[string]any)["device_display_name"].(string)
			parts = append(parts, fmt.Sprintf("%s(%q,%x)", id, name, sha256.Sum256(b)))
		}
		sort.Strings(parts)
		res[u] = "[" + strings.Join(parts, " ") + "]"
	}
	return res, nil
}

// agree compares every server's view (every instance's) of every remote
// user with the home server's.
func (h *harness) agree() (bool, string) {
	home := map[string]string{}
	for _, s := range h.servers {
		var ids []string
		for _, u := range s.users {
			ids = append(ids, u.id)
		}
		v, err := h.view(s.procs[0], s.users[0].devices[0].Token, ids)
		if err != nil {
			return false, err.Error()
		}
		for k, x := range v {
			home[k] = x
		}
	}
	var diffs []string
	for _, s := range h.servers {
		var remote []string
		for _, o := range h.servers {
			if o != s {
				for _, u := range o.users {
					remote = append(remote, u.id)
				}
			}
		}
		for _, p := range s.procs {
			v, err := h.view(p, s.users[0].devices[0].Token, remote)
			if err != nil {
				return false, err.Error()
			}
			for _, u := range remote {
				if v[u] != home[u] {
					diffs = append(diffs, fmt.Sprintf("%s sees %s as %s, its home as %s", p.label, u, v[u], home[u]))
				}
			}
		}
	}
	if len(diffs) > 0 {
		return false, fmt.Sprintf("%d differences; first: %s", len(diffs), diffs[0])
	}
	return true, ""
}
