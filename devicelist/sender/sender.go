// Package sender sends the local users' device-list changes to the other
// servers that share a room with them.
package sender

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	mrand "math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/internal/backoff"
	"github.com/keyserver/keyserver/internal/clock"
	"github.com/keyserver/keyserver/internal/lograte"
	"github.com/keyserver/keyserver/internal/metrics"
	"github.com/keyserver/keyserver/storage"
)

// Sending our users' device-list changes to other servers.
//
// Each local change is queued, in the transaction that makes it, for every
// server sharing a room with the user (table outbound_device_updates, one
// row per destination and device: a newer change of a device replaces an
// unsent older one). The database is the queue, so nothing is lost in a
// restart and nothing has to be saved at shutdown.
//
// A worker per destination with pending updates takes a lease on it (so
// that of several daemons sharing the database one sends), and sends
// batches of at most 100 EDUs in /send transactions, oldest first. A batch
// keeps its transaction ID until delivered, so a retry is processed once by
// the receiver. Failures are retried with capped exponential backoff and
// jitter; the wait ends early when the destination shows it is up again.
// A worker whose queue is empty goes away: workers exist only for busy
// destinations, and one slow destination never holds up another.

// Store is the part of the database the sender uses: the outbound queue
// and the destinations' leases.
type Store interface {
	PendingDestinations(ctx context.Context) ([]string, error)
	PendingUpdates(ctx context.Context, destination string, limit int) ([]storage.OutboundUpdate, error)
	MarkUpdatesSent(ctx context.Context, destination string, sent []storage.OutboundUpdate) error
	// AcquireDestination takes (or renews) the right to send to a
	// destination until expires; false when another daemon holds it.
	AcquireDestination(ctx context.Context, destination, owner string, now, expires int64) (bool, error)
	ReleaseDestination(ctx context.Context, destination, owner string) error
}

// Transport delivers transactions.
type Transport interface {
	SendTransaction(ctx context.Context, dest, txnID string, t fedclient.Transaction) error
}

// Options configure a Sender.
type Options struct {
	ServerName string
	// DeviceNames puts device display names in the updates.
	DeviceNames bool
	// MinRetry and MaxRetry bound the backoff (defaults 5 s and 1 h).
	MinRetry, MaxRetry time.Duration
	// Sweep is how often every destination's queue is looked at, to pick up
	// updates queued by other daemons or left by one that stopped (1 min).
	Sweep  time.Duration
	Clock  clock.Clock
	Logger logrus.FieldLogger
	// Jitter draws a random duration in [0, n); math/rand by default.
	Jitter func(n int64) int64
}

const (
	maxEDUsPerTransaction = 100
	leaseTTL              = 2 * time.Minute
	// dbErrorLogInterval is how often a database error of one kind is
	// logged by the background workers while it recurs.
	dbErrorLogInterval = time.Minute
)

// Sender delivers queued device-list updates.
type Sender struct {
	db    Store
	tr    Transport
	o     Options
	owner string // this daemon's name in leases
	txn   atomic.Int64
	// dbErrs rate-limits the database errors' log lines.
	dbErrs *lograte.Limiter

	poke    chan struct{}
	mu      sync.Mutex
	workers map[string]*sendWorker // only destinations being worked on
	ctx     context.Context
	wg      sync.WaitGroup
}

type sendWorker struct {
	wake  chan struct{} // new updates
	alive chan struct{} // the destination is reachable again
}

// New makes a Sender; Run starts it.
func New(db Store, tr Transport, o Options) *Sender {
	if o.MinRetry <= 0 {
		o.MinRetry = 5 * time.Second
	}
	if o.MaxRetry <= 0 {
		o.MaxRetry = time.Hour
	}
	if o.Sweep <= 0 {
		o.Sweep = time.Minute
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = logrus.StandardLogger()
	}
	if o.Jitter == nil {
		o.Jitter = mrand.Int64N
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	s := &Sender{db: db, tr: tr, o: o, owner: hex.EncodeToString(b),
		poke: make(chan struct{}, 1), workers: map[string]*sendWorker{},
		dbErrs: lograte.New(dbErrorLogInterval, o.Clock.Now)}
	s.txn.Store(o.Clock.Now().UnixMilli())
	return s
}

// Run sends until ctx ends, then waits for the workers to stop.
func (s *Sender) Run(ctx context.Context) {
	s.mu.Lock()
	s.ctx = ctx
	s.mu.Unlock()
	for {
		s.WakeAll(ctx)
		select {
		case <-ctx.Done():
			s.wg.Wait()
			return
		case <-s.poke:
		case <-s.o.Clock.After(s.o.Sweep):
		}
	}
}

// Poke says updates were queued: the queue is read again soon. Pokes that
// come while one is pending are merged.
func (s *Sender) Poke() {
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

// WakeAll starts or wakes a worker for every destination with updates.
func (s *Sender) WakeAll(ctx context.Context) {
	dests, err := s.db.PendingDestinations(ctx)
	if err != nil {
		s.dbError(ctx, s.o.Logger, err, "reading the outbound queue")
		return
	}
	for _, d := range dests {
		s.wake(d, false)
	}
}

// DestinationAlive ends a backoff towards dest: it just showed it is up.
func (s *Sender) DestinationAlive(dest string) { s.wake(dest, true) }

// Busy counts the destinations with a worker (for tests and metrics).
func (s *Sender) Busy() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.workers)
}

func (s *Sender) wake(dest string, alive bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx == nil || s.ctx.Err() != nil {
		return // not running
	}
	if w := s.workers[dest]; w != nil {
		ch := w.wake
		if alive {
			ch = w.alive
		}
		select {
		case ch <- struct{}{}:
		default:
		}
		return
	}
	if alive {
		return // nothing queued for it here
	}
	w := &sendWorker{wake: make(chan struct{}, 1), alive: make(chan struct{}, 1)}
	s.workers[dest] = w
	s.wg.Add(1)
	go s.work(s.ctx, dest, w)
}

// work sends dest's queue until it is empty.
func (s *Sender) work(ctx context.Context, dest string, w *sendWorker) {
	defer s.wg.Done()
	log := s.o.Logger.WithField("destination", dest)
	for {
		more, err := s.sendBatch(ctx, dest, w, log)
		if ctx.Err() != nil {
			s.stop(dest, w)
			return
		}
		if errors.Is(err, errLeaseHeld) {
			// Another daemon sends to dest; its worker carries on.
			s.mu.Lock()
			if s.workers[dest] == w {
				delete(s.workers, dest)
			}
			s.mu.Unlock()
			return
		}
		if err != nil {
			s.dbError(ctx, log, err, "outbound device-list queue")
			select { // database trouble: try again shortly
			case <-s.o.Clock.After(s.o.MinRetry):
			case <-ctx.Done():
			}
			continue
		}
		if more {
			continue
		}
		// Empty: let go of the lease, then look once more, so that updates
		// queued by another daemon while we held it are not left behind.
		if err := s.db.ReleaseDestination(ctx, dest, s.owner); err != nil {
			// It expires by itself; until then no other daemon sends.
			s.dbError(ctx, log, err, "releasing a destination's lease")
		}
		select {
		case <-w.wake:
			continue
		default:
		}
		s.mu.Lock()
		pending, err := s.db.PendingUpdates(ctx, dest, 1)
		if err == nil && len(pending) == 0 {
			delete(s.workers, dest)
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		if err != nil {
			// The next round reads the queue again (and waits if it fails).
			s.dbError(ctx, log, err, "reading the outbound queue")
		}
	}
}

// stop ends a worker at shutdown, giving up its lease so that the next
// start (or another daemon) takes over at once rather than when it expires.
func (s *Sender) stop(dest string, w *sendWorker) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if err := s.db.ReleaseDestination(ctx, dest, s.owner); err != nil {
		s.dbError(ctx, s.o.Logger.WithField("destination", dest), err, "releasing a destination's lease")
	}
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.workers[dest] == w {
		delete(s.workers, dest)
	}
}

// errLeaseHeld says another daemon holds the destination's lease.
var errLeaseHeld = errors.New("another daemon sends to this destination")

// sendBatch delivers one batch, retrying until it is delivered or ctx ends.
// more reports whether updates remain.
func (s *Sender) sendBatch(ctx context.Context, dest string, w *sendWorker, log logrus.FieldLogger) (more bool, err error) {
	if ok, err := s.renew(ctx, dest); err != nil {
		return false, err
	} else if !ok {
		return false, errLeaseHeld
	}
	batch, err := s.db.PendingUpdates(ctx, dest, maxEDUsPerTransaction)
	if err != nil || len(batch) == 0 {
		return false, err
	}
	txn := fedclient.Transaction{Origin: s.o.ServerName, OriginServerTS: s.o.Clock.Now().UnixMilli()}
	for _, u := range batch {
		txn.EDUs = append(txn.EDUs, fedclient.EDU{Type: "m.device_list_update", Content: s.eduContent(u)})
	}
	txnID := strconv.FormatInt(s.txn.Add(1), 10)
	for attempt := 1; ; attempt++ {
		err := s.tr.SendTransaction(ctx, dest, txnID, txn)
		if err == nil {
			if err := s.db.MarkUpdatesSent(ctx, dest, batch); err != nil {
				return false, err
			}
			if attempt > 3 {
				log.WithField("attempts", attempt).Info("device-list updates delivered after retries")
			}
			return len(batch) == maxEDUsPerTransaction, nil
		}
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		wait := backoff.Delay(attempt, s.o.MinRetry, s.o.MaxRetry, s.o.Jitter)
		var be *fedclient.BackoffError
		if errors.As(err, &be) {
			metrics.OutboundSkipped.Inc()
			attempt-- // the client refused without trying: not an attempt
			wait = max(be.Until.Sub(s.o.Clock.Now()), time.Millisecond)
		} else {
			metrics.OutboundFailures.Inc()
		}
		if attempt == 5 {
			log.WithError(err).Warn("device-list updates cannot be delivered; retrying with backoff")
		}
		if !s.sleep(ctx, dest, w, wait) {
			return false, ctx.Err()
		}
	}
}

// sleep waits out a backoff, renewing the lease, and returns early (true)
// when the destination is back or new updates came; false when ctx ends.
func (s *Sender) sleep(ctx context.Context, dest string, w *sendWorker, wait time.Duration) bool {
	for wait > 0 {
		step := min(wait, leaseTTL/2)
		select {
		case <-ctx.Done():
			return false
		case <-w.alive:
			return true
		case <-w.wake:
			return true
		case <-s.o.Clock.After(step):
		}
		wait -= step
		if _, err := s.renew(ctx, dest); err != nil {
			s.dbError(ctx, s.o.Logger.WithField("destination", dest), err, "renewing a destination's lease")
			return ctx.Err() == nil
		}
	}
	return true
}

// dbError logs a database error of the workers, at most once a minute per
// kind (msg): they meet the same error on every round while the database
// is unwell. Errors from shutting down are not logged.
func (s *Sender) dbError(ctx context.Context, log logrus.FieldLogger, err error, msg string) {
	if ctx.Err() != nil {
		return
	}
	s.dbErrs.Warn(log, err, msg)
}

func (s *Sender) renew(ctx context.Context, dest string) (bool, error) {
	now := s.o.Clock.Now()
	return s.db.AcquireDestination(ctx, dest, s.owner, now.UnixMilli(), now.Add(leaseTTL).UnixMilli())
}

// eduContent is the m.device_list_update of a queued update, carrying the
// device's current state.
func (s *Sender) eduContent(u storage.OutboundUpdate) json.RawMessage {
	c := map[string]any{
		"user_id":   u.UserID,
		"device_id": u.DeviceID,
		"stream_id": u.StreamID,
		"prev_id":   []int64{},
		"deleted":   u.Deleted,
	}
	if u.PrevID > 0 {
		c["prev_id"] = []int64{u.PrevID}
	}
	if !u.Deleted {
		if u.KeyJSON != nil {
			c["keys"] = json.RawMessage(u.KeyJSON)
		}
		if s.o.DeviceNames && u.DisplayName != nil {
			c["device_display_name"] = *u.DisplayName
		}
	}
	raw, _ := json.Marshal(c) // maps of plain values always marshal
	return raw
}
