// Package sqlite3 holds what is particular to SQLite: how to open the
// embedded database file and tune it, and how its SQL differs from the
// shared dialect used by package sqlstore.
package sqlite3

import (
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

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
}

// IsURI reports whether uri names an SQLite database: "file:..." or a plain
// path.
func IsURI(uri string) bool {
	return !strings.Contains(uri, "://")
}

// Open opens the SQLite database at uri ("file:path" or a path), creating
// its directory if needed, with the settings the store relies on: WAL so
// readers never wait for the writer, a busy timeout for other processes,
// foreign keys, and immediate write transactions.
//
// It returns two pools on the one database: read for statements outside
// transactions, and write, a single connection for the write transactions.
// SQLite has one writer at a time anyway, and keeping every write on one
// connection keeps that connection's page cache warm with what writes
// read (key counts, the keys already stored).
func Open(uri string) (read, write *sql.DB, err error) {
	path := strings.TrimPrefix(uri, "file:")
	query := ""
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path, query = path[:i], path[i+1:]
	}
	if path == "" {
		return nil, nil, errors.New("sqlite: empty database path")
	}
	if path != ":memory:" {
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, nil, fmt.Errorf("sqlite: create directory for %s: %w", path, err)
		}
	}
	params, err := url.ParseQuery(query)
	if err != nil {
		return nil, nil, fmt.Errorf("sqlite: bad parameters in %q: %w", uri, err)
	}
	// busy_timeout must be in force before the journal mode is switched.
	setDefault(params, "_busy_timeout", "10000")
	setDefault(params, "_journal_mode", "WAL")
	setDefault(params, "_synchronous", "NORMAL")
	setDefault(params, "_foreign_keys", "on")
	setDefault(params, "_txlock", "immediate")
	dsn := "file:" + path + "?" + params.Encode()
	if read, err = sql.Open("sqlite3", dsn); err != nil {
		return nil, nil, err
	}
	if path == ":memory:" {
		// Every connection would get its own empty database.
		read.SetMaxOpenConns(1)
		return read, read, nil
	}
	read.SetMaxOpenConns(8)
	read.SetMaxIdleConns(8)
	if write, err = sql.Open("sqlite3", dsn); err != nil {
		read.Close()
		return nil, nil, err
	}
	write.SetMaxOpenConns(1)
	write.SetMaxIdleConns(1)
	write.SetConnMaxIdleTime(0)
	return read, write, nil
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
