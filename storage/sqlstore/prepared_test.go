package sqlstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/testdb"
)

// A write that panics gives its connection back before anything else uses
// it: on SQLite the writer has a single connection, and the statements the
// transaction ran unprepared are prepared on it afterwards.
func TestWriteThatPanicsReleasesTheWriter(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		s, err := Open(context.Background(), db.URI, "x")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		query := fmt.Sprintf(`SELECT %d`, time.Now().UnixNano()) // never prepared before
		func() {
			defer func() { _ = recover() }()
			_ = s.write(ctx, func(tx *txn) error {
				var n int64
				if err := tx.QueryRowContext(ctx, query).Scan(&n); err != nil {
					t.Error(err)
				}
				panic("boom")
			})
		}()
		if _, ok := s.wstmts.lookup(query); !ok {
			t.Error("the statement run unprepared was not prepared after the transaction")
		}
		if err := s.write(ctx, func(tx *txn) error {
			_, err := tx.ExecContext(ctx, `UPDATE stream_position SET pos = pos WHERE id = 1`)
			return err
		}); err != nil {
			t.Fatalf("write after a panicking write: %v", err)
		}
	})
}

// Long statements are never prepared, nor any once the cache is full.
func TestStatementCacheBounds(t *testing.T) {
	s, err := Open(context.Background(), testdb.SQLite(t).URI, "x")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	long := `SELECT 1 WHERE 1 IN (` + placeholders(1, maxPreparedArgs+1) + `)`
	if st, err := s.stmts.get(ctx, long, maxPreparedArgs+1); err != nil || st != nil {
		t.Fatalf("a statement with %d arguments: %v, %v; want it unprepared", maxPreparedArgs+1, st, err)
	}
	for i := s.stmts.n; i < maxPrepared; i++ {
		if st, err := s.stmts.get(ctx, fmt.Sprintf(`SELECT %d`, i), 0); err != nil || st == nil {
			t.Fatalf("statement %d: %v, %v", i, st, err)
		}
	}
	if st, err := s.stmts.get(ctx, `SELECT 'one more'`, 0); err != nil || st != nil {
		t.Fatalf("past the bound: %v, %v; want it unprepared", st, err)
	}
	var got string
	if err := s.q.QueryRowContext(ctx, `SELECT 'still runs'`).Scan(&got); err != nil || !strings.HasPrefix(got, "still") {
		t.Fatalf("unprepared statement: %q, %v", got, err)
	}
}
