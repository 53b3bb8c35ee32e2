package main

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The sync phase: many clients wait in /sync (long polls over keep-alive
// connections, one user each), then a user who shares a room with some of
// them changes a device. It reports the daemons' memory per waiting
// request, which waiters woke (those in the room, and only they, should),
// the time from the change to their answers, and, when the daemons'
// metrics are given, the database statements per woken request.

// waiter is a user with a waiting /sync.
type waiter struct {
	userID, deviceID, token string
	inRoom                  bool
	answered                atomic.Int64 // unix nanoseconds of the answer; 0 while waiting
	sawChange               atomic.Bool  // the answer named the changed user
	failed                  atomic.Value // error text of a failed request
}

// syncResult is what the sync phase measured.
type syncResult struct {
	waiters, inRoom          int
	waitingIn                time.Duration
	rssBefore, rssAfter      int64 // bytes, summed over the daemons; -1 unmeasured
	earlyAnswers             int   // waits answered before the change
	wokeInRoom, wokeOutside  int
	missedChange             int // in-room waiters woken without the change in their answer
	failures                 int
	firstFailure             string
	changeToAnswer           []time.Duration // in-room wakes, from sending the change, sorted
	statements, baselineStmt int64           // -1 unmeasured
}

// perWaiterKB is the daemons' memory per waiting request in KB; -1 when
// not measured.
func (r syncResult) perWaiterKB() float64 {
	if r.rssBefore < 0 || r.rssAfter < 0 || r.waiters == 0 {
		return -1
	}
	return float64(r.rssAfter-r.rssBefore) / 1024 / float64(r.waiters)
}

// statementsPerWake is the statements of the change beyond those of a
// change that concerns no one, per woken request; -1 when not measured.
func (r syncResult) statementsPerWake() float64 {
	woke := r.wokeInRoom + r.wokeOutside
	if r.statements < 0 || r.baselineStmt < 0 || woke == 0 {
		return -1
	}
	return float64(r.statements-r.baselineStmt) / float64(woke)
}

func (r syncResult) print(out io.Writer, grace time.Duration) {
	fmt.Fprintf(out, "sync: %d waiting /sync requests, %d of them sharing a room with the user whose device changes\n", r.waiters, r.inRoom)
	fmt.Fprintf(out, "  all waiting %s after the first was sent", r.waitingIn.Round(time.Millisecond))
	if kb := r.perWaiterKB(); kb >= 0 {
		fmt.Fprintf(out, "; daemon memory %.1f MB before, %.1f MB waiting: %.1f KB per waiting request",
			float64(r.rssBefore)/(1<<20), float64(r.rssAfter)/(1<<20), kb)
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "  woke: %d of %d in the room, %d others (watched for %s after the last), %d answered before the change\n",
		r.wokeInRoom, r.inRoom, r.wokeOutside, grace, r.earlyAnswers)
	if r.missedChange > 0 {
		fmt.Fprintf(out, "  %d woken in the room did not see the change\n", r.missedChange)
	}
	if n := len(r.changeToAnswer); n > 0 {
		at := func(p float64) float64 {
			return float64(r.changeToAnswer[min(n-1, int(p*float64(n)))].Microseconds()) / 1000
		}
		fmt.Fprintf(out, "  change to answer (ms): p50 %.2f, p99 %.2f, last %.2f\n", at(0.5), at(0.99), at(1))
	}
	if s := r.statementsPerWake(); s >= 0 {
		fmt.Fprintf(out, "  database statements per woken request: %.2f (%d over the change, %d for a change that concerns no one)\n",
			s, r.statements, r.baselineStmt)
	}
	if r.failures > 0 {
		fmt.Fprintf(out, "  failed waits: %d, first: %s\n", r.failures, r.firstFailure)
	}
}

// raiseFileLimit lifts the soft limit on open files to the hard one and
// checks that need descriptors fit.
func raiseFileLimit(need int) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return err
		}
	}
	if lim.Cur < uint64(need) {
		return fmt.Errorf("%d waiting clients need about %d open files, the limit is %d (raise it: ulimit -Hn)", need, need, lim.Cur)
	}
	return nil
}

// residentMemory is the daemons' resident memory in bytes (VmRSS).
func residentMemory(pids []int) (int64, error) {
	var total int64
	for _, pid := range pids {
		f, err := os.Open(filepath.Join(procRoot, strconv.Itoa(pid), "status"))
		if err != nil {
			return 0, err
		}
		found := false
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
				kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
				if err != nil {
					f.Close()
					return 0, fmt.Errorf("VmRSS of %d: %w", pid, err)
				}
				total += kb * 1024
				found = true
			}
		}
		f.Close()
		if !found {
			return 0, fmt.Errorf("no VmRSS for process %d", pid)
		}
	}
	return total, nil
}

// metricSum is the sum over the daemons' /metrics of an unlabelled metric.
func (b *bench) metricSum(ctx context.Context, name string) (float64, error) {
	var total float64
	for _, u := range b.o.metricsURLs {
		req, err := http.NewRequestWithContext(ctx, "GET", u, nil)
		if err != nil {
			return 0, err
		}
		resp, err := b.http.Do(req)
		if err != nil {
			return 0, err
		}
		v, err := metricValue(resp.Body, name)
		resp.Body.Close()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", u, err)
		}
		total += v
	}
	return total, nil
}

// metricValue reads an unlabelled metric from Prometheus' text format.
func metricValue(r io.Reader, name string) (float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no metric %s", name)
}

// sourceDialer spreads the connections to a loopback server over the
// source addresses 127.0.0.2 to 127.0.0.254, so that no address holds
// more than a daemon's max_connections_per_address allows (100 by
// default) and the ephemeral ports of one address do not run out.
func sourceDialer(target string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	u, err := url.Parse(target)
	ip := net.ParseIP(u.Hostname())
	if err != nil || ip == nil || ip.To4() == nil || !ip.IsLoopback() {
		return (&net.Dialer{}).DialContext
	}
	var next atomic.Int64
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		src := net.IPv4(127, 0, 0, byte(2+next.Add(1)%253))
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}}
		return d.DialContext(ctx, network, addr)
	}
}

// syncPhase runs the sync phase.
func (b *bench) syncPhase(ctx context.Context, out io.Writer) (syncResult, error) {
	o := b.o
	res := syncResult{waiters: o.syncWaiters, inRoom: min(o.syncRoom, o.syncWaiters), rssBefore: -1, rssAfter: -1,
		statements: -1, baselineStmt: -1}
	if o.adminToken == "" {
		return res, errors.New("the sync phase puts users in a room through the admin API: give -admin-token")
	}
	if err := raiseFileLimit(o.syncWaiters + 200); err != nil {
		return res, err
	}
	// Set-up: the waiters, the user whose device changes, and one who
	// shares a room with no one (the baseline of a change's cost).
	start := time.Now()
	prefix := fmt.Sprintf("sync%d", time.Now().UnixNano()%1_000_000_000)
	users := make([]*waiter, o.syncWaiters+2)
	if err := b.parallel(ctx, len(users), func(i int) error {
		var r struct {
			UserID      string `json:"user_id"`
			AccessToken string `json:"access_token"`
			DeviceID    string `json:"device_id"`
		}
		name := fmt.Sprintf("%s_%d", prefix, i)
		if err := b.do(ctx, o.urls[i%len(o.urls)], "POST", "/_matrix/client/v3/register", "", map[string]any{
			"username": name, "password": "bench-" + name, "auth": map[string]string{"type": "m.login.dummy"}}, &r); err != nil {
			return err
		}
		users[i] = &waiter{userID: r.UserID, deviceID: r.DeviceID, token: r.AccessToken}
		return nil
	}); err != nil {
		return res, fmt.Errorf("sync set-up: %w", err)
	}
	changer, loner, waiters := users[len(users)-2], users[len(users)-1], users[:o.syncWaiters]
	room := "!" + prefix + ":bench"
	inRoom := append([]*waiter{changer}, waiters[:res.inRoom]...)
	if err := b.parallel(ctx, len(inRoom), func(i int) error {
		inRoom[i].inRoom = i > 0
		return b.do(ctx, o.urls[0], "PUT", "/_keyserver/admin/v1/rooms/"+url.PathEscape(room)+"/members/"+url.PathEscape(inRoom[i].userID),
			o.adminToken, map[string]string{"membership": "join"}, nil)
	}); err != nil {
		return res, fmt.Errorf("sync set-up: %w", err)
	}
	var initial struct {
		NextBatch string `json:"next_batch"`
	}
	if err := b.do(ctx, o.urls[0], "GET", "/_matrix/client/v3/sync", waiters[0].token, nil, &initial); err != nil {
		return res, fmt.Errorf("sync set-up: %w", err)
	}
	fmt.Fprintf(out, "sync set-up: %d users, %d in a room with the one whose device changes, in %s\n",
		len(users), res.inRoom, time.Since(start).Round(time.Millisecond))

	var err error
	if len(o.pids) > 0 {
		if res.rssBefore, err = residentMemory(o.pids); err != nil {
			return res, err
		}
	}
	// The waits: one connection each, with a timeout longer than the
	// phase (the server caps it at its sync_max_timeout).
	transports := make([]*http.Transport, len(o.urls))
	for i, u := range o.urls {
		transports[i] = &http.Transport{DialContext: sourceDialer(u), MaxIdleConnsPerHost: -1, DisableCompression: true}
		defer transports[i].CloseIdleConnections()
	}
	waitCtx, stopWaits := context.WithCancel(ctx)
	defer stopWaits()
	var written atomic.Int64
	trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { written.Add(1) }}
	var wg sync.WaitGroup
	var changeSent atomic.Int64
	sent := time.Now()
	for i, w := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.wait(httptrace.WithClientTrace(waitCtx, trace), &http.Client{Transport: transports[i%len(o.urls)]},
				o.urls[i%len(o.urls)], initial.NextBatch, changer.userID, w)
		}()
	}
	// All waiting: the daemons say so, or without their metrics, every
	// request has been written (the daemon may still be reading the last).
	deadline := time.Now().Add(2*time.Minute + time.Duration(o.syncWaiters)*time.Millisecond)
	for {
		if len(o.metricsURLs) > 0 {
			n, err := b.metricSum(ctx, "keyserver_sync_waiting")
			if err != nil {
				return res, err
			}
			if int(n) >= o.syncWaiters {
				break
			}
		} else if int(written.Load()) >= o.syncWaiters {
			break
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("sync: %d of %d requests written, not all waiting after %s", written.Load(), o.syncWaiters, time.Since(sent))
		}
		time.Sleep(20 * time.Millisecond)
	}
	res.waitingIn = time.Since(sent)
	if len(o.pids) > 0 {
		if res.rssAfter, err = residentMemory(o.pids); err != nil {
			return res, err
		}
	}
	// The cost of a device change that wakes no one.
	before, statementsErr := b.metricSum(ctx, "keyserver_database_statements_total")
	if err := b.changeDevice(ctx, o.urls[0], loner); err != nil {
		return res, err
	}
	after, err := b.metricSum(ctx, "keyserver_database_statements_total")
	if statementsErr == nil && err == nil {
		res.baselineStmt = int64(after - before)
	}
	for _, w := range waiters {
		if w.answered.Load() != 0 {
			res.earlyAnswers++
		}
	}
	// The change that concerns the room.
	before, statementsErr = b.metricSum(ctx, "keyserver_database_statements_total")
	changeSent.Store(time.Now().UnixNano())
	if err := b.changeDevice(ctx, o.urls[0], changer); err != nil {
		return res, err
	}
	// Wait for the room's answers, then watch a while for others.
	deadline = time.Now().Add(o.syncTimeout)
	for {
		woke := 0
		for _, w := range waiters[:res.inRoom] {
			if w.answered.Load() != 0 || w.failed.Load() != nil {
				woke++
			}
		}
		if woke == res.inRoom || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(o.syncGrace)
	after, err = b.metricSum(ctx, "keyserver_database_statements_total")
	if statementsErr == nil && err == nil {
		res.statements = int64(after - before)
	}
	for _, w := range waiters {
		at := w.answered.Load()
		if f, ok := w.failed.Load().(string); ok {
			res.failures++
			if res.firstFailure == "" {
				res.firstFailure = f
			}
			continue
		}
		if at == 0 || at < changeSent.Load() {
			continue
		}
		if !w.inRoom {
			res.wokeOutside++
			continue
		}
		res.wokeInRoom++
		if !w.sawChange.Load() {
			res.missedChange++
		}
		res.changeToAnswer = append(res.changeToAnswer, time.Duration(at-changeSent.Load()))
	}
	slices.Sort(res.changeToAnswer)
	stopWaits()
	wg.Wait()
	return res, nil
}

// wait sends one long poll and records its answer. The poll leaves
// presence alone (set_presence=offline): a waiter's first /sync marking
// it online would answer it at once with its own presence.
func (b *bench) wait(ctx context.Context, client *http.Client, base, since, changed string, w *waiter) {
	req, err := http.NewRequestWithContext(ctx, "GET", strings.TrimRight(base, "/")+"/_matrix/client/v3/sync?timeout="+
		strconv.FormatInt(b.o.syncTimeout.Milliseconds(), 10)+"&set_presence=offline&since="+url.QueryEscape(since), nil)
	if err != nil {
		w.failed.Store(err.Error())
		return
	}
	req.Header.Set("Authorization", "Bearer "+w.token)
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			w.failed.Store(err.Error())
		}
		return
	}
	defer resp.Body.Close()
	var r struct {
		DeviceLists struct {
			Changed []string `json:"changed"`
		} `json:"device_lists"`
	}
	err = json.NewDecoder(resp.Body).Decode(&r)
	if ctx.Err() != nil {
		return // ended by the tool
	}
	at := time.Now().UnixNano()
	if resp.StatusCode != http.StatusOK || err != nil {
		w.failed.Store(fmt.Sprintf("%d %v", resp.StatusCode, err))
		return
	}
	w.sawChange.Store(slices.Contains(r.DeviceLists.Changed, changed))
	w.answered.Store(at)
}

// changeDevice uploads device keys for the user's device: a change of
// its device list.
func (b *bench) changeDevice(ctx context.Context, base string, u *waiter) error {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	d := &device{userID: u.userID, deviceID: u.deviceID, key: priv}
	curve := make([]byte, 32)
	_, _ = rand.Read(curve)
	keys := sign(map[string]any{
		"user_id": d.userID, "device_id": d.deviceID,
		"algorithms": []string{"m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"},
		"keys":       map[string]string{"curve25519:" + d.deviceID: b64(curve), "ed25519:" + d.deviceID: b64(pub)},
	}, d)
	return b.do(ctx, base, "POST", "/_matrix/client/v3/keys/upload", u.token, map[string]any{"device_keys": keys}, nil)
}

// parallel runs f(0..n-1) on the tool's clients, stopping at the first
// error.
func (b *bench) parallel(ctx context.Context, n int, f func(i int) error) error {
	var next atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	for w := 0; w < b.o.clients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n && first.Load() == nil && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				if err := f(i); err != nil {
					first.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	if err, ok := first.Load().(error); ok {
		return err
	}
	return ctx.Err()
}
