package sqlite3

import (
	"context"
	"database/sql"
	"time"

	"github.com/sirupsen/logrus"
)

// pacing is when the checkpointer works, in log pages of 4 KiB.
type pacing struct {
	// interval is the least time between two rounds of checkpoints;
	// rounds run only after writes.
	interval time.Duration
	// restartPages is the log size past which a round ends with writers
	// held back, so that the log can start over (see checkpointer.round).
	restartPages int
	// bigLog is the size past which the checkpointer makes room however
	// long writers must wait: readers using the log's end keep it from
	// starting over, and a log that only grows costs disk and slows reads.
	bigLog int
}

// defaultPacing: holding writers back costs 10-20 ms under a steady
// stream of writes (the syncs of what arrived during the pass before; on
// a slow disk they dominate), and every request that comes meanwhile
// waits for it, so it is done rarely: at 2,000 room messages a second
// the log grows by ~40 MiB a second and reaches 256 MiB in ~6 s, which
// keeps the holds out of the 99th percentile of latency (at 64 MiB they
// were in it). The log file keeps its largest size on disk. Most of the
// time writes pause long enough for a passive checkpoint to finish, and
// the log starts over by itself, well before. A round a second rather
// than ten: the pages every write touches (the stream's counter, the
// last pages of tables and indexes) are copied and synced once a second
// rather than ten times, which left room messages 5-10 % more of the
// machine.
var defaultPacing = pacing{interval: time.Second, restartPages: 65536, bigLog: 262144}

// writeTurn is SQLite's one writer at a time, taken in this process: a
// write waits here instead of spinning on SQLITE_BUSY, and the
// checkpointer can hold writers back for the short step that needs them
// quiet.
//
// Writers take turns in the order they came. The turn is a channel with
// room for one: blocked senders queue in order, and a newcomer cannot pass
// them while the turn is being handed on. sync.Mutex lets a running
// goroutine take a lock just freed ahead of the woken waiter, and under a
// steady stream of uploads that made a few of them wait many turns.
type writeTurn struct {
	ch   chan struct{}
	ckpt *checkpointer // nil for an in-memory database
}

func newWriteTurn() *writeTurn { return &writeTurn{ch: make(chan struct{}, 1)} }

func (t *writeTurn) lock()   { t.ch <- struct{}{} }
func (t *writeTurn) unlock() { <-t.ch }

// checkpointer copies the write-ahead log back into the database file in
// the background, on a connection of its own.
//
// SQLite's default checkpoint runs inside a commit, every 1000 pages: it
// copies pages and syncs the file while every other writer waits, and under
// a steady stream of uploads that was most of their worst latency. A
// passive checkpoint takes no lock a writer needs, so here the bulk of the
// copying goes on beside the writers. But a log can only start over once a
// checkpoint has copied all of it, which never happens while writes keep
// coming; so once the log is large, a round ends by copying the last few
// pages with writers held back, and the next write starts the log over.
type checkpointer struct {
	pacing
	db     *sql.DB
	turn   *writeTurn
	kick   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

func startCheckpointer(db *sql.DB, turn *writeTurn, p pacing) *checkpointer {
	ctx, cancel := context.WithCancel(context.Background())
	c := &checkpointer{pacing: p, db: db, turn: turn, kick: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	go c.run(ctx)
	return c
}

// wrote notes a write; it never blocks the writer.
func (c *checkpointer) wrote() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

func (c *checkpointer) stop() {
	c.cancel()
	<-c.done
}

func (c *checkpointer) run(ctx context.Context) {
	defer close(c.done)
	pause := time.NewTimer(0)
	defer pause.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
		}
		if err := c.round(ctx); err != nil && ctx.Err() == nil {
			logrus.WithError(err).Warn("SQLite checkpoint failed; the write-ahead log keeps growing until one succeeds")
		}
		// Writes during the pause are checkpointed after it.
		pause.Reset(c.interval)
		select {
		case <-ctx.Done():
			return
		case <-pause.C:
		}
	}
}

// round copies the log into the database. Each passive checkpoint copies
// what was in the log when it started; the second copies what arrived
// during the first, which is little, and the held-back one what arrived
// during the second, which is less.
func (c *checkpointer) round(ctx context.Context) error {
	logPages, err := c.checkpoint(ctx, "PASSIVE")
	if err != nil || logPages < c.restartPages {
		return err
	}
	if logPages >= c.bigLog {
		// RESTART waits for readers of the log to finish, keeping new
		// writers out, and the log starts over.
		logrus.WithField("log_pages", logPages).Debug("SQLite write-ahead log is large; restarting it")
		c.turn.lock()
		defer c.turn.unlock()
		_, err = c.checkpoint(ctx, "RESTART")
		return err
	}
	if _, err := c.checkpoint(ctx, "PASSIVE"); err != nil {
		return err
	}
	c.turn.lock()
	defer c.turn.unlock()
	_, err = c.checkpoint(ctx, "PASSIVE")
	return err
}

// checkpoint runs one checkpoint and returns the log's size in pages.
func (c *checkpointer) checkpoint(ctx context.Context, mode string) (int, error) {
	var busy, logPages, copied int
	err := c.db.QueryRowContext(ctx, "PRAGMA wal_checkpoint("+mode+")").Scan(&busy, &logPages, &copied)
	return logPages, err
}
