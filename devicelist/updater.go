package devicelist

import (
	"context"
	"errors"
	"hash/fnv"
	mrand "math/rand/v2"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/internal/backoff"
	"github.com/keyserver/keyserver/internal/clock"
	"github.com/keyserver/keyserver/internal/lograte"
	"github.com/keyserver/keyserver/storage"
)

// The device-list updater keeps remote users' cached device lists fresh.
//
// A remote user's list is marked stale in stale_device_lists (always before
// any fetch, so a crash cannot lose the need) when an update shows a gap,
// when a local user starts sharing a room with them, or by an operator.
// The updater resyncs stale users with GET /user/devices. Users are handed
// to a fixed number of shard workers by a hash of their server, and a shard
// works through its users one at a time, so at most one resync request per
// server is in flight however many of its users are stale.
//
// A failed resync is retried with backoff per server: the user's attempt
// count and next retry time are written to its row, and every other stale
// user of that server is held back until the same time, so a dead server
// costs one request per backoff period, not one per user. Servers that
// answer with an error wait longer than servers that time out (an answer
// means it is up but refusing, which rarely passes quickly); a Retry-After
// is honoured. Because the retry state lives in the database, a restart
// resumes where it left off; at start-up the users already due are spread
// over a short window rather than fetched all at once. The only state kept
// in memory is the set of users being worked on right now, so memory stays
// bounded however many users and servers there are.

// Store is the part of the database the updater uses: the queue of stale
// users with their retry state.
type Store interface {
	storage.StaleQueue
}

// dbErrorLogInterval is how often a database error of one kind is logged
// while it recurs.
const dbErrorLogInterval = time.Minute

// Options configure an Updater.
type Options struct {
	Shards int // workers, each owning a share of the servers (default 8)
	// Backoff after a server times out or cannot be reached, and after it
	// answers with an error (defaults: 30 s up to 10 min, 2 min up to 1 h).
	TimeoutBase, TimeoutMax time.Duration
	ErrorBase, ErrorMax     time.Duration
	// StartSpread is the longest window over which the users due at start
	// are spread (default 5 min, and 200 ms per user below that).
	StartSpread time.Duration
	Clock       clock.Clock
	Logger      logrus.FieldLogger
	// Jitter draws a random duration in [0, n); math/rand by default.
	Jitter func(n int64) int64
	// Wake is the signal that makes the updater look for due users; nil:
	// one of its own. Made before the updater, it lets the packages that
	// mark users stale be built first.
	Wake Signal
}

// Signal wakes an updater (see Options.Wake).
type Signal chan struct{}

// NewSignal makes a Signal.
func NewSignal() Signal { return make(Signal, 1) }

// Wake makes the updater that listens on the signal look for due users
// now; it never waits.
func (s Signal) Wake() {
	select {
	case s <- struct{}{}:
	default:
	}
}

// Resyncer fetches and stores one user's device list.
type Resyncer func(ctx context.Context, server, userID string) error

// Updater resyncs stale remote device lists in the background.
type Updater struct {
	db     Store
	resync Resyncer
	o      Options
	wake   Signal
	shards []chan storage.StaleUser
	// dbErrs rate-limits the database errors' log lines.
	dbErrs *lograte.Limiter

	// aliveSig says servers showed up (in alive): their users are made due.
	aliveSig chan struct{}

	mu       sync.Mutex
	inFlight map[string]bool // users handed to a shard and not done
	deferred map[string]bool // servers held back by this updater after failures
	alive    map[string]bool // held-back servers that showed up since
}

// New makes an Updater; Run starts it.
func New(db Store, resync Resyncer, o Options) *Updater {
	if o.Shards <= 0 {
		o.Shards = 8
	}
	if o.TimeoutBase <= 0 {
		o.TimeoutBase = 30 * time.Second
	}
	if o.TimeoutMax <= 0 {
		o.TimeoutMax = 10 * time.Minute
	}
	if o.ErrorBase <= 0 {
		o.ErrorBase = 2 * time.Minute
	}
	if o.ErrorMax <= 0 {
		o.ErrorMax = time.Hour
	}
	if o.StartSpread <= 0 {
		o.StartSpread = 5 * time.Minute
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
	if o.Wake == nil {
		o.Wake = NewSignal()
	}
	u := &Updater{db: db, resync: resync, o: o, wake: o.Wake, aliveSig: make(chan struct{}, 1),
		inFlight: map[string]bool{}, deferred: map[string]bool{}, alive: map[string]bool{},
		dbErrs: lograte.New(dbErrorLogInterval, o.Clock.Now)}
	for i := 0; i < o.Shards; i++ {
		u.shards = append(u.shards, make(chan storage.StaleUser, 64))
	}
	return u
}

// Wake makes the updater look for due users now.
func (u *Updater) Wake() { u.wake.Wake() }

// ServerAlive makes a server's stale users due soon: it has just shown it
// is up. It is called on the path of every authenticated federation
// request, so it never waits: only a server this updater held back needs
// a database write, which the background does; a burst of requests from
// one server hands it over once.
func (u *Updater) ServerAlive(server string) {
	u.mu.Lock()
	held := u.deferred[server]
	if held {
		delete(u.deferred, server)
		u.alive[server] = true
	}
	u.mu.Unlock()
	if held {
		select {
		case u.aliveSig <- struct{}{}:
		default:
		}
	}
}

// retryAlive makes the stale users of the servers that showed up due.
func (u *Updater) retryAlive(ctx context.Context) {
	u.mu.Lock()
	servers := u.alive
	u.alive = map[string]bool{}
	u.mu.Unlock()
	for server := range servers {
		if err := u.db.RetryServerNow(ctx, server); err != nil {
			// Its users wait out their backoff instead.
			u.dbError(ctx, u.o.Logger.WithField("server", server), err, "making a server's stale users due")
		}
	}
}

// InFlight counts the users being resynced now.
func (u *Updater) InFlight() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.inFlight)
}

// shardOf picks the shard that owns a server.
func (u *Updater) shardOf(server string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(server))
	return int(h.Sum32() % uint32(len(u.shards)))
}

// Run works until ctx ends.
func (u *Updater) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, ch := range u.shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u.shard(ctx, ch)
		}()
	}
	u.spreadStart(ctx)
	for ctx.Err() == nil {
		u.dispatch(ctx)
		wait := time.Minute
		if at, ok, err := u.db.NextStaleRetry(ctx); err != nil {
			u.dbError(ctx, u.o.Logger, err, "reading the next stale device list's retry time")
		} else if ok {
			wait = min(wait, max(time.UnixMilli(at).Sub(u.o.Clock.Now()), 0))
		}
		if wait == 0 {
			// The due users are all being worked on: a shard finishing one
			// wakes this loop.
			wait = time.Minute
		}
		select {
		case <-ctx.Done():
		case <-u.wake:
		case <-u.aliveSig:
			u.retryAlive(ctx)
		case <-u.o.Clock.After(wait):
		}
	}
	wg.Wait()
}

// spreadStart reschedules the users already due at start-up over a window
// that grows with their number, so a restart does not fire every resync at
// once.
func (u *Updater) spreadStart(ctx context.Context) {
	now := u.o.Clock.Now()
	due, err := u.db.DueStaleUsers(ctx, now.UnixMilli(), 100000)
	if err != nil {
		// They are then resynced as they come, without the spread.
		u.dbError(ctx, u.o.Logger, err, "reading stale device lists")
		return
	}
	if len(due) == 0 {
		return
	}
	window := min(time.Duration(len(due))*200*time.Millisecond, u.o.StartSpread)
	for _, s := range due {
		at := now.Add(time.Duration(u.o.Jitter(int64(window) + 1)))
		if err := u.db.RescheduleStale(ctx, s.UserID, s.Attempts, at.UnixMilli()); err != nil {
			u.dbError(ctx, u.o.Logger, err, "rescheduling a stale device list")
			return
		}
	}
	u.o.Logger.WithFields(logrus.Fields{"users": len(due), "window": window.String()}).Info("resuming stale device lists")
}

// dispatch hands the due users to their shards.
func (u *Updater) dispatch(ctx context.Context) {
	due, err := u.db.DueStaleUsers(ctx, u.o.Clock.Now().UnixMilli(), 256)
	if err != nil {
		u.dbError(ctx, u.o.Logger, err, "reading stale device lists")
		return
	}
	for _, s := range due {
		u.mu.Lock()
		busy := u.inFlight[s.UserID]
		if !busy {
			u.inFlight[s.UserID] = true
		}
		u.mu.Unlock()
		if busy {
			continue
		}
		select {
		case u.shards[u.shardOf(s.ServerName)] <- s:
		default: // the shard is full: the user stays due for the next round
			u.done(s.UserID)
		}
	}
}

func (u *Updater) done(userID string) {
	u.mu.Lock()
	delete(u.inFlight, userID)
	u.mu.Unlock()
}

func (u *Updater) shard(ctx context.Context, ch chan storage.StaleUser) {
	for {
		select {
		case <-ctx.Done():
			return
		case s := <-ch:
			u.resyncOne(ctx, s)
			u.done(s.UserID)
			u.Wake()
		}
	}
}

// resyncOne resyncs a user and, on failure, schedules the retry for the
// user and holds back the rest of its server.
func (u *Updater) resyncOne(ctx context.Context, s storage.StaleUser) {
	// Re-read the mark: it may be gone (resynced on demand meanwhile) or
	// held back by a failure of another user of the server.
	userID := s.UserID
	s, ok, err := u.db.StaleEntry(ctx, userID)
	if err != nil {
		// The user stays due: the next round tries again.
		u.dbError(ctx, u.o.Logger.WithField("user_id", userID), err, "reading a stale device list")
		return
	}
	if !ok || s.RetryAtTS > u.o.Clock.Now().UnixMilli() {
		return
	}
	err = u.resync(ctx, s.ServerName, s.UserID)
	if ctx.Err() != nil {
		return
	}
	if err == nil {
		u.mu.Lock()
		delete(u.deferred, s.ServerName)
		u.mu.Unlock()
		return
	}
	now := u.o.Clock.Now()
	attempts := s.Attempts + 1
	var wait time.Duration
	var be *fedclient.BackoffError
	var he *fedclient.HTTPError
	switch {
	case errors.As(err, &be):
		attempts = s.Attempts // refused without a try
		wait = max(be.Until.Sub(now), time.Second)
	case errors.As(err, &he):
		wait = backoff.Delay(attempts, u.o.ErrorBase, u.o.ErrorMax, u.o.Jitter)
		wait = max(wait, he.RetryAfter)
	default:
		wait = backoff.Delay(attempts, u.o.TimeoutBase, u.o.TimeoutMax, u.o.Jitter)
	}
	at := now.Add(wait).UnixMilli()
	log := u.o.Logger.WithFields(logrus.Fields{"server": s.ServerName, "user_id": s.UserID, "attempts": attempts, "retry_in": wait.String()})
	if attempts >= 3 && attempts != s.Attempts {
		log.WithError(err).Warn("device-list resync keeps failing")
	} else {
		log.WithError(err).Debug("device-list resync failed")
	}
	if err := u.db.RescheduleStale(ctx, s.UserID, attempts, at); err != nil {
		// The user stays due and is retried without its backoff.
		u.dbError(ctx, log, err, "rescheduling a stale device list")
		return
	}
	if err := u.db.DeferServer(ctx, s.ServerName, at); err != nil {
		// The server's other users are tried as they come due.
		u.dbError(ctx, log, err, "holding back a failing server's stale device lists")
		return
	}
	u.mu.Lock()
	u.deferred[s.ServerName] = true
	u.mu.Unlock()
}

// dbError logs a database error of the updater, at most once a minute per
// kind (msg). Errors from shutting down are not logged.
func (u *Updater) dbError(ctx context.Context, log logrus.FieldLogger, err error, msg string) {
	if ctx.Err() != nil {
		return
	}
	u.dbErrs.Warn(log, err, msg)
}
