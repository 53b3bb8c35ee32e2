// Command keyserver-bench runs a reproducible end-to-end-key workload
// against any Matrix client API (this server's or another's) and reports
// requests per second, latency percentiles and errors per phase.
//
// Set-up registers users with devices, uploads really signed device keys
// and one-time keys. Then each phase runs for a fixed time with concurrent
// clients: query (keys of random users), claim (one key of a random
// device), upload (fresh one-time keys to a random device with room for
// them, as a client that reads its key count would) and mixed (80/10/10);
// on request, the room phases room-create, room-join and room-send.
// It checks
// what it measures: no claimed key may be handed out twice, and a sample of
// queried device keys must carry valid signatures. Claims that find no
// key are counted apart from the rate. Given the daemons' PIDs (and a
// local PostgreSQL's data directory) it reports their CPU time per
// request. The clients may be spread over several daemons (-url a,b,c).
// The sync phase (sync.go) holds thousands of waiting /sync requests and
// measures what one device change wakes.
package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
)

type options struct {
	urls                        []string // client API base URLs, clients spread over them
	users, devices, otks        int
	clients, queryUsers, upload int
	duration                    time.Duration
	phases                      string
	seed                        uint64
	presign                     int
	keyCap                      int
	claimStock                  int
	uploadRoom                  int
	pids                        []int  // the daemons' processes, for their CPU time
	postgresData                string // data directory of a local PostgreSQL cluster, for its CPU time
	metricsURLs                 []string
	adminToken                  string
	syncWaiters, syncRoom       int
	syncTimeout, syncGrace      time.Duration
}

func main() {
	var o options
	urls := flag.String("url", "http://127.0.0.1:8008", "client API base URL, or several separated by commas (daemons sharing "+
		"one database): client i sends to URL i modulo their number, so rates are the aggregate")
	pids := flag.String("pid", "", "process IDs of the daemons measured, separated by commas: each phase then reports their CPU time "+
		"per request (from /proc)")
	flag.StringVar(&o.postgresData, "postgres-data", "", "data `directory` of the PostgreSQL cluster the daemons use, when it runs "+
		"on this machine: each phase then reports its CPU time per request too")
	flag.IntVar(&o.uploadRoom, "upload-room", 400, "before each upload or mixed phase, keys are claimed from every device with "+
		"less than this much room below -key-cap, so that its uploads find room (0: none)")
	flag.IntVar(&o.claimStock, "claim-stock", 300, "before the first claim or mixed phase, every device is topped up to this many "+
		"one-time keys, so that claims find keys; 0 leaves the set-up keys (at most key-cap)")
	flag.IntVar(&o.users, "users", 200, "users to register")
	flag.IntVar(&o.devices, "devices", 2, "devices per user")
	flag.IntVar(&o.otks, "otks", 50, "one-time keys uploaded per device at set-up")
	flag.IntVar(&o.keyCap, "key-cap", 500, "unclaimed one-time keys a server keeps per device: uploads go to devices with room below it, "+
		"as a client uploads only when its count is low")
	flag.IntVar(&o.clients, "clients", 16, "concurrent clients")
	flag.IntVar(&o.queryUsers, "query-users", 20, "users named in each /keys/query")
	flag.IntVar(&o.upload, "upload-keys", 5, "one-time keys in each upload of the upload phase")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "length of each phase")
	flag.StringVar(&o.phases, "phases", "query,claim,upload,mixed", "phases to run, in order: query, claim, upload, mixed, "+
		"room-create, room-join, room-send, and sync (thousands of waiting /sync requests and one device change; "+
		"needs -admin-token)")
	flag.IntVar(&o.presign, "presign", 60, "upload-phase bodies signed per device before the phases start, so that "+
		"the tool's CPU during a phase goes to sending requests; more are signed as they are sent")
	flag.Uint64Var(&o.seed, "seed", 1, "seed of the random choices (the workload is reproducible)")
	fixed := flag.String("serve-fixed", "", "instead of measuring, serve fixed answers without a database on this `address`: "+
		"measuring that server gives the ceiling set by the tool itself on this machine")
	cpuProfile := flag.String("cpuprofile", "", "write the tool's own CPU profile to this `file`, to see what bounds it")
	metricsURLs := flag.String("metrics-url", "", "the daemons' Prometheus /metrics URLs, separated by commas: the sync phase "+
		"reads from them when every request waits and how many database statements a change costs")
	flag.StringVar(&o.adminToken, "admin-token", "", "the daemons' admin token: the sync phase puts users in a room with it")
	flag.IntVar(&o.syncWaiters, "sync-waiters", 10000, "sync phase: users with a waiting /sync, each on its own connection")
	flag.IntVar(&o.syncRoom, "sync-room", 100, "sync phase: waiters sharing a room with the user whose device changes")
	flag.DurationVar(&o.syncTimeout, "sync-timeout", time.Minute, "sync phase: timeout of the waiting requests "+
		"(the daemon caps it at its client_api.sync_max_timeout), and longest wait for the room's answers")
	flag.DurationVar(&o.syncGrace, "sync-grace", 2*time.Second, "sync phase: how long, after the room's answers, to watch for "+
		"other waiters waking")
	flag.Parse()
	for _, u := range strings.Split(*metricsURLs, ",") {
		if u = strings.TrimSpace(u); u != "" {
			o.metricsURLs = append(o.metricsURLs, u)
		}
	}
	var err error
	if o.urls, o.pids, err = parseTargets(*urls, *pids); err != nil {
		fmt.Fprintln(os.Stderr, "keyserver-bench:", err)
		os.Exit(2)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "keyserver-bench:", err)
			os.Exit(1)
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	if *fixed != "" {
		if err := serveFixed(*fixed); err != nil {
			fmt.Fprintln(os.Stderr, "keyserver-bench:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(context.Background(), o, os.Stdout); err != nil {
		pprof.StopCPUProfile()
		fmt.Fprintln(os.Stderr, "keyserver-bench:", err)
		os.Exit(1)
	}
}

// device is a logged-in device with its signing key.
type device struct {
	userID, deviceID, token string
	key                     ed25519.PrivateKey
	nextKey                 atomic.Int64
	presigned               [][]byte // upload bodies signed in advance
	nextPresigned           atomic.Int64
	// unclaimed is the device's signed_curve25519 count as the server last
	// reported it. Claims since can only have lowered it.
	unclaimed atomic.Int64
}

// uploadBody returns the body of an upload of n fresh one-time keys: one
// signed in advance while they last, then one signed now.
func (d *device) uploadBody(n int) []byte {
	if i := d.nextPresigned.Add(1) - 1; i < int64(len(d.presigned)) {
		return d.presigned[i]
	}
	return d.signedUpload(n)
}

func (d *device) signedUpload(n int) []byte {
	body := append([]byte(`{"one_time_keys":`), d.oneTimeKeys(n)...)
	return append(body, '}')
}

type bench struct {
	o       options
	http    *http.Client
	devices []*device
	users   []string

	claimedMu sync.Mutex
	claimed   map[string]bool // every one-time key handed out
	twice     atomic.Int64
	verified  atomic.Int64
	badSigs   atomic.Int64

	cpu  cpuMeter
	pool *roomPool // the rooms of the room phases (see rooms.go)
}

func run(ctx context.Context, o options, out io.Writer) error {
	b := &bench{o: o, claimed: map[string]bool{}, cpu: cpuMeter{pids: o.pids, postgresData: o.postgresData}, http: &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: o.clients * 2, MaxConnsPerHost: o.clients * 2},
	}}
	start := time.Now()
	if err := b.setup(ctx); err != nil {
		return err
	}
	fmt.Fprintf(out, "set-up: %d users, %d devices, %d one-time keys each, in %s\n",
		o.users, len(b.devices), o.otks, time.Since(start).Round(time.Millisecond))
	if usesRooms(o.phases) {
		if err := b.setupRooms(ctx); err != nil {
			return err
		}
	}
	var results []phaseResult
	var syncRes *syncResult
	stocked := false
	for _, name := range strings.Split(o.phases, ",") {
		if name == "sync" {
			if o.adminToken == "" {
				// As against the server of fixed answers, which has no /sync.
				fmt.Fprintln(out, "sync: skipped: it puts users in a room through the admin API, give -admin-token")
				continue
			}
			r, err := b.syncPhase(ctx, out)
			if err != nil {
				return err
			}
			syncRes = &r
			continue
		}
		op, ok := b.ops()[name]
		if !ok {
			return fmt.Errorf("unknown phase %q", name)
		}
		if (name == "claim" || name == "mixed") && !stocked && o.claimStock > 0 {
			stocked = true
			t := time.Now()
			if err := b.stock(ctx); err != nil {
				return err
			}
			fmt.Fprintf(out, "claim stock: every device topped up to %d one-time keys in %s\n", o.claimStock,
				time.Since(t).Round(time.Millisecond))
		}
		if (name == "upload" || name == "mixed") && o.uploadRoom > 0 {
			t := time.Now()
			if err := b.makeRoom(ctx); err != nil {
				return err
			}
			fmt.Fprintf(out, "upload room: every device at most %d one-time keys in %s\n", o.keyCap-o.uploadRoom,
				time.Since(t).Round(time.Millisecond))
		}
		r, err := b.phase(ctx, name, op, out)
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	if len(results) > 0 {
		printResults(out, results, o)
	}
	if syncRes != nil {
		syncRes.print(out, o.syncGrace)
	}
	fmt.Fprintf(out, "keys handed out twice: %d; device signatures checked: %d, bad: %d\n",
		b.twice.Load(), b.verified.Load(), b.badSigs.Load())
	if b.twice.Load() > 0 || b.badSigs.Load() > 0 {
		return errors.New("the server handed out a key twice or served a bad signature")
	}
	return nil
}

// printResults prints the table of the phases, the empty claims and
// refused uploads, and the CPU time per request when it was measured.
func printResults(out io.Writer, results []phaseResult, o options) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\trequests\treq/s\tp50 ms\tp90 ms\tp99 ms\terrors\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.2f\t%.2f\t%.2f\t%d\t\n", r.name, r.requests, r.rate, r.p50, r.p90, r.p99, r.errors)
	}
	tw.Flush()
	empty, full := 0, 0
	for _, r := range results {
		empty, full = empty+r.empty, full+r.full
	}
	fmt.Fprintf(out, "claims that found no key (not in requests or req/s): %d\n", empty)
	fmt.Fprintf(out, "uploads refused with every device at the cap (not in requests or req/s): %d\n", full)
	printCPU(out, results, len(o.pids))
}

// do sends a JSON request (a value to encode, or []byte sent as it is) and
// decodes a 200 answer.
func (b *bench) do(ctx context.Context, base, method, path, token string, body, out any) error {
	js, err := encodeBody(body)
	if err != nil {
		return err
	}
	var rd io.Reader
	if js != nil {
		rd = bytes.NewReader(js)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(base, "/")+path, rd)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return answer(method, path, resp.StatusCode, raw, out)
}

// send is a phase's request: on the client's own connection (conn.go).
func (c *client) send(ctx context.Context, method, path, token string, body, out any) error {
	js, err := encodeBody(body)
	if err != nil {
		return err
	}
	if c.conn == nil {
		if c.conn, err = newClientConn(c.url, nil); err != nil {
			return err
		}
	}
	status, raw, err := c.conn.do(ctx, method, path, token, js)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	return answer(method, path, status, raw, out)
}

// encodeBody is a request's body: raw bytes as they are, anything else
// as JSON, nil for none.
func encodeBody(body any) ([]byte, error) {
	if raw, ok := body.([]byte); ok {
		return raw, nil
	}
	if body == nil {
		return nil, nil
	}
	return json.Marshal(body)
}

// answer checks an answer's status and decodes its body into out.
func answer(method, path string, status int, raw []byte, out any) error {
	if status == http.StatusTooManyRequests && (strings.HasSuffix(path, "/register") || strings.HasSuffix(path, "/login")) {
		return fmt.Errorf("%s %s: %d %s (set-up registers and logs in every user from one address: start the daemon "+
			"with --client-api-registration-rate-limit-per-second 0 --client-api-login-rate-limit-per-second 0, as scripts/bench.sh does)",
			method, path, status, bytes.TrimSpace(raw))
	}
	if status != http.StatusOK {
		return &statusError{method: method, path: path, status: status, body: bytes.TrimSpace(raw)}
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

// statusError is an answer other than 200 OK.
type statusError struct {
	method, path string
	status       int
	body         []byte
}

func (e *statusError) Error() string {
	return fmt.Sprintf("%s %s: %d %s", e.method, e.path, e.status, e.body)
}

// errcode is the Matrix error code of the answer, if it has one.
func (e *statusError) errcode() string {
	var m struct {
		Errcode string `json:"errcode"`
	}
	_ = json.Unmarshal(e.body, &m)
	return m.Errcode
}

func b64(p []byte) string { return base64.RawStdEncoding.EncodeToString(p) }

func sign(obj map[string]any, d *device) map[string]any {
	raw, _ := json.Marshal(obj)
	signed, err := gomatrixserverlib.SignJSON(d.userID, gomatrixserverlib.KeyID("ed25519:"+d.deviceID), d.key, raw)
	if err != nil {
		panic(err) // a map of plain values always signs
	}
	var o map[string]any
	_ = json.Unmarshal(signed, &o)
	return o
}

// oneTimeKeys returns n fresh signed one-time keys as a JSON object. It is
// built as bytes and each key signed as it is sent, so that the tool's own
// CPU goes to signing rather than to re-encoding maps.
func (d *device) oneTimeKeys(n int) json.RawMessage {
	keyID := gomatrixserverlib.KeyID("ed25519:" + d.deviceID)
	body := make([]byte, 0, n*200)
	body = append(body, '{')
	k := make([]byte, 32)
	for i := 0; i < n; i++ {
		_, _ = rand.Read(k)
		signed, err := gomatrixserverlib.SignJSON(d.userID, keyID, d.key, []byte(`{"key":"`+b64(k)+`"}`))
		if err != nil {
			panic(err) // a fixed, valid object always signs
		}
		if i > 0 {
			body = append(body, ',')
		}
		body = fmt.Appendf(body, `"signed_curve25519:B%08d":`, d.nextKey.Add(1))
		body = append(body, signed...)
	}
	return append(body, '}')
}

// setup registers the users and devices and uploads their keys, with the
// same concurrency as the phases.
func (b *bench) setup(ctx context.Context) error {
	prefix := fmt.Sprintf("bench%d", time.Now().UnixNano()%1_000_000_000)
	jobs := make(chan int)
	errc := make(chan error, b.o.clients)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := 0; w < b.o.clients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				devices, err := b.setupUser(ctx, b.o.urls[i%len(b.o.urls)], fmt.Sprintf("%s_%d", prefix, i))
				if err != nil {
					errc <- err
					return
				}
				mu.Lock()
				b.devices = append(b.devices, devices...)
				b.users = append(b.users, devices[0].userID)
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < b.o.users; i++ {
		select {
		case jobs <- i:
		case err := <-errc:
			close(jobs)
			wg.Wait()
			return fmt.Errorf("set-up: %w", err)
		}
	}
	close(jobs)
	wg.Wait()
	select {
	case err := <-errc:
		return fmt.Errorf("set-up: %w", err)
	default:
	}
	// A fixed order makes the random choices reproducible.
	sort.Slice(b.devices, func(i, j int) bool {
		return b.devices[i].userID+b.devices[i].deviceID < b.devices[j].userID+b.devices[j].deviceID
	})
	sort.Strings(b.users)
	b.presign()
	return nil
}

// presign signs the upload bodies of the phases in advance, on every core.
func (b *bench) presign() {
	if !slices.ContainsFunc(strings.Split(b.o.phases, ","), func(p string) bool { return p == "upload" || p == "mixed" }) {
		return
	}
	var wg sync.WaitGroup
	next := atomic.Int64{}
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(b.devices); i = int(next.Add(1) - 1) {
				d := b.devices[i]
				for j := 0; j < b.o.presign; j++ {
					d.presigned = append(d.presigned, d.signedUpload(b.o.upload))
				}
			}
		}()
	}
	wg.Wait()
}

func (b *bench) setupUser(ctx context.Context, base, name string) ([]*device, error) {
	var out []*device
	password := "bench-" + name
	for i := 0; i < b.o.devices; i++ {
		var r struct {
			UserID      string `json:"user_id"`
			AccessToken string `json:"access_token"`
			DeviceID    string `json:"device_id"`
		}
		var err error
		if i == 0 {
			err = b.do(ctx, base, "POST", "/_matrix/client/v3/register", "", map[string]any{
				"username": name, "password": password, "auth": map[string]string{"type": "m.login.dummy"}}, &r)
		} else {
			err = b.do(ctx, base, "POST", "/_matrix/client/v3/login", "", map[string]any{"type": "m.login.password",
				"identifier": map[string]string{"type": "m.id.user", "user": name}, "password": password}, &r)
		}
		if err != nil {
			return nil, err
		}
		_, priv, _ := ed25519.GenerateKey(rand.Reader)
		d := &device{userID: r.UserID, deviceID: r.DeviceID, token: r.AccessToken, key: priv}
		curve := make([]byte, 32)
		_, _ = rand.Read(curve)
		keys := sign(map[string]any{
			"user_id": d.userID, "device_id": d.deviceID,
			"algorithms": []string{"m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"},
			"keys":       map[string]string{"curve25519:" + d.deviceID: b64(curve), "ed25519:" + d.deviceID: b64(priv.Public().(ed25519.PublicKey))},
		}, d)
		var counts uploadCounts
		if err := b.do(ctx, base, "POST", "/_matrix/client/v3/keys/upload", d.token,
			map[string]any{"device_keys": keys, "one_time_keys": d.oneTimeKeys(b.o.otks)}, &counts); err != nil {
			return nil, err
		}
		d.unclaimed.Store(counts.OneTimeKeyCounts["signed_curve25519"])
		out = append(out, d)
	}
	return out, nil
}

// client is one of a phase's concurrent clients: its random source and
// the server it sends to.
type client struct {
	rng  *mrand.Rand
	url  string
	conn *clientConn // made at the client's first request
}

// op is one request of a phase, by a client.
type op func(ctx context.Context, c *client) error

func (b *bench) ops() map[string]op {
	m := map[string]op{"query": b.query, "claim": b.claim, "upload": b.uploadKeys,
		"room-create": b.roomCreate, "room-join": b.roomJoin, "room-send": b.roomSend}
	m["mixed"] = func(ctx context.Context, c *client) error {
		switch n := c.rng.IntN(10); {
		case n < 8:
			return b.query(ctx, c)
		case n < 9:
			return b.claim(ctx, c)
		default:
			return b.uploadKeys(ctx, c)
		}
	}
	return m
}

func (b *bench) query(ctx context.Context, c *client) error {
	rng := c.rng
	d := b.devices[rng.IntN(len(b.devices))]
	users := map[string][]string{}
	for len(users) < min(b.o.queryUsers, len(b.users)) {
		users[b.users[rng.IntN(len(b.users))]] = []string{}
	}
	var r struct {
		DeviceKeys map[string]map[string]json.RawMessage `json:"device_keys"`
	}
	// Only a sample of answers is decoded and checked, so the tool spends
	// its CPU on sending load rather than on parsing.
	sample := rng.IntN(50) == 0
	var out any
	if sample {
		out = &r
	}
	if err := c.send(ctx, "POST", "/_matrix/client/v3/keys/query", d.token, map[string]any{"device_keys": users}, out); err != nil {
		return err
	}
	if sample { // check every signature of this answer
		for u, devices := range r.DeviceKeys {
			for id, raw := range devices {
				b.verified.Add(1)
				if !validSelfSignature(u, id, raw) {
					b.badSigs.Add(1)
				}
			}
		}
	}
	return nil
}

func validSelfSignature(userID, deviceID string, raw json.RawMessage) bool {
	var k struct {
		Keys map[string]string `json:"keys"`
	}
	if json.Unmarshal(raw, &k) != nil {
		return false
	}
	pub, err := base64.RawStdEncoding.DecodeString(k.Keys["ed25519:"+deviceID])
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return false
	}
	return gomatrixserverlib.VerifyJSON(userID, gomatrixserverlib.KeyID("ed25519:"+deviceID), pub, raw) == nil
}

// errEmptyClaim is a claim answered without a key: counted apart, not in
// the phase's rate.
var errEmptyClaim = errors.New("claim found no key")

func (b *bench) claim(ctx context.Context, c *client) error {
	claimer := b.devices[c.rng.IntN(len(b.devices))]
	target := b.deviceWithKeys(c.rng)
	var r struct {
		OneTimeKeys map[string]map[string]map[string]json.RawMessage `json:"one_time_keys"`
	}
	if err := c.send(ctx, "POST", "/_matrix/client/v3/keys/claim", claimer.token, map[string]any{
		"one_time_keys": map[string]any{target.userID: map[string]string{target.deviceID: "signed_curve25519"}}}, &r); err != nil {
		return err
	}
	keys := r.OneTimeKeys[target.userID][target.deviceID]
	if len(keys) == 0 {
		return errEmptyClaim
	}
	target.unclaimed.Add(-1)
	b.recordClaimed(target, keys)
	return nil
}

// deviceWithKeys picks a random device, or the next one after it that
// has a one-time key left as far as the tool knows (it is the only
// claimer); the random one if none has.
func (b *bench) deviceWithKeys(rng *mrand.Rand) *device {
	first := rng.IntN(len(b.devices))
	for j := range b.devices {
		if d := b.devices[(first+j)%len(b.devices)]; d.unclaimed.Load() > 0 {
			return d
		}
	}
	return b.devices[first]
}

// stock tops every device up to claim-stock one-time keys, so that the
// claims of the phases that follow find keys.
func (b *bench) stock(ctx context.Context) error {
	const perUpload = 50
	next := atomic.Int64{}
	errc := make(chan error, b.o.clients)
	var wg sync.WaitGroup
	for w := 0; w < b.o.clients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(b.devices); i = int(next.Add(1) - 1) {
				d := b.devices[i]
				for need := int64(b.o.claimStock) - d.unclaimed.Load(); need > 0; need -= perUpload {
					var counts uploadCounts
					if err := b.do(ctx, b.o.urls[i%len(b.o.urls)], "POST", "/_matrix/client/v3/keys/upload", d.token,
						d.signedUpload(int(min(need, perUpload))), &counts); err != nil {
						errc <- err
						return
					}
					d.unclaimed.Store(counts.OneTimeKeyCounts["signed_curve25519"])
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errc:
		return fmt.Errorf("claim stock: %w", err)
	default:
		return nil
	}
}

// makeRoom claims keys from every device holding more than key-cap less
// upload-room, until none does: an upload phase at thousands of uploads a
// second fills every device to the cap within seconds otherwise, and its
// uploads then fail, where real devices upload as others claim. Each
// request claims a key of every device still over the mark; the keys
// count as handed out (a key handed out twice is still an error).
func (b *bench) makeRoom(ctx context.Context) error {
	mark := int64(b.o.keyCap - b.o.uploadRoom)
	for {
		req := map[string]map[string]string{}
		var over []*device
		for _, d := range b.devices {
			if d.unclaimed.Load() > mark {
				if req[d.userID] == nil {
					req[d.userID] = map[string]string{}
				}
				req[d.userID][d.deviceID] = "signed_curve25519"
				over = append(over, d)
			}
		}
		if len(over) == 0 {
			return nil
		}
		var r struct {
			OneTimeKeys map[string]map[string]map[string]json.RawMessage `json:"one_time_keys"`
		}
		if err := b.do(ctx, b.o.urls[0], "POST", "/_matrix/client/v3/keys/claim", b.devices[0].token,
			map[string]any{"one_time_keys": req}, &r); err != nil {
			return fmt.Errorf("upload room: %w", err)
		}
		for _, d := range over {
			keys := r.OneTimeKeys[d.userID][d.deviceID]
			if len(keys) == 0 {
				d.unclaimed.Store(0) // the tool counted keys the server did not have
				continue
			}
			d.unclaimed.Add(-1)
			b.recordClaimed(d, keys)
		}
	}
}

// recordClaimed notes keys handed out for a device, counting any handed
// out before.
func (b *bench) recordClaimed(d *device, keys map[string]json.RawMessage) {
	b.claimedMu.Lock()
	defer b.claimedMu.Unlock()
	for id := range keys {
		k := d.userID + "|" + d.deviceID + "|" + id
		if b.claimed[k] {
			b.twice.Add(1)
		}
		b.claimed[k] = true
	}
}

// deviceWithRoom picks a random device, or the next one after it that has
// room for n more keys below the cap, and reserves that room (its count
// goes up by n at once, so that clients uploading at the same moment do
// not fill one device past the cap between them); the random one, with
// nothing reserved, if none has room.
func (b *bench) deviceWithRoom(rng *mrand.Rand, n int) (d *device, reserved bool) {
	first := rng.IntN(len(b.devices))
	for j := range b.devices {
		d := b.devices[(first+j)%len(b.devices)]
		for {
			cur := d.unclaimed.Load()
			if cur+int64(n) > int64(b.o.keyCap) {
				break
			}
			if d.unclaimed.CompareAndSwap(cur, cur+int64(n)) {
				return d, true
			}
		}
	}
	return b.devices[first], false
}

// uploadCounts is the answer to an upload.
type uploadCounts struct {
	OneTimeKeyCounts map[string]int64 `json:"one_time_key_counts"`
}

// errUploadFull is an upload refused by the server's cap (400
// M_INVALID_PARAM): counted apart, not in the phase's rate. It means the
// room made before the phase (-upload-room) ran out, not that the server
// failed: either the tool had found no device with room, or the device it
// had reserved room on was filled by such an upload sent at the same
// moment (one sent without room succeeds while reservations are in flight).
var errUploadFull = errors.New("upload refused: every device was at the cap")

// uploadKeys uploads fresh keys to a random device that has room for them
// below the server's cap: at thousands of uploads a second, random devices
// would otherwise reach the cap within a phase, which no client does (it
// uploads when its count runs low). When no device has room the upload
// goes ahead, and its refusal is counted apart (errUploadFull).
func (b *bench) uploadKeys(ctx context.Context, c *client) error {
	d, reserved := b.deviceWithRoom(c.rng, b.o.upload)
	var counts uploadCounts
	if err := c.send(ctx, "POST", "/_matrix/client/v3/keys/upload", d.token, d.uploadBody(b.o.upload), &counts); err != nil {
		var se *statusError
		if errors.As(err, &se) && se.status == http.StatusBadRequest && se.errcode() == "M_INVALID_PARAM" {
			// The server holds as many keys as it takes: the device is
			// full, whatever the tool had counted. Giving the reserved
			// room back would have the tool count room the server does not
			// have, and every later upload there refused.
			d.noteUploadCount(int64(b.o.keyCap))
			return errUploadFull
		}
		if reserved {
			d.unclaimed.Add(-int64(b.o.upload)) // the keys did not go in
		}
		return err
	}
	if n, ok := counts.OneTimeKeyCounts["signed_curve25519"]; ok {
		d.noteUploadCount(n)
	}
	return nil
}

// noteUploadCount takes the count an upload's answer gives when it is
// higher than the tool's (a claim the tool counted may have handed out the
// fallback key instead). A lower one is not taken: it leaves out the room
// other clients have reserved on the device for uploads still in flight,
// and taking it let them fill the device past the cap.
func (d *device) noteUploadCount(n int64) {
	for {
		cur := d.unclaimed.Load()
		if n <= cur || d.unclaimed.CompareAndSwap(cur, n) {
			return
		}
	}
}

type phaseResult struct {
	name             string
	requests, errors int
	empty            int // claims answered without a key: not in requests or rate
	full             int // uploads refused with every device full: not in requests or rate
	rate             float64
	p50, p90, p99    float64 // milliseconds
	// CPU time per request answered (empty claims and refused uploads
	// included) in µs, of the daemons, of PostgreSQL and of the tool; -1
	// when not measured.
	daemonCPU, postgresCPU, toolCPU float64
}

// printCPU prints the CPU time per request of each phase.
func printCPU(out io.Writer, results []phaseResult, daemons int) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "phase\tdaemon CPU µs/req (%d)\tPostgreSQL CPU µs/req\ttool CPU µs/req\t\n", daemons)
	us := func(v float64) string {
		if v < 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f", v)
	}
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", r.name, us(r.daemonCPU), us(r.postgresCPU), us(r.toolCPU))
	}
	tw.Flush()
}

// phase runs op from every client for the phase's duration, printing a
// progress line each second. A request under way when the time is up is
// let finish, and counted: the next phase starts on an idle daemon, not
// beside this one's last requests.
func (b *bench) phase(ctx context.Context, name string, op op, out io.Writer) (phaseResult, error) {
	cpuBefore, err := b.cpu.read()
	if err != nil {
		return phaseResult{}, err
	}
	timeUp, cancel := context.WithTimeout(ctx, b.o.duration)
	defer cancel()
	var done, failed, empty, full atomic.Int64
	lat := make([][]time.Duration, b.o.clients)
	firstErr := atomic.Value{}
	var wg sync.WaitGroup
	start := time.Now()
	for c := 0; c < b.o.clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := &client{rng: mrand.New(mrand.NewPCG(b.o.seed, uint64(c)+uint64(len(name))<<32)), url: b.o.urls[c%len(b.o.urls)]}
			defer func() {
				if cl.conn != nil {
					cl.conn.close()
				}
			}()
			for timeUp.Err() == nil {
				t := time.Now()
				err := op(ctx, cl)
				if ctx.Err() != nil {
					return // the run was stopped
				}
				if errors.Is(err, errEmptyClaim) {
					empty.Add(1)
					continue
				}
				if errors.Is(err, errUploadFull) {
					full.Add(1)
					continue
				}
				lat[c] = append(lat[c], time.Since(t))
				done.Add(1)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
		}()
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		for {
			select {
			case <-timeUp.Done():
				return
			case <-tick.C:
				el := time.Since(start).Seconds()
				fmt.Fprintf(out, "  %-6s %4.0fs  %7d requests  %7.0f req/s  %d errors\n", name, el, done.Load(), float64(done.Load())/el, failed.Load())
			}
		}
	}()
	wg.Wait()
	elapsed := time.Since(start)
	<-progressDone // its last line may still be being written to out
	cpuAfter, err := b.cpu.read()
	if err != nil {
		return phaseResult{}, err
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	pct := func(p float64) float64 {
		if len(all) == 0 {
			return 0
		}
		return float64(all[min(len(all)-1, int(p*float64(len(all))))].Microseconds()) / 1000
	}
	if e, ok := firstErr.Load().(string); ok {
		fmt.Fprintf(out, "  %s: first error: %s\n", name, e)
	}
	if n := empty.Load(); n > 0 {
		fmt.Fprintf(out, "  %s: %d claims found no key (not counted in the rate)\n", name, n)
	}
	if n := full.Load(); n > 0 {
		fmt.Fprintf(out, "  %s: %d uploads found every device at the cap and were refused (not counted in the rate): "+
			"the room made before the phase ran out (-upload-room; more -devices make more)\n", name, n)
	}
	answered := len(all) + int(empty.Load()) + int(full.Load())
	return phaseResult{name: name, requests: len(all), errors: int(failed.Load()), empty: int(empty.Load()), full: int(full.Load()),
		rate: float64(len(all)) / elapsed.Seconds(), p50: pct(0.50), p90: pct(0.90), p99: pct(0.99),
		daemonCPU:   perRequest(cpuBefore.daemons, cpuAfter.daemons, answered),
		postgresCPU: perRequest(cpuBefore.postgres, cpuAfter.postgres, answered),
		toolCPU:     perRequest(cpuBefore.tool, cpuAfter.tool, answered)}, nil
}

// serveFixed answers the workload's requests with fixed bodies and no
// work: the ceiling any server can reach with this tool on this machine.
func serveFixed(addr string) error { return http.ListenAndServe(addr, fixedHandler()) }

// fixedHandler is the server of fixed answers.
func fixedHandler() http.Handler {
	var n atomic.Int64
	answer := func(body string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, body)
		}
	}
	mux := http.NewServeMux()
	login := func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"user_id":"@u%[1]d:fixed","access_token":"t%[1]d","device_id":"D%[1]d"}`, n.Add(1))
	}
	mux.HandleFunc("POST /_matrix/client/v3/register", login)
	mux.HandleFunc("POST /_matrix/client/v3/login", login)
	mux.HandleFunc("POST /_matrix/client/v3/keys/upload", answer(`{"one_time_key_counts":{"signed_curve25519":50}}`))
	mux.HandleFunc("POST /_matrix/client/v3/keys/query", answer(`{"device_keys":{},"failures":{}}`))
	// A claim gets one key per device named, each with a new ID, as a
	// server with keys to spare answers: decoding the small request is
	// part of the floor.
	var keyID atomic.Int64
	mux.HandleFunc("POST /_matrix/client/v3/keys/claim", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			OneTimeKeys map[string]map[string]string `json:"one_time_keys"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		keys := map[string]map[string]map[string]any{}
		for u, devices := range req.OneTimeKeys {
			keys[u] = map[string]map[string]any{}
			for d, alg := range devices {
				keys[u][d] = map[string]any{fmt.Sprintf("%s:F%d", alg, keyID.Add(1)): map[string]string{"key": "fixed"}}
			}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"one_time_keys": keys, "failures": map[string]any{}})
	})
	var roomN atomic.Int64
	mux.HandleFunc("POST /_matrix/client/v3/createRoom", func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"room_id":"!r%d:fixed"}`, roomN.Add(1))
	})
	mux.HandleFunc("POST /_matrix/client/v3/rooms/{room}/join", answer(`{"room_id":"!r1:fixed"}`))
	mux.HandleFunc("PUT /_matrix/client/v3/rooms/{room}/send/{type}/{txn}", answer(`{"event_id":"$fixed"}`))
	mux.HandleFunc("GET /health", answer(`{"status":"ok"}`))
	return mux
}
