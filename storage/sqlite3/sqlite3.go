// Package sqlite3 holds what is particular to SQLite: how to open the
// embedded database file and tune it, and how its SQL differs from the
// shared dialect used by package sqlstore.
package sqlite3

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mattn/go-sqlite3"
)

// Types replaces the type placeholders of the shared schema.
var Types = map[string]string{
	"{{ID}}":     "INTEGER PRIMARY KEY AUTOINCREMENT",
	"{{BLOB}}":   "BLOB",
	"{{BIGINT}}": "INTEGER",
}

// IsURI reports whether uri names an SQLite database: "file:..." or a plain
// path.
func IsURI(uri string) bool {
	return !strings.Contains(uri, "://")
}

// DB is an SQLite database opened for the store: two connection pools on
// the one file, and the background checkpoints of its write-ahead log.
type DB struct {
	// Read runs statements outside transactions.
	Read *sql.DB
	// Write is a single connection for the write transactions. SQLite has
	// one writer at a time anyway, and keeping every write on one
	// connection keeps its page cache warm with what writes read (key
	// counts, the keys already stored). For ":memory:" it is Read.
	Write *sql.DB

	stop context.CancelFunc
	done chan struct{}
}

// Open opens the SQLite database at uri ("file:path" or a path), creating
// its directory if needed, with the settings the store relies on: WAL so
// readers never wait for the writer, a busy timeout for other processes,
// foreign keys, and immediate write transactions.
//
// The log is checkpointed in the background (see checkpoints) rather than
// by the writer: a checkpoint ends with an fsync, and inside a commit it
// would hold up every write queued behind it.
func Open(uri string) (*DB, error) {
	path := strings.TrimPrefix(uri, "file:")
	query := ""
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path, query = path[:i], path[i+1:]
	}
	if path == "" {
		return nil, errors.New("sqlite: empty database path")
	}
	if path != ":memory:" {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, fmt.Errorf("sqlite: create directory for %s: %w", path, err)
		}
	}
	params, err := url.ParseQuery(query)
	if err != nil {
		return nil, fmt.Errorf("sqlite: bad parameters in %q: %w", uri, err)
	}
	// busy_timeout must be in force before the journal mode is switched.
	setDefault(params, "_busy_timeout", "10000")
	setDefault(params, "_journal_mode", "WAL")
	setDefault(params, "_synchronous", "NORMAL")
	setDefault(params, "_foreign_keys", "on")
	setDefault(params, "_txlock", "immediate")
	dsn := "file:" + path + "?" + params.Encode()
	read, err := sql.Open("sqlite3", dsn)
	if err != nil {
		return nil, err
	}
	if path == ":memory:" {
		// Every connection would get its own empty database.
		read.SetMaxOpenConns(1)
		return &DB{Read: read, Write: read}, nil
	}
	read.SetMaxOpenConns(8)
	read.SetMaxIdleConns(8)
	write, err := sql.Open("sqlite3", dsn)
	if err != nil {
		read.Close()
		return nil, err
	}
	write.SetMaxOpenConns(1)
	write.SetMaxIdleConns(1)
	write.SetConnMaxIdleTime(0)
	// The setting belongs to the connection, which the pool keeps open.
	if _, err := write.Exec(`PRAGMA wal_autocheckpoint = 0`); err != nil {
		read.Close()
		write.Close()
		return nil, fmt.Errorf("sqlite: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	db := &DB{Read: read, Write: write, stop: stop, done: make(chan struct{})}
	go db.checkpoints(ctx, path+"-wal")
	return db, nil
}

// Checkpoint timing: a passive checkpoint every checkpointEvery copies the
// log into the database without stopping readers or the writer. Under a
// steady stream of writes such checkpoints never catch up with the end of
// the log, so it is never restarted; once it exceeds maxWALBytes a
// truncating checkpoint, which waits for the writer, empties it.
var (
	checkpointEvery       = time.Second
	maxWALBytes     int64 = 64 << 20
)

func (db *DB) checkpoints(ctx context.Context, walPath string) {
	defer close(db.done)
	t := time.NewTicker(checkpointEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		mode := "PASSIVE"
		if fi, err := os.Stat(walPath); err == nil && fi.Size() > maxWALBytes {
			mode = "TRUNCATE"
		}
		// Failures (a busy database) are left to the next round.
		_, _ = db.Read.ExecContext(ctx, `PRAGMA wal_checkpoint(`+mode+`)`)
	}
}

// Close stops the checkpoints and closes both pools (SQLite checkpoints
// the log when its last connection closes).
func (db *DB) Close() error {
	if db.stop != nil {
		db.stop()
		<-db.done
	}
	if db.Write != db.Read {
		db.Write.Close()
	}
	return db.Read.Close()
}

func setDefault(v url.Values, key, value string) {
	if v.Get(key) == "" {
		v.Set(key, value)
	}
}

// IsUniqueViolation reports whether err is a UNIQUE or PRIMARY KEY
// constraint failure.
func IsUniqueViolation(err error) bool {
	var se sqlite3.Error
	if errors.As(err, &se) {
		return se.ExtendedCode == sqlite3.ErrConstraintUnique || se.ExtendedCode == sqlite3.ErrConstraintPrimaryKey
	}
	return false
}
