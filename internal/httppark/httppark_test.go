package httppark

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// countingJob answers when final, or when news is set; it counts its
// calls and its Close.
type countingJob struct {
	news   atomic.Bool
	calls  atomic.Int32
	closed atomic.Int32
}

func (j *countingJob) Answer(_ context.Context, w http.ResponseWriter, final bool) bool {
	j.calls.Add(1)
	if !final && !j.news.Load() {
		return false
	}
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusAccepted)
	_, _ = io.WriteString(w, map[bool]string{true: "final", false: "news"}[final])
	return true
}

func (j *countingJob) Close() { j.closed.Add(1) }

// serve runs an HTTP server whose handler parks every request with job
// and timeout, calling before (if set) between NewWaiter and Park.
func serve(t *testing.T, p *Parker, job Job, timeout time.Duration, before func(*Waiter)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var statuses atomic.Int32
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/park" || !p.Can(w, r) {
			_, _ = io.WriteString(w, "plain")
			return
		}
		pw := p.NewWaiter()
		if before != nil {
			before(pw)
		}
		if err := pw.Park(w, r, timeout, job, func() func(int) { return func(int) { statuses.Add(1) } }); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	go func() { _ = srv.Serve(p.Listener()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx)
		_ = srv.Shutdown(ctx)
	})
	return "http://" + ln.Addr().String()
}

func get(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// A wake that comes before the request is parked (between the read of
// its state and Park) is not lost: it is answered at once.
func TestWakeBeforePark(t *testing.T) {
	p := New(Options{Workers: 2})
	job := &countingJob{}
	job.news.Store(true)
	url := serve(t, p, job, time.Minute, func(w *Waiter) { w.Wake(false) })
	start := time.Now()
	status, body := get(t, http.DefaultClient, url+"/park")
	if status != http.StatusAccepted || body != "news" {
		t.Fatalf("answer %d %q", status, body)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("answered after %s", d)
	}
	if job.closed.Load() != 1 {
		t.Fatalf("job closed %d times", job.closed.Load())
	}
}

// Wakes without news leave the request parked; the deadline answers it,
// once, and the connection then serves the next request.
func TestWakesWithoutNewsThenDeadline(t *testing.T) {
	p := New(Options{Workers: 2})
	job := &countingJob{}
	var waiter atomic.Pointer[Waiter]
	url := serve(t, p, job, 500*time.Millisecond, func(w *Waiter) { waiter.Store(w) })
	var dials atomic.Int32
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, n, a string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, n, a)
	}}}
	done := parkOne(t, p, client, url)
	for range 5 {
		waiter.Load().Wake(false)
	}
	select {
	case body := <-done:
		if body != "final" {
			t.Fatalf("answer %q, want the final one", body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("not answered at its deadline")
	}
	if job.calls.Load() < 2 || job.closed.Load() != 1 || p.Parked() != 0 {
		t.Fatalf("calls %d, closed %d, parked %d", job.calls.Load(), job.closed.Load(), p.Parked())
	}
	if _, body := get(t, client, url+"/plain"); body != "plain" || dials.Load() != 1 {
		t.Fatalf("next request: %q over %d connections", body, dials.Load())
	}
}

// parkOne sends a request that parks, waits until it is parked, and
// returns the channel its answer's body comes on.
func parkOne(t *testing.T, p *Parker, client *http.Client, url string) chan string {
	t.Helper()
	done := make(chan string, 1)
	go func() {
		_, body := get(t, client, url+"/park")
		done <- body
	}()
	deadline := time.Now().Add(10 * time.Second)
	for p.Parked() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("not parked")
		}
		time.Sleep(time.Millisecond)
	}
	return done
}

// Once shutting down, requests are not parked, and Shutdown answers the
// parked ones.
func TestShutdownAnswersParked(t *testing.T) {
	p := New(Options{Workers: 1})
	job := &countingJob{}
	url := serve(t, p, job, time.Hour, nil)
	done := parkOne(t, p, &http.Client{Transport: &http.Transport{}}, url)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if body := <-done; body != "final" {
		t.Fatalf("answer at shutdown %q", body)
	}
	if _, body := get(t, &http.Client{Transport: &http.Transport{}}, url+"/park"); body != "plain" {
		t.Fatalf("a request after shutdown: %q, want it served without parking", body)
	}
}
