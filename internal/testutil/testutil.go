// Package testutil is what the tests of several packages share: a database
// of each kind per test (from testdb), a running client API, and a client
// that signs its keys as real clients do.
package testutil

import "github.com/keyserver/keyserver/internal/testdb"

// PostgresEnv names the environment variable holding the URL of a
// PostgreSQL database the tests may create schemas in.
const PostgresEnv = testdb.PostgresEnv

// Database is one backend to run a test against.
type Database = testdb.Database

// The database helpers, under the names the tests use.
var (
	SQLite          = testdb.SQLite
	Postgres        = testdb.Postgres
	ForEachDatabase = testdb.ForEachDatabase
)
