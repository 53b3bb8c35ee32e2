// Package httppark keeps long-polling HTTP/1.x requests waiting without a
// goroutine or net/http's buffers each. A handler with nothing to answer
// yet takes its connection over (http.Hijacker), parks it with the work to
// do once woken, and returns. Parked requests wait in one deadline heap
// with one timer; when woken (Waiter.Wake) or at their deadline, a bounded
// pool of workers answers them, writes a complete HTTP/1.x response, and
// hands the connection back to the http.Server through a listener of its
// own, so that the client's next request on it is served as usual.
//
// A client that closes its connection while parked is noticed when its
// request is woken or times out: before doing the work, a worker peeks at
// the socket without blocking (a closed connection reads as end of file)
// and drops the request. Watching every parked socket continuously would
// need a goroutine (a blocked read) per connection, which is what parking
// saves; the parked request of a departed client thus holds its few
// kilobytes and its file descriptor until its deadline at the latest.
package httppark

import (
	"bytes"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
)

// Options configure a Parker.
type Options struct {
	// Workers answer woken requests at once; default 32 (as many as
	// the PostgreSQL connection pool: a wake of many requests runs their
	// reads side by side).
	Workers int
	// WriteTimeout bounds the writing of an answer; default 30s.
	WriteTimeout time.Duration
	Logger       logrus.FieldLogger
}

// Job is the work of a parked request.
type Job interface {
	// Answer writes the request's answer to w. With final false the
	// request was woken by something that may not concern it: it may
	// write nothing, and waits on. With final true (its deadline passed,
	// or the server shuts down, or an event that always ends the wait)
	// it must answer. ctx ends when the server gives up on it.
	Answer(ctx context.Context, w http.ResponseWriter, final bool) (answered bool)
	// Close releases what the job holds; called once, when it is done.
	Close()
}

// Parker holds the parked requests of one http.Server.
type Parker struct {
	o      Options
	ln     *Listener
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	cond    *sync.Cond // workers wait on it for ready
	waiting deadlineHeap
	timer   *time.Timer
	ready   []*Waiter
	count   int // parked requests not yet done
	closing bool
	stopped bool
	idle    chan struct{} // closed when closing and count reaches 0
	workers sync.WaitGroup
}

// New starts a parker and its workers. Serve the http.Server on
// Listener() too, so that answered connections come back to it.
func New(o Options) *Parker {
	if o.Workers <= 0 {
		o.Workers = 32
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = logrus.StandardLogger()
	}
	p := &Parker{o: o, ln: newListener(), idle: make(chan struct{})}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.cond = sync.NewCond(&p.mu)
	p.timer = time.AfterFunc(time.Hour, p.expire)
	p.timer.Stop()
	p.workers.Add(o.Workers)
	for range o.Workers {
		go p.work()
	}
	return p
}

// Listener returns the listener on which answered connections come back.
func (p *Parker) Listener() net.Listener { return p.ln }

// Parked counts the parked requests (for tests and metrics).
func (p *Parker) Parked() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.count
}

// Can tells whether the request can be parked: HTTP/1.x without a body,
// on a connection that can be taken over, while the parker runs.
func (p *Parker) Can(w http.ResponseWriter, r *http.Request) bool {
	if p == nil || r.ProtoMajor != 1 || r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
		return false
	}
	for w != nil {
		if _, ok := w.(http.Hijacker); ok {
			break
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return false
		}
		w = u.Unwrap()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.closing
}

// waiter states
const (
	stNew     = iota // made, not parked yet
	stParked         // waiting in the heap
	stQueued         // in ready
	stRunning        // a worker has it
	stDone
)

// Waiter is one parked request: what it takes to answer it later and to
// give its connection back.
type Waiter struct {
	p         *Parker
	job       Job
	conn      *backConn
	header    http.Header
	minor     int  // HTTP/1.minor
	keepAlive bool // the client keeps the connection
	done      func(status int)
	deadline  time.Time
	index     int // in p.waiting; -1 when not there
	state     uint8
	woken     bool // an event came while it was not parked
	final     bool
}

// NewWaiter makes the record of a request about to park, so that its
// Wake can be handed to whatever wakes it before it is parked.
func (p *Parker) NewWaiter() *Waiter { return &Waiter{p: p, index: -1} }

// Wake tells the request something happened: final when it must answer
// now. It never blocks (the notifier calls it under its lock).
func (w *Waiter) Wake(final bool) {
	p := w.p
	p.mu.Lock()
	defer p.mu.Unlock()
	w.wakeLocked(final)
}

func (w *Waiter) wakeLocked(final bool) {
	w.final = w.final || final
	switch w.state {
	case stNew, stRunning:
		w.woken = true
	case stParked:
		w.p.queueLocked(w)
	}
}

func (p *Parker) queueLocked(w *Waiter) {
	w.state = stQueued
	p.ready = append(p.ready, w)
	p.cond.Signal()
}

// ErrClosed is returned by Park once the parker shuts down.
var ErrClosed = errors.New("httppark: shutting down")

// Park takes the request's connection over and parks it until woken or
// until timeout has passed. detach is called once the connection is taken
// (on the handler's goroutine), and the function it returns is given the
// status of the answer (the middlewares' record, see httpx.Detach). After
// an error nothing was taken: the handler answers as usual. After success
// the handler must return without touching rw.
func (w *Waiter) Park(rw http.ResponseWriter, r *http.Request, timeout time.Duration, job Job, detach func() func(int)) error {
	p := w.p
	p.mu.Lock()
	closing := p.closing
	p.mu.Unlock()
	if closing {
		return ErrClosed
	}
	// The handler's header map is not the server's any more once the
	// connection is taken over: it is kept, not copied.
	header := rw.Header()
	conn, buf, err := http.NewResponseController(rw).Hijack()
	if err != nil {
		return err
	}
	// Bytes the server read ahead (a pipelined request) are replayed to
	// it when the connection comes back, before any not replayed yet.
	bc, ok := conn.(*backConn)
	if !ok {
		bc = &backConn{Conn: conn, l: p.ln}
	}
	if n := buf.Reader.Buffered(); n > 0 {
		b, _ := buf.Reader.Peek(n)
		bc.pending = append(bytes.Clone(b), bc.pending...)
	}
	w.job, w.conn, w.header, w.minor = job, bc, header, r.ProtoMinor
	w.keepAlive = !r.Close
	w.done = detach()
	w.deadline = time.Now().Add(timeout)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.count++
	w.state = stParked
	heap.Push(&p.waiting, w)
	if w.index == 0 {
		p.timer.Reset(time.Until(w.deadline))
	}
	if p.closing {
		w.final = true
		w.woken = true
	}
	if w.woken {
		w.woken = false
		p.queueLocked(w)
	}
	return nil
}

// expire queues the requests whose deadline passed.
func (p *Parker) expire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	for len(p.waiting) > 0 && !p.waiting[0].deadline.After(now) {
		w := heap.Pop(&p.waiting).(*Waiter)
		w.wakeLocked(true)
	}
	if len(p.waiting) > 0 {
		p.timer.Reset(time.Until(p.waiting[0].deadline))
	}
}

func (p *Parker) work() {
	defer p.workers.Done()
	for {
		p.mu.Lock()
		for len(p.ready) == 0 && !p.stopped {
			p.cond.Wait()
		}
		if len(p.ready) == 0 {
			p.mu.Unlock()
			return
		}
		w := p.ready[0]
		p.ready[0] = nil
		p.ready = p.ready[1:]
		w.state = stRunning
		final := w.final
		p.mu.Unlock()
		p.run(w, final)
	}
}

// run does a woken request's work.
func (p *Parker) run(w *Waiter, final bool) {
	if !alive(w.conn) {
		p.finish(w)
		w.conn.Close()
		w.done(statusClientClosedRequest)
		return
	}
	aw := &answerWriter{h: w.header}
	if !w.job.Answer(p.ctx, aw, final) {
		p.mu.Lock()
		if w.woken {
			w.woken = false
			p.queueLocked(w)
		} else {
			w.state = stParked
			if w.index < 0 { // its deadline passed meanwhile
				p.queueLocked(w)
				w.final = true
			}
		}
		p.mu.Unlock()
		return
	}
	keepAlive := p.finish(w) && w.keepAlive
	status := aw.statusOr200()
	// Recorded before it is written, as net/http's handlers are: the
	// client may send its next request as soon as it has the answer.
	w.done(status)
	if err := p.write(w, aw, status, keepAlive); err != nil {
		p.o.Logger.WithError(err).Debug("could not write a parked request's answer")
		w.conn.Close()
		return
	}
	if !keepAlive {
		w.conn.Close()
		return
	}
	_ = w.conn.SetDeadline(time.Time{})
	p.ln.handBack(w.conn)
}

// statusClientClosedRequest is recorded for a request whose client left
// (nginx's 499, as httpx records it).
const statusClientClosedRequest = 499

// finish takes w out of the parker and releases its job; it tells
// whether the connection may be kept (not when shutting down).
func (p *Parker) finish(w *Waiter) (keep bool) {
	p.mu.Lock()
	if w.index >= 0 {
		heap.Remove(&p.waiting, w.index)
	}
	w.state = stDone
	p.count--
	if p.count == 0 && p.closing {
		select {
		case <-p.idle:
		default:
			close(p.idle)
		}
	}
	keep = !p.closing
	p.mu.Unlock()
	w.job.Close()
	return keep
}

// write sends the answer as net/http would: status line of the request's
// version, the handler's headers, Date, Content-Length, and Connection
// when it differs from the version's default.
func (p *Parker) write(w *Waiter, aw *answerWriter, status int, keepAlive bool) error {
	h := aw.h
	h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	if w.minor == 0 && keepAlive {
		h.Set("Connection", "keep-alive")
	}
	resp := http.Response{StatusCode: status, ProtoMajor: 1, ProtoMinor: w.minor, Header: h,
		ContentLength: int64(aw.body.Len()), Body: io.NopCloser(&aw.body), Close: !keepAlive}
	var out bytes.Buffer
	out.Grow(aw.body.Len() + 512)
	if err := resp.Write(&out); err != nil {
		return err
	}
	if err := w.conn.SetWriteDeadline(time.Now().Add(p.o.WriteTimeout)); err != nil {
		return err
	}
	_, err := w.conn.Write(out.Bytes())
	return err
}

// Shutdown answers every parked request now (closing their connections
// after the answer) and waits for them until ctx ends, when the
// connections still held are closed. Requests that try to park from then
// on answer at once (Park fails). The listener is closed by the server's
// own Shutdown, or here.
func (p *Parker) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	if !p.closing {
		p.closing = true
		for len(p.waiting) > 0 {
			heap.Pop(&p.waiting).(*Waiter).wakeLocked(true)
		}
		if p.count == 0 {
			close(p.idle)
		}
	}
	p.mu.Unlock()
	var err error
	select {
	case <-p.idle:
	case <-ctx.Done():
		err = fmt.Errorf("parked requests still answering: %w", ctx.Err())
		p.cancel()
	}
	p.mu.Lock()
	p.stopped = true
	p.cond.Broadcast()
	p.mu.Unlock()
	p.cancel()
	p.ln.Close()
	if err == nil {
		p.workers.Wait()
	}
	return err
}

// answerWriter collects a parked request's answer.
type answerWriter struct {
	h      http.Header
	status int
	body   bytes.Buffer
}

func (a *answerWriter) Header() http.Header { return a.h }

func (a *answerWriter) WriteHeader(code int) {
	if a.status == 0 {
		a.status = code
	}
}

func (a *answerWriter) Write(b []byte) (int, error) {
	if a.status == 0 {
		a.status = http.StatusOK
	}
	return a.body.Write(b)
}

func (a *answerWriter) statusOr200() int {
	if a.status == 0 {
		return http.StatusOK
	}
	return a.status
}

// deadlineHeap orders parked requests by deadline.
type deadlineHeap []*Waiter

func (h deadlineHeap) Len() int           { return len(h) }
func (h deadlineHeap) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }
func (h deadlineHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *deadlineHeap) Push(x any) {
	w := x.(*Waiter)
	w.index = len(*h)
	*h = append(*h, w)
}
func (h *deadlineHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	w.index = -1
	return w
}
