// Package federationsender is the federation outbound queue: it delivers
// to other servers, in /send transactions, what the database queues for
// them: the local users' device-list and cross-signing key changes (as
// EDUs the keys domain formats, Options.FormatUpdate), to-device messages
// and our room events. It knows no domain's rules: it reads the queues,
// batches, delivers, retries, and shares the destinations with the other
// daemons of the database through leases.
package federationsender

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
// lease (so that of several daemons sharing the database one sends; a
// lease dies with the daemon holding it, see storage/sqlstore's
// outboundstate.go), and sends one batch of at most 50 PDUs and 100 EDUs,
// oldest first, in a /send transaction. A destination with more to send
// goes to the back of the list, so a busy destination never holds up the
// others. A batch keeps its transaction ID until delivered, so a retry is
// processed once by the receiver.
//
// A failed destination is set aside until its retry time without holding a
// worker. It keeps its batch, and pauses its lease: any daemon of the
// database may take it meanwhile (the batch is then dropped and built
// again from the queue). The wait grows from MinRetry, doubling per
// failure, but a destination reached or heard from within RecentWindow
// (1 h) waits at most RecentRetry (30 s): a peer that was up a moment ago
// is most likely up again soon. Only one silent for longer waits longer,
// as long again as it has been silent beyond the window (each wait about
// doubles), up to MaxRetry (1 h). Any sign of life ends the wait and
// zeroes the failures: an authenticated request from the destination
// (DestinationAlive) or a delivery. The failures are kept in the database
// (outbound_destinations), shared by the daemons: a reset made by one
// reaches the others at once on PostgreSQL (WatchOutbound) and within
// Maintain (1 s) anyway, as do the leases left by a daemon that is gone
// (ReclaimDeadLeases) and an operator's retry. A daemon tries each
// destination once before it heeds a retry time stored by another (or by
// the process it replaced).
//
// Goroutines are the pool's; memory is a small record per destination
// with pending updates (and the batch of a failed one).
//
// The sender's lock guards only that bookkeeping: no database call and no
// request is made while holding it, so the request paths that tell the
// sender something (a local change, a sign of life) never wait on the
// database or on another server.

// UpdateFormatter makes the EDU of a queued update of a local user's keys:
// its type and content, and an error when a key goes without some of its
// signatures (the EDU is sent anyway, and the error logged).
type UpdateFormatter func(u storage.OutboundUpdate, deviceNames bool) (eduType string, content json.RawMessage, err error)

// Store is the part of the database the sender uses: the queue of
// device-list and signing-key updates, the destinations' leases and their
// retry state.
type Store interface {
	storage.OutboundUpdates
	storage.OutboundLeases
	storage.DestinationRetries
}

// Transport delivers transactions.
type Transport interface {
	SendTransaction(ctx context.Context, dest, txnID string, t fedclient.Transaction) error
}

// Options configure a Sender.
type Options struct {
	ServerName string
	// FormatUpdate makes the EDU of a queued device-list or signing-key
	// update (crosssigning.UpdateEDU); required.
	FormatUpdate UpdateFormatter
	// DeviceNames puts device display names in the updates.
	DeviceNames bool
	// Workers is the number of destinations sent to at once (default 32).
	Workers int
	// DatabaseSlots is how many database calls the workers make at once
	// (default DefaultDatabaseSlots; see slots).
	DatabaseSlots int
	// MinRetry and MaxRetry bound the backoff (defaults 5 s and 1 h).
	MinRetry, MaxRetry time.Duration
	// RecentRetry caps the wait of a destination reached or heard from
	// within RecentWindow (defaults 30 s and 1 h).
	RecentRetry, RecentWindow time.Duration
	// Sweep is how often every destination's queue is looked at, to pick up
	// updates queued by other daemons or left by one that stopped (1 min).
	Sweep time.Duration
	// Maintain is how often the leases of daemons that are gone are
	// reclaimed and the shared retry state is read again (1 s).
	Maintain time.Duration
	Clock    clock.Clock
	Logger   logrus.FieldLogger
	// Jitter draws a random duration in [0, n); math/rand by default.
	Jitter func(n int64) int64
	// ToDevice is the queue of to-device EDUs sent along; nil: none.
	ToDevice EDUQueue
	// PDUs is the queue of our room events sent along; nil: none.
	PDUs PDUQueue
	// Presence is the queue of the local users' presence sent along (as
	// m.presence EDUs); nil: none.
	Presence PresenceQueue
}

// DefaultWorkers is the size of the pool when Options.Workers is not set.
const DefaultWorkers = 32

const (
	// leaseTTL bounds a lease whose owner lives but no longer renews it;
	// one whose owner is gone is void at once (see Store).
	leaseTTL = 2 * time.Minute
	// dbErrorLogInterval is how often a database error of one kind is
	// logged while it recurs.
	dbErrorLogInterval = time.Minute
)

// Sender delivers the queued updates, to-device EDUs and PDUs.
type Sender struct {
	db      Store // its calls take one of dbSlots
	dbSlots *slots.Slots
	tr      Transport
	o       Options
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
	// owner is this daemon's name in leases and transaction IDs; held
	// says the database knows it as alive (HoldOutboundOwner), and
	// sendCtx ends when it no longer does, stopping the sends.
	owner   string
	held    bool
	sendCtx context.Context
	// failing holds the destinations known to have failures stored (here
	// or by another daemon): a sign of life from one of them is written
	// (resets, resetReady). blocked holds those whose lease another
	// daemon held when a worker here wanted it: its release wakes them.
	failing    map[string]bool
	resets     map[string]int64
	resetReady chan struct{}
	blocked    map[string]bool
	// epoch counts the reads of the shared retry state (see maintain).
	epoch int
	// owners are the live holders of leases at the last look (maintain).
	owners map[int64]bool
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
	// retryAt is when a failed destination is tried again.
	retryAt time.Time
	// The batch being delivered, with its transaction; nil when none is
	// pending.
	batch []storage.OutboundUpdate
	toDev []storage.OutboundEDU
	pdus  []storage.OutboundPDU
	txn   fedclient.Transaction
	txnID string

	// presence are the push entries of the batch's m.presence EDU.
	presence []storage.OutboundEDU
	// The failed attempts since the destination was last reached or heard
	// from, and the first of them; known says they were read from the
	// database since the lease was last taken from another daemon.
	attempt      int
	failingSince time.Time
	known        bool
	// epoch is the sender's epoch when it was last set aside.
	epoch int
}

// New makes a Sender; Run starts it.
func New(db Store, tr Transport, o Options) *Sender {
	if o.FormatUpdate == nil {
		panic("federationsender: Options.FormatUpdate is not set")
	}
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
	if o.RecentRetry <= 0 {
		o.RecentRetry = 30 * time.Second
	}
	if o.RecentWindow <= 0 {
		o.RecentWindow = time.Hour
	}
	if o.Sweep <= 0 {
		o.Sweep = time.Minute
	}
	if o.Maintain <= 0 {
		o.Maintain = time.Second
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
	s := &Sender{db: db, tr: tr, o: o, owner: newOwner(), held: true, sendCtx: context.Background(), dbSlots: sl,
		poke: make(chan struct{}, 1), sched: make(chan struct{}, 1),
		dests: map[string]*destination{}, failing: map[string]bool{}, resets: map[string]int64{},
		resetReady: make(chan struct{}, 1), blocked: map[string]bool{},
		dbErrs: lograte.New(dbErrorLogInterval, o.Clock.Now)}
	s.ready = sync.NewCond(&s.mu)
	s.txn.Store(o.Clock.Now().UnixMilli())
	return s
}

// newOwner makes a daemon's name for its leases and transaction IDs.
func newOwner() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Run sends until ctx ends, then waits for the workers to stop and gives
// up its leases.
func (s *Sender) Run(ctx context.Context) {
	lost, ok := s.hold(ctx)
	if !ok {
		return
	}
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
	wg.Add(2)
	go func() { defer wg.Done(); s.watch(ctx) }()
	go func() { defer wg.Done(); s.writeResets(ctx) }()
	// Leases of a daemon that is gone (this one's predecessor, or another
	// sharing the database) are void: their destinations are found below.
	s.maintain(ctx)
	nextSweep := s.o.Clock.Now()
	nextMaintain := nextSweep.Add(s.o.Maintain)
	for {
		now := s.o.Clock.Now()
		if !now.Before(nextSweep) {
			s.WakeAll(ctx)
			nextSweep = now.Add(s.o.Sweep)
		}
		if !now.Before(nextMaintain) {
			s.maintain(ctx)
			nextMaintain = now.Add(s.o.Maintain)
		}
		wait := min(nextSweep.Sub(now), nextMaintain.Sub(now))
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
		case <-lost:
			if ctx.Err() != nil {
				continue // stopping
			}
			// The database no longer knows this daemon as alive: its
			// leases are void and its sends stopped. It holds again under
			// a new name and takes its destinations back.
			s.o.Logger.Warn("lost the database session that holds the outbound leases; taking them again")
			old, _, _ := s.holder()
			if lost, ok = s.hold(ctx); ok {
				s.dropLeasesOf(ctx, old)
				nextSweep = s.o.Clock.Now()
			}
		case <-s.poke:
			nextSweep = now // read the queue now
		case <-s.sched:
		case <-s.o.Clock.After(wait):
		}
	}
}

// hold makes the database know this daemon as a live sender under a new
// name, trying every Maintain until it does or ctx ends. Meanwhile the
// workers send nothing.
func (s *Sender) hold(ctx context.Context) (<-chan struct{}, bool) {
	s.mu.Lock()
	s.held = false
	s.mu.Unlock()
	for {
		owner := newOwner()
		lost, err := s.db.HoldOutboundOwner(ctx, owner)
		if err == nil {
			sctx, cancel := context.WithCancel(ctx)
			go func() {
				select {
				case <-lost:
				case <-ctx.Done():
				}
				cancel()
			}()
			s.mu.Lock()
			s.owner, s.held, s.sendCtx = owner, true, sctx
			s.mu.Unlock()
			return lost, true
		}
		s.dbError(ctx, s.o.Logger, err, "holding the outbound leases")
		select {
		case <-ctx.Done():
			return nil, false
		case <-s.o.Clock.After(s.o.Maintain):
		}
	}
}

// dropLeasesOf gives up the leases this daemon held under its old name
// (void already where the database knows it gone), so that it can take
// them again under the new one.
func (s *Sender) dropLeasesOf(ctx context.Context, old string) {
	s.mu.Lock()
	names := make([]string, 0, len(s.dests))
	for name := range s.dests {
		names = append(names, name)
	}
	s.mu.Unlock()
	for _, name := range names {
		if err := s.db.ReleaseDestination(ctx, name, old); err != nil {
			s.dbError(ctx, s.o.Logger.WithField("destination", name), err, "releasing a destination's lease")
		}
	}
}

// holder is this daemon's name in leases and the context of its sends;
// ok false while the database does not know it as alive.
func (s *Sender) holder() (owner string, sendCtx context.Context, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.owner, s.sendCtx, s.held
}

// watch hears the other daemons' news about destinations until ctx ends.
func (s *Sender) watch(ctx context.Context) {
	for ctx.Err() == nil {
		err := s.db.WatchOutbound(ctx, s.outboundEvent)
		if err != nil {
			s.dbError(ctx, s.o.Logger, err, "listening for the outbound news of other daemons")
		}
		select {
		case <-ctx.Done():
		case <-s.o.Clock.After(s.o.Maintain):
		}
	}
}

// outboundEvent acts on news about a destination: a lease given up wakes
// it if a worker here wanted it; failures forgotten end its wait.
func (s *Sender) outboundEvent(ev storage.OutboundEvent) {
	switch ev.Kind {
	case storage.OutboundAlive:
		s.mu.Lock()
		delete(s.failing, ev.Destination)
		s.mu.Unlock()
		s.wake(ev.Destination, true)
	case storage.OutboundHandedOver:
		// A daemon stopped with work left for this destination.
		s.wake(ev.Destination, false)
	case storage.OutboundReleased:
		s.mu.Lock()
		wanted := s.blocked[ev.Destination]
		delete(s.blocked, ev.Destination)
		s.mu.Unlock()
		if wanted {
			s.wake(ev.Destination, false)
		}
	}
}

// maintain reclaims the leases of daemons that are gone, waking their
// destinations, and reads the shared retry state: a destination waiting
// here whose failures were forgotten (by another daemon, which reached it
// or heard from it, or by an operator) is tried at once.
func (s *Sender) maintain(ctx context.Context) {
	// A daemon gone since the last look may have left work without a
	// lease (queued, not yet taken up): every queue is read again.
	owners, err := s.db.OutboundOwners(ctx)
	if err != nil {
		s.dbError(ctx, s.o.Logger, err, "reading the live daemons of the database")
	} else {
		live := make(map[int64]bool, len(owners))
		gone := false
		for _, o := range owners {
			live[o] = true
		}
		for o := range s.owners {
			gone = gone || !live[o]
		}
		s.owners = live
		if gone {
			s.WakeAll(ctx)
		}
	}
	dead, err := s.db.ReclaimDeadLeases(ctx)
	if err != nil {
		s.dbError(ctx, s.o.Logger, err, "reclaiming the leases of daemons that are gone")
	}
	for _, d := range dead {
		s.mu.Lock()
		delete(s.blocked, d)
		s.mu.Unlock()
		s.wake(d, false)
	}
	s.mu.Lock()
	s.epoch++
	epoch := s.epoch
	s.mu.Unlock()
	retries, err := s.db.DestinationRetries(ctx)
	if err != nil {
		s.dbError(ctx, s.o.Logger, err, "reading the destinations' retry state")
		return
	}
	failing := make(map[string]bool, len(retries))
	for _, r := range retries {
		failing[r.Destination] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failing = failing
	for _, d := range s.dests {
		// Set aside before this read began: its failures were stored by then.
		if d.state == waiting && d.attempt > 0 && d.epoch < epoch && !failing[d.name] {
			s.revive(d)
		}
	}
}

// writeResets stores the signs of life of failing destinations (see
// DestinationAlive) until ctx ends.
func (s *Sender) writeResets(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.resetReady:
		}
		s.mu.Lock()
		resets := s.resets
		s.resets = map[string]int64{}
		s.mu.Unlock()
		for name, at := range resets {
			s.resetStored(ctx, name, at)
		}
	}
}

// resetStored forgets a destination's failures stored up to at (ms: when
// it was heard from or reached), telling the other daemons. A failure
// stored after that (the retry the sign of life set off failed too) stays.
func (s *Sender) resetStored(ctx context.Context, dest string, at int64) {
	if _, err := s.db.ResetDestination(ctx, dest, at); err != nil {
		s.dbError(ctx, s.o.Logger.WithField("destination", dest), err, "forgetting a destination's failures")
		return
	}
	if _, still, err := s.db.DestinationRetryOf(ctx, dest); err == nil && !still {
		s.mu.Lock()
		delete(s.failing, dest)
		s.mu.Unlock()
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
	pres, err := s.presenceDestinations(ctx)
	if err != nil {
		s.dbError(ctx, s.o.Logger, err, "reading the outbound presence queue")
	}
	for _, d := range append(append(append(dests, more...), rooms...), pres...) {
		s.wake(d, false)
	}
}

// DestinationAlive ends a backoff towards dest and zeroes its failures: it
// just showed it is up. It only updates the sender's bookkeeping, so a
// request path may call it; the failures stored in the database (by this
// daemon or another) are forgotten in the background, which tells the
// other daemons.
func (s *Sender) DestinationAlive(dest string) {
	s.wake(dest, true)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, pending := s.resets[dest]; s.failing[dest] && s.running && !s.stopping && !pending {
		s.resets[dest] = s.o.Clock.Now().UnixMilli()
		select {
		case s.resetReady <- struct{}{}:
		default:
		}
	}
}

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
		s.revive(d)
	}
}

// revive zeroes the failures of d, which is not with a worker, and queues
// it if it waits. s.mu is held.
func (s *Sender) revive(d *destination) {
	d.attempt, d.failingSince, d.retryAt = 0, time.Time{}, time.Time{}
	if d.state == waiting {
		s.enqueue(d)
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
		at := d.retryAt
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
	d.epoch = s.epoch
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

// process does one step for d: take its lease, then send one batch, or
// decide to wait, to come back, or that nothing is left.
func (s *Sender) process(ctx context.Context, d *destination) {
	log := s.o.Logger.WithField("destination", d.name)
	owner, sendCtx, ok := s.holder()
	if !ok {
		// Not known as alive: no lease would be safe to use.
		s.setAside(d, later(d.retryAt, s.o.Clock.Now().Add(s.o.Maintain)))
		return
	}
	held, kept, err := s.renew(ctx, d.name, owner)
	if err != nil {
		s.dbError(ctx, log, err, "renewing a destination's lease")
		// Database trouble does not shorten a failed destination's backoff.
		s.setAside(d, later(d.retryAt, s.o.Clock.Now().Add(s.o.MinRetry)))
		return
	}
	if !held {
		// Another daemon sends to d; its sender carries on. When it gives
		// the lease back (or is gone) this daemon hears of it.
		s.standDown(d)
		return
	}
	s.mu.Lock()
	delete(s.blocked, d.name)
	s.mu.Unlock()
	if !kept {
		// Another daemon may have had it meanwhile, and sent the batch
		// or changed the failures: both are read again.
		d.batch, d.toDev, d.pdus, d.txn, d.txnID = nil, nil, nil, fedclient.Transaction{}, ""
		d.presence = nil
		d.known = false
	}
	if now := s.o.Clock.Now(); now.Before(d.retryAt) {
		s.pause(ctx, d, owner, log)
		s.setAside(d, d.retryAt)
		return
	}
	if d.txnID == "" {
		batch, err := s.db.PendingUpdates(ctx, d.name, fedclient.MaxEDUsPerTransaction)
		if err != nil {
			s.dbError(ctx, log, err, "outbound device-list queue")
			s.setAside(d, s.o.Clock.Now().Add(s.o.MinRetry))
			return
		}
		toDev, err := s.pendingToDevice(ctx, d.name, fedclient.MaxEDUsPerTransaction-len(batch))
		if err != nil {
			s.dbError(ctx, log, err, "outbound to-device queue")
			s.setAside(d, s.o.Clock.Now().Add(s.o.MinRetry))
			return
		}
		pdus, err := s.pendingPDUs(ctx, d.name, fedclient.MaxPDUsPerTransaction)
		if err != nil {
			s.dbError(ctx, log, err, "outbound PDU queue")
			s.setAside(d, s.o.Clock.Now().Add(s.o.MinRetry))
			return
		}
		pres, err := s.pendingPresence(ctx, d.name, fedclient.MaxEDUsPerTransaction-len(batch)-len(toDev))
		if err != nil {
			s.dbError(ctx, log, err, "outbound presence queue")
			s.setAside(d, s.o.Clock.Now().Add(s.o.MinRetry))
			return
		}
		if len(batch)+len(toDev)+len(pdus)+len(pres) == 0 {
			s.finish(ctx, d, owner, log)
			return
		}
		d.batch, d.toDev, d.pdus, d.presence = batch, toDev, pdus, pres
		d.txnID = s.nextTxnID(owner)
		d.txn = fedclient.Transaction{Origin: s.o.ServerName, OriginServerTS: s.o.Clock.Now().UnixMilli(), PDUs: pduJSON(pdus)}
		for _, u := range batch {
			d.txn.EDUs = append(d.txn.EDUs, s.edu(log, u))
		}
		for _, e := range toDev {
			typ := e.Type
			if typ == "" {
				typ = directToDevice
			}
			d.txn.EDUs = append(d.txn.EDUs, fedclient.EDU{Type: typ, Content: e.Content})
		}
		if len(pres) > 0 {
			d.txn.EDUs = append(d.txn.EDUs, presenceEDU(pres))
		}
	}
	// The sender keeps its own retry times, so the federation client's
	// backoff (which makes the requests of clients fail fast) does not
	// hold it back.
	err = s.tr.SendTransaction(fedclient.WithLive(sendCtx, d.name), d.name, d.txnID, d.txn)
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
		if err == nil {
			err = s.markPresenceSent(ctx, d.name, d.presence)
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
		if d.attempt > 0 || s.isFailing(d.name) {
			s.resetStored(ctx, d.name, s.o.Clock.Now().UnixMilli()) // it was reached: its failures go
		}
		full := len(d.batch)+len(d.toDev) == fedclient.MaxEDUsPerTransaction || len(d.pdus) == fedclient.MaxPDUsPerTransaction ||
			len(d.presence) == maxPresencePerEDU
		d.batch, d.toDev, d.pdus, d.txn, d.txnID = nil, nil, nil, fedclient.Transaction{}, ""
		d.presence = nil
		d.attempt, d.failingSince = 0, time.Time{}
		if full {
			s.requeue(d)
		} else {
			s.finish(ctx, d, owner, log)
		}
		return
	}
	if ctx.Err() != nil || sendCtx.Err() != nil {
		// Stopping, or the leases are void: not an attempt.
		s.setAside(d, s.o.Clock.Now())
		return
	}
	// Every failed request is counted, one whose destination showed it is
	// up meanwhile too.
	var be *fedclient.BackoffError
	skipped := errors.As(err, &be)
	if skipped {
		metrics.OutboundSkipped.Inc()
	} else {
		metrics.OutboundFailures.Inc()
	}
	if s.revivedDuringSend(d) {
		// It showed it is up while the send failed: tried again at once,
		// its failures zeroed (and forgotten in the database by the sign
		// of life).
		return
	}
	now := s.o.Clock.Now()
	if !d.known {
		r, ok, err := s.db.DestinationRetryOf(ctx, d.name)
		if err != nil {
			s.dbError(ctx, log, err, "reading a destination's retry state")
		}
		if ok {
			d.attempt, d.failingSince = r.Attempts, time.UnixMilli(r.FailingSince)
		}
		d.known = err == nil
	}
	var wait time.Duration
	if skipped {
		// The client refused without trying: not an attempt.
		wait = max(be.Until.Sub(now), time.Millisecond)
	} else {
		d.attempt++
		if d.failingSince.IsZero() {
			d.failingSince = now
		}
		wait = s.retryDelay(d.attempt, now.Sub(d.failingSince))
	}
	if d.attempt == 5 {
		log.WithError(err).Warn("transaction cannot be delivered; retrying with backoff")
	}
	retryAt := now.Add(wait)
	if !d.failingSince.IsZero() {
		if err := s.db.RecordDestinationFailure(ctx, storage.DestinationRetry{Destination: d.name, Attempts: d.attempt,
			FailingSince: d.failingSince.UnixMilli(), RetryAt: retryAt.UnixMilli(), RecordedAt: s.o.Clock.Now().UnixMilli()}); err != nil {
			s.dbError(ctx, log, err, "storing a destination's retry state")
		}
		s.mu.Lock()
		s.failing[d.name] = true
		s.mu.Unlock()
	}
	s.pause(ctx, d, owner, log)
	s.setAside(d, retryAt)
}

// retryDelay is the wait after a destination's attempt-th failure in a
// row, silent for that long: doubling from MinRetry, but at most about
// RecentRetry while silent for less than RecentWindow; beyond, as long
// again as it has been silent beyond the window (about doubling each
// time), at most MaxRetry. A capped wait is shortened by up to a quarter
// of jitter, an uncapped one lengthened, so that retries of many peers
// that failed together spread out.
func (s *Sender) retryDelay(attempt int, silent time.Duration) time.Duration {
	spread := func(wait time.Duration) time.Duration {
		return wait - time.Duration(s.o.Jitter(int64(wait)/4+1))
	}
	if silent < s.o.RecentWindow {
		if wait := backoff.Delay(attempt, s.o.MinRetry, s.o.RecentRetry, s.o.Jitter); wait < s.o.RecentRetry {
			return wait
		}
		return spread(s.o.RecentRetry)
	}
	return spread(min(max(silent-s.o.RecentWindow, s.o.RecentRetry), s.o.MaxRetry))
}

// standDown forgets d, whose lease another daemon holds, remembering that
// a worker here wanted it.
func (s *Sender) standDown(d *destination) {
	s.mu.Lock()
	s.blocked[d.name] = true
	s.mu.Unlock()
	s.forget(d, false)
}

// pause lets the other daemons take d's lease while it waits.
func (s *Sender) pause(ctx context.Context, d *destination, owner string, log logrus.FieldLogger) {
	if err := s.db.PauseDestination(ctx, d.name, owner); err != nil {
		s.dbError(ctx, log, err, "pausing a destination's lease")
	}
}

// revivedDuringSend queues d again at once, its failures zeroed, when it
// showed it is up while a worker had it.
func (s *Sender) revivedDuringSend(d *destination) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !d.alive || s.stopping {
		return false
	}
	d.attempt, d.failingSince, d.retryAt = 0, time.Time{}, time.Time{}
	s.enqueue(d)
	return true
}

// KnowsFailing reports whether this daemon knows dest to have failures
// stored (its own, or another daemon's as of its last read of the retry
// state, at most a second old): only then does a sign of life from dest
// make it forget them for every daemon (for tests).
func (s *Sender) KnowsFailing(dest string) bool { return s.isFailing(dest) }

// isFailing reports whether dest is known to have failures stored.
func (s *Sender) isFailing(dest string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failing[dest]
}

// nextTxnID names a new transaction. A server that receives it takes a
// transaction ID it has seen from this server before for a retry, and
// answers it without reading it. Daemons sharing a database are one
// server, and their counters (each starting from the time it started)
// meet once one has sent as many transactions as milliseconds passed
// between their starts: the daemon's name in front keeps their IDs apart.
func (s *Sender) nextTxnID(owner string) string {
	return owner + "." + strconv.FormatInt(s.txn.Add(1), 10)
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
func (s *Sender) finish(ctx context.Context, d *destination, owner string, log logrus.FieldLogger) {
	if err := s.db.ReleaseDestination(ctx, d.name, owner); err != nil {
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
		var pres []storage.OutboundEDU
		pres, err = s.pendingPresence(ctx, d.name, 1)
		if len(pres) > 0 {
			pending = make([]storage.OutboundUpdate, 1)
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

// releaseAll gives up the leases at shutdown, telling the other daemons,
// so that they (or the next start) take over at once.
func (s *Sender) releaseAll() {
	s.mu.Lock()
	names := make([]string, 0, len(s.dests))
	for name := range s.dests {
		names = append(names, name)
	}
	s.dests = map[string]*destination{}
	s.queue = nil
	owner := s.owner
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, name := range names {
		if err := s.db.HandOverDestination(ctx, name, owner); err != nil {
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

func (s *Sender) renew(ctx context.Context, dest, owner string) (held, kept bool, err error) {
	now := s.o.Clock.Now()
	return s.db.AcquireDestination(ctx, dest, owner, now.UnixMilli(), now.Add(leaseTTL).UnixMilli())
}

// edu is the EDU of a queued update, as FormatUpdate makes it.
func (s *Sender) edu(log logrus.FieldLogger, u storage.OutboundUpdate) fedclient.EDU {
	typ, content, err := s.o.FormatUpdate(u, s.o.DeviceNames)
	if err != nil {
		log.WithError(err).WithField("user_id", u.UserID).Warn("stored keys without their signatures in an update")
	}
	return fedclient.EDU{Type: typ, Content: content}
}
