package sqlstore

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
)

// maxPrepared bounds how many distinct SQL texts are kept prepared. The
// store's SQL is fixed text apart from IN lists and multi-row INSERTs, whose
// text varies with their length; the common lengths come first and stay
// prepared, and anything past the bound simply runs unprepared.
const maxPrepared = 512

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
	// sent counts the statements sent to the database, prepared or not,
	// transaction begins and ends included: each is a round trip.
	sent atomic.Int64
}

// lookup returns the statement prepared for query, if it is.
func (c *stmtCache) lookup(query string) (*sql.Stmt, bool) {
	st, ok := c.stmts.Load(query)
	if !ok {
		return nil, false
	}
	return st.(*sql.Stmt), true
}

// get returns the prepared statement for query, preparing it on first use,
// or nil once the cache is full.
func (c *stmtCache) get(ctx context.Context, query string) (*sql.Stmt, error) {
	c.sent.Add(1)
	if st, ok := c.stmts.Load(query); ok {
		return st.(*sql.Stmt), nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.stmts.Load(query); ok {
		return st.(*sql.Stmt), nil
	}
	if c.n >= maxPrepared {
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

// pool runs statements on the connection pool through the cache. It has
// the method set of *sql.DB that the store uses, so call sites read the same.
type pool struct {
	db    *sql.DB
	cache *stmtCache
}

func (p pool) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	st, err := p.cache.get(ctx, query)
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
	st, err := p.cache.get(ctx, query)
	if err != nil || st == nil {
		// database/sql has no way to build a *sql.Row holding an error;
		// running the query unprepared reports the same error, or runs it
		// when the cache is full.
		return p.db.QueryRowContext(ctx, query, args...)
	}
	return st.QueryRowContext(ctx, args...)
}

func (p pool) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, err := p.cache.get(ctx, query)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return p.db.ExecContext(ctx, query, args...)
	}
	return st.ExecContext(ctx, args...)
}

// txn is a transaction that runs its statements through the cache. A
// statement already prepared on the transaction's connection is reused.
type txn struct {
	tx    *sql.Tx
	cache *stmtCache
	// afterCommit runs once the transaction has committed, for what must
	// follow the commit and never precede it (dropping cached state).
	afterCommit []func()
	// missed are the statements run unprepared (see stmt).
	missed []string
}

// onCommit registers f to run after the transaction commits.
func (t *txn) onCommit(f func()) { t.afterCommit = append(t.afterCommit, f) }

// stmt returns the prepared form of query bound to the transaction, or
// nil when the statement is not prepared yet: preparing it on the pool
// here could wait for the very connection the transaction holds (SQLite's
// write pool has one), so it runs unprepared this once and is prepared
// after the transaction ends (see prepareMissed).
func (t *txn) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	st, ok := t.cache.lookup(query)
	if !ok {
		t.cache.sent.Add(1)
		t.missed = append(t.missed, query)
		return nil, nil
	}
	t.cache.sent.Add(1)
	return t.tx.StmtContext(ctx, st), nil
}

// prepareMissed prepares the statements the transaction ran unprepared,
// once its connection is back in the pool.
func (t *txn) prepareMissed(ctx context.Context) {
	for _, q := range t.missed {
		if _, err := t.cache.get(ctx, q); err != nil {
			return // the statement failed in the transaction too
		}
		t.cache.sent.Add(-1) // preparing is not running it
	}
}

func (t *txn) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	st, err := t.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return t.tx.QueryContext(ctx, query, args...)
	}
	return st.QueryContext(ctx, args...)
}

func (t *txn) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	st, err := t.stmt(ctx, query)
	if err != nil || st == nil {
		return t.tx.QueryRowContext(ctx, query, args...)
	}
	return st.QueryRowContext(ctx, args...)
}

func (t *txn) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, err := t.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return t.tx.ExecContext(ctx, query, args...)
	}
	return st.ExecContext(ctx, args...)
}
