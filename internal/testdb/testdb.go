// Package testdb gives tests a fresh database of each kind. It imports
// nothing of the project, so the store's own tests can use it too.
package testdb

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	_ "github.com/lib/pq" // the driver the schema helper connects with
)

// PostgresEnv names the environment variable holding the URL of a
// PostgreSQL database the tests may create schemas in.
const PostgresEnv = "KEYSERVER_TEST_POSTGRES"

// Database is one backend to run a test against.
type Database struct {
	Name string // "sqlite3" or "postgres"
	URI  string
}

// SQLite returns a fresh SQLite database.
func SQLite(t testing.TB) Database {
	return Database{Name: "sqlite3", URI: "file:" + filepath.Join(t.TempDir(), "keyserver.db")}
}

// Postgres returns a fresh PostgreSQL schema, or skips (fails under CI)
// when none is configured.
func Postgres(t testing.TB) Database {
	t.Helper()
	base := os.Getenv(PostgresEnv)
	if base == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set: CI must run the PostgreSQL tests", PostgresEnv)
		}
		t.Skipf("PostgreSQL tests skipped: set %s to a postgres:// URL (make test does when PostgreSQL runs locally)", PostgresEnv)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	schema := "kstest_" + hex.EncodeToString(b)
	admin, err := sql.Open("postgres", base)
	if err != nil {
		t.Fatalf("postgres: %v", err)
	}
	if _, err := admin.Exec(`CREATE SCHEMA ` + schema); err != nil {
		admin.Close()
		t.Fatalf("postgres: create schema: %v", err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(`DROP SCHEMA ` + schema + ` CASCADE`)
		admin.Close()
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("postgres: bad %s: %v", PostgresEnv, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return Database{Name: "postgres", URI: u.String()}
}

// ForEachDatabase runs f as a subtest against each kind of database.
func ForEachDatabase(t *testing.T, f func(t *testing.T, db Database)) {
	t.Helper()
	t.Run("sqlite3", func(t *testing.T) { f(t, SQLite(t)) })
	t.Run("postgres", func(t *testing.T) { f(t, Postgres(t)) })
}
