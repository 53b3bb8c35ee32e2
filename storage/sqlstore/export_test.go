package sqlstore

import (
	"context"
	"sort"
	"strings"

	"github.com/keyserver/keyserver/storage"
)

// CachesOn reports whether the token and device caches are on, so that
// tests can wait for a store's listener before relying on them.
func (s *Store) CachesOn() bool {
	_, tokens := s.tokens.generation()
	_, devices := s.devices.generation()
	return tokens && devices
}

// OpenAtSchema opens a store migrated only up to version v, as an older
// release left it.
func OpenAtSchema(ctx context.Context, uri string, v int) (*Store, error) {
	saved := migrations
	defer func() { migrations = saved }()
	migrations = migrations[:v]
	return Open(ctx, uri, "x")
}

// MigrationCount is the number of migrations, which differs from
// SchemaVersion when version numbers skip some.
func MigrationCount() int { return len(migrations) }

// QueueRoomPDUs runs txQueueRoomPDUs in a transaction of its own, as a
// write of events received from another server will.
func (s *Store) QueueRoomPDUs(ctx context.Context, roomID string, events []storage.RoomEvent, skip []string) (queued bool, err error) {
	defer named("QueueRoomPDUs", &err)
	err = s.write(ctx, func(tx *txn) error {
		members, err := s.txRoomMembers(ctx, tx, roomID, 0)
		if err != nil {
			return err
		}
		queued, err = s.txQueueRoomPDUs(ctx, tx, members, events, skip)
		return err
	})
	return queued, err
}

// MigrationStatements returns the statements of migration v, for the
// store's dialect.
func (s *Store) MigrationStatements(v int) []string {
	for _, m := range migrations {
		if m.version == v {
			ddl := m.sql
			for k, r := range s.d.schema {
				ddl = strings.ReplaceAll(ddl, k, r)
			}
			return splitStatements(ddl)
		}
	}
	return nil
}

// TestWrite runs fn as a write transaction of the store (exec runs a
// statement in it, pos takes the next stream position).
func (s *Store) TestWrite(ctx context.Context, fn func(exec func(query string, args ...any) error, pos func() error) error) (_ storage.Change, err error) {
	defer named("TestWrite", &err)
	return s.writeChange(ctx, func(tx *txn) error {
		exec := func(query string, args ...any) error {
			_, err := tx.ExecContext(ctx, query, args...)
			return err
		}
		pos := func() error {
			_, err := s.nextPos(ctx, tx)
			return err
		}
		return fn(exec, pos)
	})
}

// QueuedWrites is how many writes wait for SQLite's writer (0 on
// PostgreSQL), and Batches how many transactions it has committed or
// rolled back.
func (s *Store) QueuedWrites() int {
	if s.batcher == nil {
		return 0
	}
	s.batcher.mu.Lock()
	defer s.batcher.mu.Unlock()
	return len(s.batcher.queue)
}

// MessageBatches counts the statements of PostgreSQL's message batches.
func (s *Store) MessageBatches() int64 {
	if s.messages == nil {
		return 0
	}
	return s.messages.batches.Load()
}

func (s *Store) Batches() int64 {
	if s.batcher == nil {
		return 0
	}
	return s.batcher.batches.Load()
}

// TestStatements runs statements as writes outside a transaction do.
func (s *Store) TestStatements(ctx context.Context, queries ...string) (err error) {
	defer named("TestStatements", &err)
	return s.writeStatements(ctx, func(q querier) error {
		for _, query := range queries {
			if _, err := q.ExecContext(ctx, query); err != nil {
				return err
			}
		}
		return nil
	})
}

// KeyCounts returns a device's unclaimed one-time keys per algorithm and
// the algorithms whose fallback key has not been handed out, in one query:
// what tests compare with the stored keys.
func (s *Store) KeyCounts(ctx context.Context, userID, deviceID string) (_ map[string]int, _ []string, err error) {
	defer named("KeyCounts", &err)
	rows, err := s.q.QueryContext(ctx, `
		SELECT 'otk', algorithm, unclaimed FROM one_time_key_counts WHERE user_id = $1 AND device_id = $2 AND unclaimed > 0
		UNION ALL
		SELECT 'fallback', algorithm, 0 FROM fallback_keys WHERE user_id = $1 AND device_id = $2 AND NOT used`,
		userID, deviceID)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	counts := map[string]int{}
	unused := []string{}
	for rows.Next() {
		var kind, alg string
		var n int
		if err := rows.Scan(&kind, &alg, &n); err != nil {
			return nil, nil, err
		}
		if kind == "otk" {
			counts[alg] = n
		} else {
			unused = append(unused, alg)
		}
	}
	sort.Strings(unused)
	return counts, unused, rows.Err()
}
