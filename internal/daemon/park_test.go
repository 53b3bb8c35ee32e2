package daemon_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/metrics"
	kstest "github.com/keyserver/keyserver/internal/testutil"
)

// countingClient is an HTTP client that counts the connections it dials.
func countingClient() (*http.Client, *atomic.Int32) {
	var dials atomic.Int32
	d := &net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return d.DialContext(ctx, network, addr)
	}}
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}, &dials
}

func syncPath(since any, timeoutMS int) string {
	return fmt.Sprintf("/_matrix/client/v3/sync?since=%s&timeout=%d", since, timeoutMS)
}

// rawSync sends a /sync request on c as it is (HTTP version and headers
// as given).
func rawSync(t *testing.T, c net.Conn, proto, token string, since any, timeoutMS int, extra string) {
	t.Helper()
	req := fmt.Sprintf("GET %s %s\r\nHost: keyserver\r\nAuthorization: Bearer %s\r\n%s\r\n", syncPath(since, timeoutMS), proto, token, extra)
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatalf("send sync: %v", err)
	}
}

func readJSON(t *testing.T, resp *http.Response) map[string]any {
	t.Helper()
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("answer is not JSON: %v", err)
	}
	return body
}

func changed(body map[string]any) []any {
	dl, _ := body["device_lists"].(map[string]any)
	ch, _ := dl["changed"].([]any)
	return ch
}

// A waiting /sync parks its connection; a device change of a room mate
// wakes it with the change, with the headers and status of any answer,
// and the same keep-alive connection then serves the client's next
// request.
func TestParkedSyncAnswersAndKeepsConnection(t *testing.T) {
	kstest.ForEachDatabase(t, func(t *testing.T, db kstest.Database) {
		n := kstest.StartNode(t, db, nil)
		alice := n.Register(t, "alice", "")
		bob := n.Register(t, "bob", "")
		n.Join(t, "!room:"+n.ServerName, alice.UserID)
		n.Join(t, "!room:"+n.ServerName, bob.UserID)
		first := n.Must(t, "GET", "/_matrix/client/v3/sync", alice.Token, nil)

		client, dials := countingClient()
		req, _ := http.NewRequest("GET", n.URL+syncPath(first["next_batch"], 20000), nil)
		req.Header.Set("Authorization", "Bearer "+alice.Token)
		type result struct {
			resp *http.Response
			err  error
		}
		done := make(chan result, 1)
		go func() {
			resp, err := client.Do(req)
			done <- result{resp, err}
		}()
		kstest.Eventually(t, "the sync parked", func() bool { return n.Daemon.ParkedSyncs() == 1 })
		n.Login(t, bob, "BOBPHONE") // bob's device list changes
		var res result
		select {
		case res = <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the parked sync was not woken")
		}
		if res.err != nil {
			t.Fatalf("parked sync: %v", res.err)
		}
		if res.resp.StatusCode != http.StatusOK {
			t.Fatalf("parked sync: status %d", res.resp.StatusCode)
		}
		h := res.resp.Header
		if h.Get("Content-Type") != "application/json" || h.Get("Access-Control-Allow-Origin") != "*" || h.Get("X-Request-Id") == "" {
			t.Fatalf("parked sync's headers: %v", h)
		}
		body := readJSON(t, res.resp)
		if ch := changed(body); len(ch) != 1 || ch[0] != bob.UserID {
			t.Fatalf("device_lists.changed %v, want [%s]", ch, bob.UserID)
		}
		if n.Daemon.ParkedSyncs() != 0 {
			t.Fatalf("%d syncs still parked", n.Daemon.ParkedSyncs())
		}

		// The next request goes over the same connection.
		var reused bool
		req, _ = http.NewRequest("GET", n.URL+syncPath(body["next_batch"], 0), nil)
		req.Header.Set("Authorization", "Bearer "+alice.Token)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("next request: %v", err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("next request: status %d", resp.StatusCode)
		}
		readJSON(t, resp)
		if !reused || dials.Load() != 1 {
			t.Fatalf("next request reused the connection: %v, connections dialled: %d", reused, dials.Load())
		}
	})
}

// A parked sync that times out answers as an ordinary sync with nothing
// new: the same next_batch an immediate sync gives.
func TestParkedSyncTimesOut(t *testing.T) {
	kstest.ForEachDatabase(t, func(t *testing.T, db kstest.Database) {
		n := kstest.StartNode(t, db, nil)
		alice := n.Register(t, "alice", "")
		first := n.Must(t, "GET", "/_matrix/client/v3/sync", alice.Token, nil)
		start := time.Now()
		waited := n.Must(t, "GET", syncPath(first["next_batch"], 400), alice.Token, nil)
		if d := time.Since(start); d < 400*time.Millisecond {
			t.Fatalf("answered after %s, before the timeout", d)
		}
		now := n.Must(t, "GET", syncPath(first["next_batch"], 0), alice.Token, nil)
		if waited["next_batch"] != now["next_batch"] || waited["next_batch"] == nil {
			t.Fatalf("timed-out next_batch %v, immediate %v", waited["next_batch"], now["next_batch"])
		}
		if len(changed(waited)) != 0 {
			t.Fatalf("timed-out sync reports changes: %v", waited)
		}
		wj, _ := json.Marshal(waited)
		nj, _ := json.Marshal(now)
		if string(wj) != string(nj) {
			t.Fatalf("timed-out answer %s differs from an immediate one %s", wj, nj)
		}
	})
}

// liveMemory is the process's heap in use and goroutine stacks, after a
// collection.
func liveMemory() int64 {
	runtime.GC()
	runtime.GC() // and what sync.Pools kept through the first
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc + m.StackInuse)
}

// Parked requests hold no goroutine: the goroutines of the server stay
// where they were with N requests parked, and their memory is a few
// kilobytes each.
func TestParkedSyncsHoldNoGoroutine(t *testing.T) {
	const N = 200
	n := kstest.StartNode(t, kstest.SQLite(t), func(c *config.Config) { c.ClientAPI.MaxConnectionsPerAddress = 0 })
	alice := n.Register(t, "alice", "")
	first := n.Must(t, "GET", "/_matrix/client/v3/sync", alice.Token, nil)
	before := runtime.NumGoroutine()
	memBefore := liveMemory()
	addr := strings.TrimPrefix(n.URL, "http://")
	conns := make([]net.Conn, N)
	for i := range conns {
		conns[i] = dialFrom(t, "127.0.0.1", addr)
		rawSync(t, conns[i], "HTTP/1.1", alice.Token, first["next_batch"], 60000, "")
	}
	kstest.Eventually(t, "all parked", func() bool { return n.Daemon.ParkedSyncs() == N })
	// The clients' own connections are N goroutines of nothing here (the
	// client side is raw sockets); the server's may linger an instant
	// after handing the connection over.
	var now int
	kstest.Eventually(t, "goroutines back", func() bool { now = runtime.NumGoroutine(); return now <= before+10 })
	t.Logf("goroutines: %d before, %d with %d syncs parked", before, now, N)
	// What they hold, heap and stacks, the test's own sockets included.
	perWaiter := float64(liveMemory()-memBefore) / N
	t.Logf("live memory per parked sync: %.0f bytes", perWaiter)
	if perWaiter > 10<<10 {
		t.Errorf("live memory per parked sync: %.0f bytes, want at most 10 KB", perWaiter)
	}
	// A change wakes them all, and each gets its answer.
	n.Login(t, alice, "SECOND")
	for i, c := range conns {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("sync %d: %v", i, err)
		}
		if ch := changed(readJSON(t, resp)); len(ch) != 1 || ch[0] != alice.UserID {
			t.Fatalf("sync %d: changed %v", i, ch)
		}
	}
}

// A client that leaves while its sync is parked holds its connection slot
// until the sync's timeout at the latest, then nothing.
func TestParkedSyncClientLeaves(t *testing.T) {
	kstest.ForEachDatabase(t, func(t *testing.T, db kstest.Database) {
		n := kstest.StartNode(t, db, func(c *config.Config) { c.ClientAPI.MaxConnectionsPerAddress = 1 })
		alice := n.Register(t, "alice", "")
		first := n.Must(t, "GET", "/_matrix/client/v3/sync", alice.Token, nil)
		addr := strings.TrimPrefix(n.URL, "http://")
		c := dialFrom(t, "127.0.0.7", addr)
		rawSync(t, c, "HTTP/1.1", alice.Token, first["next_batch"], 1500, "")
		kstest.Eventually(t, "the sync parked", func() bool { return n.Daemon.ParkedSyncs() == 1 })
		c.Close()
		if served(dialFrom(t, "127.0.0.7", addr)) {
			t.Fatal("the parked connection's slot was free before its timeout")
		}
		kstest.Eventually(t, "parked sync dropped", func() bool { return n.Daemon.ParkedSyncs() == 0 })
		if !served(dialFrom(t, "127.0.0.7", addr)) {
			t.Fatal("the slot of a departed client's parked connection was not freed")
		}
	})
}

// Connection: close and HTTP/1.0 are honoured: the answer says so and the
// server closes the connection after it.
func TestParkedSyncClosesWhenAsked(t *testing.T) {
	n := kstest.StartNode(t, kstest.SQLite(t), nil)
	alice := n.Register(t, "alice", "")
	first := n.Must(t, "GET", "/_matrix/client/v3/sync", alice.Token, nil)
	addr := strings.TrimPrefix(n.URL, "http://")
	for _, tc := range []struct{ proto, extra, status string }{
		{"HTTP/1.1", "Connection: close\r\n", "HTTP/1.1 200 OK"},
		{"HTTP/1.0", "", "HTTP/1.0 200 OK"},
	} {
		c := dialFrom(t, "127.0.0.1", addr)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		rawSync(t, c, tc.proto, alice.Token, first["next_batch"], 300, tc.extra)
		all, err := io.ReadAll(c) // until the server closes
		if err != nil {
			t.Fatalf("%s: %v", tc.proto, err)
		}
		if !strings.HasPrefix(string(all), tc.status+"\r\n") {
			t.Fatalf("%s: answer %q", tc.proto, all)
		}
		if tc.proto == "HTTP/1.1" && !strings.Contains(string(all), "\r\nConnection: close\r\n") {
			t.Fatalf("%s: answer without Connection: close: %q", tc.proto, all)
		}
	}
}

// A request the client sent behind its parked sync (pipelined) is served
// on the connection after the sync's answer.
func TestParkedSyncPipelined(t *testing.T) {
	n := kstest.StartNode(t, kstest.SQLite(t), nil)
	alice := n.Register(t, "alice", "")
	first := n.Must(t, "GET", "/_matrix/client/v3/sync", alice.Token, nil)
	c := dialFrom(t, "127.0.0.1", strings.TrimPrefix(n.URL, "http://"))
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	rawSync(t, c, "HTTP/1.1", alice.Token, first["next_batch"], 300, "")
	if _, err := io.WriteString(c, "GET /_matrix/client/versions HTTP/1.1\r\nHost: keyserver\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	for _, want := range []string{"next_batch", "versions"} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer with %s: %v", want, err)
		}
		if body := readJSON(t, resp); body[want] == nil {
			t.Fatalf("answer without %s: %v", want, body)
		}
	}
}

// Shutdown answers the parked syncs and completes.
func TestShutdownWithParkedSyncs(t *testing.T) {
	kstest.ForEachDatabase(t, func(t *testing.T, db kstest.Database) {
		n := kstest.StartNode(t, db, nil)
		alice := n.Register(t, "alice", "")
		first := n.Must(t, "GET", "/_matrix/client/v3/sync", alice.Token, nil)
		addr := strings.TrimPrefix(n.URL, "http://")
		// A connection answered after parking and given back to the
		// server, now idle: shutdown does not wait for it either.
		idle := dialFrom(t, "127.0.0.1", addr)
		_ = idle.SetDeadline(time.Now().Add(10 * time.Second))
		rawSync(t, idle, "HTTP/1.1", alice.Token, first["next_batch"], 100, "")
		idleReader := bufio.NewReader(idle)
		resp, err := http.ReadResponse(idleReader, nil)
		if err != nil || resp.Close {
			t.Fatalf("short sync: %v", err)
		}
		readJSON(t, resp)
		var conns []net.Conn
		for range 3 {
			c := dialFrom(t, "127.0.0.1", addr)
			rawSync(t, c, "HTTP/1.1", alice.Token, first["next_batch"], 60000, "")
			conns = append(conns, c)
		}
		kstest.Eventually(t, "all parked", func() bool { return n.Daemon.ParkedSyncs() == 3 })
		start := time.Now()
		n.Stop()
		// net/http waits 5 s for a connection that has not sent its
		// first request; a given-back connection must not count as one.
		if d := time.Since(start); d > 4*time.Second {
			t.Fatalf("shutdown took %s", d)
		}
		if _, err := idleReader.ReadByte(); err == nil {
			t.Fatal("the idle connection is still open after shutdown")
		}
		for i, c := range conns {
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("sync %d at shutdown: %v", i, err)
			}
			if resp.StatusCode != http.StatusOK || !resp.Close {
				t.Fatalf("sync %d at shutdown: status %d, close %v", i, resp.StatusCode, resp.Close)
			}
		}
	})
}

// Bad parameters of a sync that would wait are answered as before.
func TestParkedSyncBadInput(t *testing.T) {
	n := kstest.StartNode(t, kstest.SQLite(t), nil)
	alice := n.Register(t, "alice", "")
	for _, path := range []string{
		"/_matrix/client/v3/sync?since=s1&timeout=abc",
		"/_matrix/client/v3/sync?since=s1&timeout=-5",
		"/_matrix/client/v3/sync?since=nope&timeout=1000",
	} {
		r := n.Do(t, "GET", path, alice.Token, nil)
		if r.Status != http.StatusBadRequest || r.Errcode() != "M_INVALID_PARAM" {
			t.Fatalf("%s: %d %s", path, r.Status, r.Raw)
		}
	}
	if r := n.Do(t, "GET", "/_matrix/client/v3/sync?since=s1&timeout=1000", "", nil); r.Status != http.StatusUnauthorized {
		t.Fatalf("without a token: %d %s", r.Status, r.Raw)
	}
	if n.Daemon.ParkedSyncs() != 0 {
		t.Fatal("a bad request parked")
	}
}

// syncObservations reads the count and sum of
// keyserver_http_request_duration_seconds for GET /sync, every status,
// and the count of those answered 200.
func syncObservations(t *testing.T) (count uint64, sum float64, ok200 uint64) {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "keyserver_http_request_duration_seconds" {
			continue
		}
	metric:
		for _, m := range f.GetMetric() {
			want := map[string]string{"api": "client", "endpoint": "/_matrix/client/v3/sync", "method": "GET"}
			status := ""
			for _, l := range m.GetLabel() {
				if v, ok := want[l.GetName()]; ok && v != l.GetValue() {
					continue metric
				}
				if l.GetName() == "status" {
					status = l.GetValue()
				}
			}
			count += m.GetHistogram().GetSampleCount()
			sum += m.GetHistogram().GetSampleSum()
			if status == "200" {
				ok200 += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return count, sum, ok200
}

// A parked request is observed once, when answered, with its status and
// its whole duration.
func TestParkedSyncObservedOnce(t *testing.T) {
	n := kstest.StartNode(t, kstest.SQLite(t), nil)
	alice := n.Register(t, "alice", "")
	first := n.Must(t, "GET", "/_matrix/client/v3/sync", alice.Token, nil)
	count, sum, ok := syncObservations(t)
	n.Must(t, "GET", syncPath(first["next_batch"], 300), alice.Token, nil)
	newCount, newSum, newOK := syncObservations(t)
	if newCount != count+1 || newOK != ok+1 {
		t.Fatalf("observed %d times (%d with status 200), want once", newCount-count, newOK-ok)
	}
	if d := newSum - sum; d < 0.3 {
		t.Fatalf("observed duration %.3fs, want at least the 0.3s it waited", d)
	}
}
