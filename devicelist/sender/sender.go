// Package sender sends the local users' device-list and cross-signing key
// changes to the other servers that share a room with them, and with them
// the other queues of the same destinations: to-device messages and our
// room events.
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

	"github.com/keyserver/keyserver/crosssigning"
	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/internal/backoff"
	"github.com/keyserver/keyserver/internal/clock"
	"github.com/keyserver/keyserver/internal/lograte"
	"github.com/keyserver/keyserver/internal/metrics"
	"github.com/keyserver/keyserver/internal/slots"
	"github.com/keyserver/keyserver/storage"
)

// Sending our users' device-list changes to other servers.
//
// Each local change is queued, in the transaction that makes it, for every
// server sharing a room with the user (table outbound_device_updates, one
// row per destination and device: a newer change of a device replaces an
// unsent older one). The database is the queue, so nothing is lost in a
// restart and nothing has to be saved at shutdown. Changes of a user's
// master and self-signing keys are queued alike (one row per destination
// and user) and come in the same batches, marked SigningKeys, to go out as
// m.signing_key_update. Two more queues of the database share the
// deliveries: to-device EDUs (EDUQueue), which fill a batch's EDUs after
// the updates, and our room events (PDUQueue, table outbound_pdus, queued
// for every server in the room in the transaction that writes them), up
// to 50 PDUs beside the EDUs of each transaction.
//
// A fixed pool of workers sends. Destinations with pending updates wait
// their turn in a first-in first-out list; a worker takes one, takes its
// lease (so that of several daemons sharing the database one sends), and
// sends one batch of at most 50 PDUs and 100 EDUs, oldest first, in a
// /send transaction. A destination with more to send goes to the back of the
// list, so a busy destination never holds up the others. A batch keeps its
// transaction ID until delivered, so a retry is processed once by the
// receiver. A failed destination is set aside until its retry time (capped
// exponential backoff with jitter) without holding a worker: it keeps its
// batch and its lease, renewed while it waits, and comes back at once when
// it shows it is up. Goroutines are the pool's; memory is a small record
// per destination with pending updates (and the batch of a failed one).
//
// The sender's lock guards only that bookkeeping: no database call and no
// request is made while holding it, so the request paths that tell the
// sender something (a local change, a sign of life) never wait on the
// database or on another server.

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
	// Workers is the number of destinations sent to at once (default 32).
	Workers int
	// DatabaseSlots is how many database calls the workers make at once
	// (default DefaultDatabaseSlots; see slots).
	DatabaseSlots int
	// MinRetry and MaxRetry bound the backoff (defaults 5 s and 1 h).
	MinRetry, MaxRetry time.Duration
	// Sweep is how often every destination's queue is looked at, to pick up
	// updates queued by other daemons or left by one that stopped (1 min).
	Sweep  time.Duration
	Clock  clock.Clock
	Logger logrus.FieldLogger
	// Jitter draws a random duration in [0, n); math/rand by default.
	Jitter func(n int64) int64
	// ToDevice is the queue of to-device EDUs sent along; nil: none.
	ToDevice EDUQueue
	// PDUs is the queue of our room events sent along; nil: none.
	PDUs PDUQueue
}

// DefaultWorkers is the size of the pool when Options.Workers is not set.
const DefaultWorkers = 32

const (
	maxEDUsPerTransaction = 100
	leaseTTL              = 2 * time.Minute
	// dbErrorLogInterval is how often a database error of one kind is
	// logged while it recurs.
	dbErrorLogInterval = time.Minute
)

// Sender delivers queued device-list updates.
type Sender struct {
	db      Store // its calls take one of dbSlots
	dbSlots *slots.Slots
	tr      Transport
	o       Options
	owner   string // this daemon's name in leases and transaction IDs
	txn     atomic.Int64
	// dbErrs rate-limits the database errors' log lines.
	dbErrs *lograte.Limiter

	poke  chan struct{} // updates were queued: read the queue
	sched chan struct{} // a destination was set aside: look at the timer

	mu       sync.Mutex
	ready    *sync.Cond // signalled when the ready list grows or at stop
	running  bool
	stopping bool
	dests    map[string]*destination // destinations with work here
	queue    []*destination          // ready to be sent to, oldest first
}

type destState int

const (
	queued  destState = iota // in the ready list
	active                   // a worker has it
	waiting                  // set aside until retryAt (or renewAt)
)

// destination is the sender's record of a destination with work here.
type destination struct {
	name  string
	state destState
	// again says updates were queued while a worker had it: the queue is
	// read once more before it is forgotten.
	again bool
	// alive says it showed it is up while a worker had it: a failure then
	// is retried at once.
	alive bool
	// retryAt is when a failed destination is tried again; renewAt when
	// its lease must be renewed meanwhile.
	retryAt, renewAt time.Time
	// The batch being delivered, with its transaction and the attempts so
	// far; nil when none is pending.
	batch   []storage.OutboundUpdate
	toDev   []storage.OutboundEDU
	pdus    []storage.OutboundPDU
	txn     fedclient.Transaction
	txnID   string
	attempt int
}

// New makes a Sender; Run starts it.
func New(db Store, tr Transport, o Options) *Sender {
	if o.Workers <= 0 {
		o.Workers = DefaultWorkers
	}
	if o.DatabaseSlots <= 0 {
		o.DatabaseSlots = DefaultDatabaseSlots
	}
	sl := slots.New(o.DatabaseSlots)
	db = slotStore{db: db, slots: sl}
	if o.ToDevice != nil {
		o.ToDevice = slotEDUs{q: o.ToDevice, slots: sl}
	}
	if o.PDUs != nil {
		o.PDUs = slotPDUs{q: o.PDUs, slots: sl}
	}
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
	s := &Sender{db: db, tr: tr, o: o, owner: hex.EncodeToString(b), dbSlots: sl,
		poke: make(chan struct{}, 1), sched: make(chan struct{}, 1),
		dests:  map[string]*destination{},
		dbErrs: lograte.New(dbErrorLogInterval, o.Clock.Now)}
	s.ready = sync.NewCond(&s.mu)
	s.txn.Store(o.Clock.Now().UnixMilli())
	return s
}

// Run sends until ctx ends, then waits for the workers to stop and gives
// up its leases.
func (s *Sender) Run(ctx context.Context) {
	s.mu.Lock()
	s.running = true
	s.mu.Unlock()
	var wg sync.WaitGroup
	for i := 0; i < s.o.Workers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				d := s.next()
				if d == nil {
					return
				}
				s.process(ctx, d)
			}
		}()
	}
	nextSweep := s.o.Clock.Now()
	for {
		now := s.o.Clock.Now()
		if !now.Before(nextSweep) {
			s.WakeAll(ctx)
			nextSweep = now.Add(s.o.Sweep)
		}
		wait := nextSweep.Sub(now)
		if at, ok := s.resume(now); ok {
			wait = min(wait, at.Sub(now))
		}
		select {
		case <-ctx.Done():
			s.mu.Lock()
			s.stopping = true
			s.ready.Broadcast()
			s.mu.Unlock()
			wg.Wait()
			s.releaseAll()
			return
		case <-s.poke:
			nextSweep = now // read the queue now
		case <-s.sched:
		case <-s.o.Clock.After(wait):
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

// WakeAll queues every destination with pending updates to be sent to.
func (s *Sender) WakeAll(ctx context.Context) {
	dests, err := s.db.PendingDestinations(ctx)
	if err != nil {
		s.dbError(ctx, s.o.Logger, err, "reading the outbound queue")
		return
	}
	more, err := s.toDeviceDestinations(ctx)
	if err != nil {
		s.dbError(ctx, s.o.Logger, err, "reading the outbound to-device queue")
	}
	rooms, err := s.pduDestinations(ctx)
	if err != nil {
		s.dbError(ctx, s.o.Logger, err, "reading the outbound PDU queue")
	}
	for _, d := range append(append(dests, more...), rooms...) {
		s.wake(d, false)
	}
}

// DestinationAlive ends a backoff towards dest: it just showed it is up.
// It only updates the sender's bookkeeping, so a request path may call it.
func (s *Sender) DestinationAlive(dest string) { s.wake(dest, true) }

// Workers is the size of the pool.
func (s *Sender) Workers() int { return s.o.Workers }

// Busy counts the destinations with work here: waiting for a worker, being
// sent to, or waiting to retry (for tests and metrics).
func (s *Sender) Busy() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.dests)
}

func (s *Sender) wake(dest string, alive bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running || s.stopping {
		return
	}
	d := s.dests[dest]
	if d == nil {
		if alive {
			return // nothing queued for it here
		}
		d = &destination{name: dest}
		s.dests[dest] = d
		s.enqueue(d)
		return
	}
	switch {
	case d.state == active && alive:
		d.alive = true
	case d.state == active:
		d.again = true
	case alive:
		// Its backoff ends. New updates alone do not end one: the
		// destination is no more reachable for them.
		d.retryAt = time.Time{}
		if d.state == waiting {
			s.enqueue(d)
		}
	}
}

// enqueue puts d at the back of the ready list. s.mu is held.
func (s *Sender) enqueue(d *destination) {
	d.state = queued
	s.queue = append(s.queue, d)
	s.ready.Signal()
}

// next waits for a destination to send to; nil when stopping.
func (s *Sender) next() *destination {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.queue) == 0 && !s.stopping {
		s.ready.Wait()
	}
	if s.stopping {
		return nil
	}
	d := s.queue[0]
	s.queue[0] = nil
	s.queue = s.queue[1:]
	d.state, d.again, d.alive = active, false, false
	return d
}

// resume queues the waiting destinations whose retry or lease renewal is
// due, and returns when the next one is.
func (s *Sender) resume(now time.Time) (next time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.dests {
		if d.state != waiting {
			continue
		}
		at := d.renewAt
		if d.retryAt.Before(at) {
			at = d.retryAt
		}
		if !at.After(now) {
			s.enqueue(d)
		} else if !ok || at.Before(next) {
			next, ok = at, true
		}
	}
	return next, ok
}

// setAside makes d wait until retryAt, or queues it again at once when it
// showed it is up meanwhile.
func (s *Sender) setAside(d *destination, retryAt time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d.alive && !s.stopping {
		d.retryAt = time.Time{}
		s.enqueue(d)
		return
	}
	d.state = waiting
	d.retryAt = retryAt
	d.renewAt = s.o.Clock.Now().Add(leaseTTL / 2)
	select {
	case s.sched <- struct{}{}:
	default:
	}
}

// requeue puts d at the back of the ready list.
func (s *Sender) requeue(d *destination) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.enqueue(d)
}

// forget drops the record of d, unless updates were queued for it while a
// worker had it (they are then looked at again).
func (s *Sender) forget(d *destination, unlessAgain bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if unlessAgain && d.again {
		s.enqueue(d)
		return
	}
	if s.dests[d.name] == d {
		delete(s.dests, d.name)
	}
}

// process does one step for d: renew the lease, then send one batch, or
// decide to wait, to come back, or that nothing is left.
func (s *Sender) process(ctx context.Context, d *destination) {
	log := s.o.Logger.WithField("destination", d.name)
	ok, err := s.renew(ctx, d.name)
	if err != nil {
		s.dbError(ctx, log, err, "renewing a destination's lease")
		// Database trouble does not shorten a failed destination's backoff.
		s.setAside(d, later(d.retryAt, s.o.Clock.Now().Add(s.o.MinRetry)))
		return
	}
	if !ok {
		// Another daemon sends to d; its sender carries on, and a sweep
		// here finds the queue again if it stops.
		s.forget(d, false)
		return
	}
	if now := s.o.Clock.Now(); now.Before(d.retryAt) {
		s.setAside(d, d.retryAt) // the lease was due for renewal
		return
	}
	if d.txnID == "" {
		batch, err := s.db.PendingUpdates(ctx, d.name, maxEDUsPerTransaction)
		if err != nil {
			s.dbError(ctx, log, err, "outbound device-list queue")
			s.setAside(d, s.o.Clock.Now().Add(s.o.MinRetry))
			return
		}
		toDev, err := s.pendingToDevice(ctx, d.name, maxEDUsPerTransaction-len(batch))
		if err != nil {
			s.dbError(ctx, log, err, "outbound to-device queue")
			s.setAside(d, s.o.Clock.Now().Add(s.o.MinRetry))
			return
		}
		pdus, err := s.pendingPDUs(ctx, d.name, maxPDUsPerTransaction)
		if err != nil {
			s.dbError(ctx, log, err, "outbound PDU queue")
			s.setAside(d, s.o.Clock.Now().Add(s.o.MinRetry))
			return
		}
		if len(batch)+len(toDev)+len(pdus) == 0 {
			s.finish(ctx, d, log)
			return
		}
		d.batch, d.toDev, d.pdus, d.attempt = batch, toDev, pdus, 0
		d.txnID = s.nextTxnID()
		d.txn = fedclient.Transaction{Origin: s.o.ServerName, OriginServerTS: s.o.Clock.Now().UnixMilli(), PDUs: pduJSON(pdus)}
		for _, u := range batch {
			d.txn.EDUs = append(d.txn.EDUs, s.edu(log, u))
		}
		for _, e := range toDev {
			d.txn.EDUs = append(d.txn.EDUs, fedclient.EDU{Type: directToDevice, Content: e.Content})
		}
	}
	err = s.tr.SendTransaction(ctx, d.name, d.txnID, d.txn)
	if err == nil {
		var err error
		if len(d.batch) > 0 {
			err = s.db.MarkUpdatesSent(ctx, d.name, d.batch)
		}
		if err == nil {
			err = s.markToDeviceSent(ctx, d.name, d.toDev)
		}
		if err == nil {
			err = s.markPDUsSent(ctx, d.name, d.pdus)
		}
		if err != nil {
			// The batch is sent again, under the same transaction ID, so
			// the receiver does not process it twice.
			s.dbError(ctx, log, err, "outbound device-list queue")
			s.setAside(d, s.o.Clock.Now().Add(s.o.MinRetry))
			return
		}
		if d.attempt >= 3 {
			log.WithField("attempts", d.attempt+1).Info("transaction delivered after retries")
		}
		full := len(d.batch)+len(d.toDev) == maxEDUsPerTransaction || len(d.pdus) == maxPDUsPerTransaction
		d.batch, d.toDev, d.pdus, d.txn, d.txnID, d.attempt = nil, nil, nil, fedclient.Transaction{}, "", 0
		if full {
			s.requeue(d)
		} else {
			s.finish(ctx, d, log)
		}
		return
	}
	if ctx.Err() != nil {
		s.setAside(d, s.o.Clock.Now())
		return
	}
	d.attempt++
	wait := backoff.Delay(d.attempt, s.o.MinRetry, s.o.MaxRetry, s.o.Jitter)
	var be *fedclient.BackoffError
	if errors.As(err, &be) {
		metrics.OutboundSkipped.Inc()
		d.attempt-- // the client refused without trying: not an attempt
		wait = max(be.Until.Sub(s.o.Clock.Now()), time.Millisecond)
	} else {
		metrics.OutboundFailures.Inc()
	}
	if d.attempt == 5 {
		log.WithError(err).Warn("transaction cannot be delivered; retrying with backoff")
	}
	s.setAside(d, s.o.Clock.Now().Add(wait))
}

// nextTxnID names a new transaction. A server that receives it takes a
// transaction ID it has seen from this server before for a retry, and
// answers it without reading it. Daemons sharing a database are one
// server, and their counters (each starting from the time it started)
// meet once one has sent as many transactions as milliseconds passed
// between their starts: the daemon's name in front keeps their IDs apart.
func (s *Sender) nextTxnID() string {
	return s.owner + "." + strconv.FormatInt(s.txn.Add(1), 10)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// finish lets go of d's lease once its queue is empty, then looks once
// more, so that updates queued by another daemon while it was held are not
// left behind.
func (s *Sender) finish(ctx context.Context, d *destination, log logrus.FieldLogger) {
	if err := s.db.ReleaseDestination(ctx, d.name, s.owner); err != nil {
		// It expires by itself; until then no other daemon sends.
		s.dbError(ctx, log, err, "releasing a destination's lease")
	}
	pending, err := s.db.PendingUpdates(ctx, d.name, 1)
	if err == nil && len(pending) == 0 {
		var toDev []storage.OutboundEDU
		toDev, err = s.pendingToDevice(ctx, d.name, 1)
		if len(toDev) > 0 {
			pending = make([]storage.OutboundUpdate, 1) // something waits
		}
	}
	if err == nil && len(pending) == 0 {
		var pdus []storage.OutboundPDU
		pdus, err = s.pendingPDUs(ctx, d.name, 1)
		if len(pdus) > 0 {
			pending = make([]storage.OutboundUpdate, 1)
		}
	}
	switch {
	case err != nil:
		s.dbError(ctx, log, err, "reading the outbound queue")
		s.setAside(d, s.o.Clock.Now().Add(s.o.MinRetry))
	case len(pending) > 0:
		s.requeue(d)
	default:
		s.forget(d, true)
	}
}

// releaseAll gives up the leases at shutdown, so that the next start (or
// another daemon) takes over at once rather than when they expire.
func (s *Sender) releaseAll() {
	s.mu.Lock()
	names := make([]string, 0, len(s.dests))
	for name := range s.dests {
		names = append(names, name)
	}
	s.dests = map[string]*destination{}
	s.queue = nil
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, name := range names {
		if err := s.db.ReleaseDestination(ctx, name, s.owner); err != nil {
			s.dbError(ctx, s.o.Logger.WithField("destination", name), err, "releasing a destination's lease")
		}
	}
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

// edu is the EDU of a queued update: an m.signing_key_update or an
// m.device_list_update.
func (s *Sender) edu(log logrus.FieldLogger, u storage.OutboundUpdate) fedclient.EDU {
	if u.SigningKeys {
		return fedclient.EDU{Type: "m.signing_key_update", Content: signingKeyContent(log, u)}
	}
	return fedclient.EDU{Type: "m.device_list_update", Content: s.eduContent(log, u)}
}

// eduContent is the m.device_list_update of a queued update, carrying the
// device's current state: its keys with the signatures its owner made on
// them (a new self-signing signature is a change of the device).
func (s *Sender) eduContent(log logrus.FieldLogger, u storage.OutboundUpdate) json.RawMessage {
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
			c["keys"] = json.RawMessage(withSignatures(log, u, u.KeyJSON, u.DeviceID))
		}
		if s.o.DeviceNames && u.DisplayName != nil {
			c["device_display_name"] = *u.DisplayName
		}
	}
	raw, _ := json.Marshal(c) // maps of plain values always marshal
	return raw
}

// signingKeyContent is the m.signing_key_update of a queued update: the
// user's master key (with the signatures they made on it) and self-signing
// key as they are now. The user-signing key is the user's alone.
func signingKeyContent(log logrus.FieldLogger, u storage.OutboundUpdate) json.RawMessage {
	c := map[string]any{"user_id": u.UserID}
	if u.MasterKey != nil {
		c["master_key"] = json.RawMessage(withSignatures(log, u, u.MasterKey, crosssigning.PublicKeyOf(u.MasterKey)))
	}
	if u.SelfSigningKey != nil {
		c["self_signing_key"] = json.RawMessage(u.SelfSigningKey)
	}
	raw, _ := json.Marshal(c) // maps of plain values always marshal
	return raw
}

// withSignatures is the key object js (whose ID is keyID) with the
// signatures of u on it; js alone if they cannot be added (the stored
// object is canonical JSON, so that does not happen).
func withSignatures(log logrus.FieldLogger, u storage.OutboundUpdate, js []byte, keyID string) []byte {
	out, err := crosssigning.WithSignatures(js, crosssigning.ByTarget(u.Signatures, u.UserID, "")[keyID])
	if err != nil {
		log.WithError(err).WithField("user_id", u.UserID).Warn("stored keys without their signatures in an update")
		return js
	}
	return out
}
