// Package sqlite3 holds what is particular to SQLite: how to open the
// embedded database file and tune it, and how its SQL differs from the
// shared dialect used by package sqlstore.
package sqlite3

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/mattn/go-sqlite3"
)

// Schema fills the placeholders of the shared schema: types, and the
// statements only SQLite needs.
var Schema = map[string]string{
	"{{ID}}":     "INTEGER PRIMARY KEY AUTOINCREMENT",
	"{{BLOB}}":   "BLOB",
	"{{BIGINT}}": "INTEGER",
	// A claimed key comes off its count in the claim's own statement, with
	// no transaction around it (PostgreSQL does this in the statement).
	// Migrations split at a semicolon ending a line: the body's stays inside.
	"{{COUNT_CLAIMS}}": `CREATE TRIGGER one_time_keys_claimed AFTER DELETE ON one_time_keys
BEGIN
	UPDATE one_time_key_counts SET unclaimed = unclaimed - 1
	WHERE user_id = old.user_id AND device_id = old.device_id AND algorithm = old.algorithm; END;`,
	"{{DROP_CLAIM_INDEX}}": "DROP INDEX one_time_keys_claim;",
	// SQLite compares text as bytes unless told otherwise.
	"{{TEXT_AS_BYTES}}": "",
	"{{TEXT}}":          "TEXT",
	// The search index is an FTS4 table (compiled into every build of the
	// driver; FTS5 needs a build tag), its docid the event's event_nid.
	"{{EVENT_SEARCH}}": `CREATE VIRTUAL TABLE room_event_search USING fts4(room_id, key, value,
	notindexed=room_id, notindexed=key, tokenize=unicode61);`,
}

// IsURI reports whether uri names an SQLite database: "file:..." or a plain
// path.
func IsURI(uri string) bool {
	return !strings.Contains(uri, "://")
}

// DB is an SQLite database opened as the store uses it: two pools on the
// one file, and a checkpointer for the write pool's log.
type DB struct {
	// Read runs the statements outside transactions.
	Read *sql.DB
	// Write is a single connection for the write transactions. SQLite has
	// one writer at a time anyway, and keeping every write on one
	// connection keeps its page cache warm with what writes read (key
	// counts, the keys already stored).
	Write *sql.DB
	turn  *writeTurn
	// ckptDB is the checkpointer's own connection, so that it never waits
	// for a busy read pool while holding writers back.
	ckptDB *sql.DB
}

// Open opens the SQLite database at uri ("file:path" or a path), creating
// its directory if needed, with the settings the store relies on: WAL so
// readers never wait for the writer, a busy timeout for other processes,
// foreign keys, and immediate write transactions.
//
// The write connection never checkpoints the log itself; a goroutine does,
// on a connection of its own, while writers carry on (see checkpointer).
func Open(uri string) (*DB, error) { return open(uri, defaultPacing) }

func open(uri string, p pacing) (*DB, error) {
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
	if path != ":memory:" && params.Get("mode") != "memory" && params.Get("mode") != "ro" {
		if err := ownerOnly(path); err != nil {
			return nil, err
		}
	}
	// busy_timeout must be in force before the journal mode is switched.
	setDefault(params, "_busy_timeout", "10000")
	setDefault(params, "_journal_mode", "WAL")
	setDefault(params, "_synchronous", "NORMAL")
	setDefault(params, "_foreign_keys", "on")
	setDefault(params, "_txlock", "immediate")
	dsn := "file:" + path + "?" + params.Encode()
	read := sql.OpenDB(connector{dsn: dsn, driver: &sqlite3.SQLiteDriver{}})
	if path == ":memory:" {
		// Every connection would get its own empty database.
		read.SetMaxOpenConns(1)
		return &DB{Read: read, Write: read, turn: newWriteTurn()}, nil
	}
	read.SetMaxOpenConns(8)
	read.SetMaxIdleConns(8)
	write := sql.OpenDB(connector{dsn: dsn, driver: &sqlite3.SQLiteDriver{
		ConnectHook: func(c *sqlite3.SQLiteConn) error {
			// The checkpointer does it (see checkpointer). When the log
			// starts over, SQLite cuts its file back to this size.
			// Statement journals stay in memory: a write transaction
			// journals the pages each of its statements changes, so that
			// the statement alone can be undone, and SQLite otherwise
			// spills them to a temporary file past 64 KiB, which a batch of
			// room messages reached at every commit (a third of the
			// daemon's file writes under a message load).
			_, err := c.Exec("PRAGMA wal_autocheckpoint = 0; PRAGMA journal_size_limit = "+strconv.Itoa(p.restartPages*4096)+"; PRAGMA temp_store = MEMORY", nil)
			return err
		},
	}})
	write.SetMaxOpenConns(1)
	write.SetMaxIdleConns(1)
	write.SetConnMaxIdleTime(0)
	ckptDB := sql.OpenDB(connector{dsn: dsn, driver: &sqlite3.SQLiteDriver{}})
	ckptDB.SetMaxOpenConns(1)
	d := &DB{Read: read, Write: write, ckptDB: ckptDB, turn: newWriteTurn()}
	d.turn.ckpt = startCheckpointer(ckptDB, d.turn, p)
	return d, nil
}

// ownerOnly makes the database file, and its log files if they exist,
// readable and writable by their owner only: they hold password hashes and
// access tokens. SQLite creates a missing database 0644 (less the umask),
// and gives its -wal and -shm files the database file's permissions, so the
// file is created here, empty and 0600, before SQLite opens it; an empty
// file is a new database to SQLite. Files that already exist with wider
// permissions (from an older version, or a copy) are narrowed to their
// owner's bits. A file we cannot narrow (owned by another user) is an
// error rather than a database left open to others.
func ownerOnly(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("sqlite: %w", err)
	}
	f.Close()
	for _, p := range []string{path, path + "-wal", path + "-shm", path + "-journal"} {
		fi, err := os.Stat(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("sqlite: %w", err)
		}
		if mode := fi.Mode().Perm(); mode&0o077 != 0 {
			if err := os.Chmod(p, mode&0o700); err != nil {
				return fmt.Errorf("sqlite: %s is open to other users (mode %#o) and cannot be restricted: %w", p, mode, err)
			}
		}
	}
	return nil
}

// LockWrites waits for this process's turn to write (see writeTurn).
// Every statement that writes goes between LockWrites and UnlockWrites.
func (d *DB) LockWrites() { d.turn.lock() }

// UnlockWrites ends the turn, and lets the checkpointer know of the write.
func (d *DB) UnlockWrites() {
	d.turn.unlock()
	if d.turn.ckpt != nil {
		d.turn.ckpt.wrote()
	}
}

// Close stops the checkpointer and closes the pools. SQLite checkpoints
// the whole log when the last connection closes.
func (d *DB) Close() error {
	if d.turn.ckpt != nil {
		d.turn.ckpt.stop()
	}
	var errs []error
	if d.ckptDB != nil {
		errs = append(errs, d.ckptDB.Close())
	}
	if d.Write != d.Read {
		errs = append(errs, d.Write.Close())
	}
	return errors.Join(append(errs, d.Read.Close())...)
}

// connector opens connections of one driver configuration, so that the
// write pool's connections can differ from the read pool's without
// registering a driver name for it.
type connector struct {
	dsn    string
	driver *sqlite3.SQLiteDriver
}

// Connect opens a connection. Switching a new database to WAL takes a
// lock the busy handler does not wait for: a connection opening the file
// at the same moment as another (several processes starting on one
// database) fails with SQLITE_BUSY. It is tried again for as long as the
// busy timeout would have waited.
func (c connector) Connect(ctx context.Context) (driver.Conn, error) {
	deadline := time.Now().Add(connectRetry)
	for {
		conn, err := c.driver.Open(c.dsn)
		var se sqlite3.Error
		if err == nil || !errors.As(err, &se) || (se.Code != sqlite3.ErrBusy && se.Code != sqlite3.ErrLocked) || time.Now().After(deadline) {
			return conn, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// connectRetry bounds the retries of a connection that finds the database
// busy (the busy timeout's 10 s).
const connectRetry = 10 * time.Second

func (c connector) Driver() driver.Driver { return c.driver }

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
