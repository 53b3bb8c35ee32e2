package sqlstore_test

import (
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

// A step released after a step with a greater number (steps made side by
// side) is applied to a database that has the greater one already: the
// relations' table (29) to a database at the search index (31).
func TestMigrationBelowTheNewestIsApplied(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		s := open(t, db)
		// The database as a version without step 29 left it.
		for _, stmt := range []string{`DROP TABLE event_relations`, `DELETE FROM schema_migrations WHERE version = 29`} {
			if _, err := s.DB().Exec(stmt); err != nil {
				t.Fatal(err)
			}
		}
		s.Close()
		s = open(t, db)
		var n int
		if err := s.DB().QueryRow(`SELECT COUNT(*) FROM event_relations`).Scan(&n); err != nil {
			t.Fatalf("step 29 was not applied: %v", err)
		}
		if err := s.DB().QueryRow(`SELECT COUNT(*) FROM schema_migrations WHERE version = 29`).Scan(&n); err != nil || n != 1 {
			t.Fatalf("step 29 recorded %d times: %v", n, err)
		}
	})
}
