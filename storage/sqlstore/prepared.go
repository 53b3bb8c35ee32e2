package sqlstore

import (
	"context"
	"database/sql"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/keyserver/keyserver/storage"
)

// maxPrepared bounds how many distinct SQL texts are kept prepared, and
// maxPreparedArgs which: the store's SQL is fixed text apart from IN lists
// and multi-row INSERTs, whose text varies with their length. Short ones
// (the hot paths: a query's users, an upload's few keys) are prepared on
// first use; long ones are rare shapes, not worth a prepared statement per
// pooled connection, and run unprepared. Once the bound is reached any new
// text runs unprepared, so odd requests cannot grow the cache.
const (
	maxPrepared     = 512
	maxPreparedArgs = 64
)

// stmtCache prepares each distinct SQL text once for the pool and keeps it.
// A prepared statement saves the parse and plan on every execution, and on
// PostgreSQL it also saves a round trip: lib/pq sends a query with
// parameters as a prepare followed by an execute, each waiting for its
// answer, while a prepared statement is one execute. database/sql prepares
// the statement again by itself on each pooled connection that needs it.
type stmtCache struct {
	db    *sql.DB
	stmts sync.Map // SQL text -> *sql.Stmt; read without locking
	mu    sync.Mutex
	n     int
	full  atomic.Bool // n reached maxPrepared: no more are prepared
	// sent counts the statements sent to the database, prepared or not,
	// transaction begins and ends included: each is a round trip.
	sent atomic.Int64
	// uncancelable runs statements without their context's cancellation
	// (SQLite). go-sqlite3 runs a statement, and each row step of a query,
	// on a new goroutine when the context can be cancelled, so that it can
	// interrupt it; under load those hand-offs cost more than the
	// statements, and the writer's hold on the database lasted as long as
	// its goroutines waited to be scheduled. SQLite statements here take
	// well under a millisecond, so there is little to cancel.
	uncancelable bool
}

// statementContext is the context a statement runs with (see uncancelable).
func (c *stmtCache) statementContext(ctx context.Context) context.Context {
	if c.uncancelable {
		return context.WithoutCancel(ctx)
	}
	return ctx
}

// lookup returns the statement prepared for query, if it is.
func (c *stmtCache) lookup(query string) (*sql.Stmt, bool) {
	st, ok := c.stmts.Load(query)
	if !ok {
		return nil, false
	}
	return st.(*sql.Stmt), true
}

// get counts a statement sent and returns its prepared form, preparing it
// on first use; nil means it runs unprepared (see maxPrepared).
func (c *stmtCache) get(ctx context.Context, query string, nargs int) (*sql.Stmt, error) {
	c.sent.Add(1)
	return c.prepare(ctx, query, nargs)
}

func (c *stmtCache) prepare(ctx context.Context, query string, nargs int) (*sql.Stmt, error) {
	if st, ok := c.stmts.Load(query); ok {
		return st.(*sql.Stmt), nil
	}
	if nargs > maxPreparedArgs || c.full.Load() {
		return nil, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.stmts.Load(query); ok {
		return st.(*sql.Stmt), nil
	}
	if c.n >= maxPrepared {
		c.full.Store(true)
		return nil, nil
	}
	st, err := c.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	c.stmts.Store(query, st)
	c.n++
	return st, nil
}

func (c *stmtCache) close() {
	c.stmts.Range(func(_, st any) bool {
		st.(*sql.Stmt).Close()
		return true
	})
}

// querier runs statements: a pool or a transaction.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

var _, _ querier = pool{}, (*txn)(nil)

// pool runs statements on the connection pool through the cache. It has
// the method set of *sql.DB that the store uses, so call sites read the same.
type pool struct {
	db    *sql.DB
	cache *stmtCache
}

func (p pool) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	ctx = p.cache.statementContext(ctx)
	st, err := p.cache.get(ctx, query, len(args))
	if err != nil {
		return nil, err
	}
	if st == nil {
		return p.db.QueryContext(ctx, query, args...)
	}
	return st.QueryContext(ctx, args...)
}

// QueryRowContext returns a row whose Scan reports a failure to prepare.
func (p pool) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	ctx = p.cache.statementContext(ctx)
	st, err := p.cache.get(ctx, query, len(args))
	if err != nil || st == nil {
		// database/sql has no way to build a *sql.Row holding an error;
		// running the query unprepared reports the same error, or runs it
		// when the cache is full.
		return p.db.QueryRowContext(ctx, query, args...)
	}
	return st.QueryRowContext(ctx, args...)
}

func (p pool) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	ctx = p.cache.statementContext(ctx)
	st, err := p.cache.get(ctx, query, len(args))
	if err != nil {
		return nil, err
	}
	if st == nil {
		return p.db.ExecContext(ctx, query, args...)
	}
	return st.ExecContext(ctx, args...)
}

// txn is a transaction that runs its statements through the cache. A
// statement the pool has prepared runs through the transaction (database/sql
// prepares it on the transaction's connection the first time that
// connection runs it).
type txn struct {
	tx    *sql.Tx
	cache *stmtCache
	// afterCommit runs once the transaction has committed, for what must
	// follow the commit and never precede it (dropping cached state).
	afterCommit []func()
	// missed are the statements run unprepared (see stmt).
	missed []missedStmt
	// pos is the last stream position the transaction took (0: none);
	// concerned are the local users its changes concern, and lookedUp the
	// users whose room-mates are in it already (see storage.Change).
	pos       storage.StreamPos
	concerned map[string]struct{}
	// sorted is a sorted list of concerned users kept as it is while it
	// is all the transaction concerns (concernSorted): a room's local
	// members, shared by every message of the room, are not copied.
	sorted   []string
	lookedUp map[string]bool
	// notified: the stream notification is sent already (notifyEarly).
	notified bool
	// deviceUpdatesQueued: device-list updates were queued for other
	// servers (announceDevices); the sender has work.
	deviceUpdatesQueued bool
}

// concern adds local users the transaction's changes concern.
func (t *txn) concern(users ...string) {
	if t.concerned == nil {
		t.concerned = map[string]struct{}{}
	}
	if sorted := t.sorted; sorted != nil {
		t.sorted = nil
		t.concern(sorted...)
	}
	for _, u := range users {
		t.concerned[u] = struct{}{}
	}
}

// change is what the transaction did to the stream so far.
// concernSorted is concern for a sorted list of distinct users that
// nobody changes.
func (t *txn) concernSorted(users []string) {
	if t.concerned == nil && t.sorted == nil {
		t.sorted = users
		return
	}
	t.concern(users...)
}

func (t *txn) change() storage.Change {
	if t.pos == 0 {
		return storage.Change{}
	}
	if t.concerned == nil && t.sorted != nil {
		return storage.Change{Pos: t.pos, Users: t.sorted} // shared: read only
	}
	users := make([]string, 0, len(t.concerned))
	for u := range t.concerned {
		users = append(users, u)
	}
	sort.Strings(users)
	return storage.Change{Pos: t.pos, Users: users}
}

// onCommit registers f to run after the transaction commits.
func (t *txn) onCommit(f func()) { t.afterCommit = append(t.afterCommit, f) }

// stmt returns the prepared form of query bound to the transaction, or
// nil when the statement is not prepared yet: preparing it on the pool
// here could wait for the very connection the transaction holds (SQLite's
// write pool has one), so it runs unprepared this once and is prepared
// after the transaction ends (see prepareMissed).
func (t *txn) stmt(ctx context.Context, query string, nargs int) *sql.Stmt {
	t.cache.sent.Add(1)
	st, ok := t.cache.lookup(query)
	if !ok {
		if nargs <= maxPreparedArgs {
			t.missed = append(t.missed, missedStmt{query, nargs})
		}
		return nil
	}
	return t.tx.StmtContext(ctx, st)
}

type missedStmt struct {
	query string
	nargs int
}

// prepareMissed prepares the statements the transaction ran unprepared,
// once its connection is back in the pool. A statement that fails to
// prepare is simply tried again the next time it runs.
func (t *txn) prepareMissed(ctx context.Context) {
	for _, m := range t.missed {
		_, _ = t.cache.prepare(ctx, m.query, m.nargs)
	}
}

func (t *txn) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	ctx = t.cache.statementContext(ctx)
	if st := t.stmt(ctx, query, len(args)); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return t.tx.QueryContext(ctx, query, args...)
}

func (t *txn) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	ctx = t.cache.statementContext(ctx)
	if st := t.stmt(ctx, query, len(args)); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return t.tx.QueryRowContext(ctx, query, args...)
}

func (t *txn) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	ctx = t.cache.statementContext(ctx)
	if st := t.stmt(ctx, query, len(args)); st != nil {
		return st.ExecContext(ctx, args...)
	}
	return t.tx.ExecContext(ctx, query, args...)
}
