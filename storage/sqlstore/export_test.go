package sqlstore

import (
	"context"
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
