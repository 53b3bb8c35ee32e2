// Package postgres holds what is particular to PostgreSQL: opening a
// connection pool and how its SQL differs from the shared dialect used by
// package sqlstore.
package postgres

import (
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/lib/pq"
)

// Schema fills the placeholders of the shared schema: types, and the
// statements only SQLite needs.
var Schema = map[string]string{
	"{{ID}}":     "BIGSERIAL PRIMARY KEY",
	"{{BLOB}}":   "BYTEA",
	"{{BIGINT}}": "BIGINT",
	// A claim's statement takes the key off its count itself (claimKey).
	"{{COUNT_CLAIMS}}": "",
	// Claims lock the oldest key through the index (see migration 5).
	"{{DROP_CLAIM_INDEX}}": "",
	"{{TEXT_AS_BYTES}}":    textAsBytes,
	// Text columns added after migration 6 compare as bytes too.
	"{{TEXT}}": `TEXT COLLATE "C"`,
	// The search index: each event's words (English stemming, as
	// Synapse's), found through a GIN index.
	"{{EVENT_SEARCH}}": `CREATE TABLE room_event_search (
	event_nid BIGINT PRIMARY KEY,
	room_id   TEXT COLLATE "C" NOT NULL,
	key       TEXT COLLATE "C" NOT NULL,
	vector    tsvector NOT NULL
);
CREATE INDEX room_event_search_vector ON room_event_search USING GIN (vector);`,
}

// textAsBytes gives every text column the "C" collation (migration 6).
const textAsBytes = `ALTER TABLE access_tokens
	ALTER COLUMN token_hash TYPE TEXT COLLATE "C",
	ALTER COLUMN user_id TYPE TEXT COLLATE "C",
	ALTER COLUMN device_id TYPE TEXT COLLATE "C";
ALTER TABLE accounts
	ALTER COLUMN user_id TYPE TEXT COLLATE "C",
	ALTER COLUMN password_hash TYPE TEXT COLLATE "C";
ALTER TABLE device_list_changes
	ALTER COLUMN user_id TYPE TEXT COLLATE "C",
	ALTER COLUMN device_id TYPE TEXT COLLATE "C";
ALTER TABLE devices
	ALTER COLUMN user_id TYPE TEXT COLLATE "C",
	ALTER COLUMN device_id TYPE TEXT COLLATE "C",
	ALTER COLUMN display_name TYPE TEXT COLLATE "C",
	ALTER COLUMN key_json TYPE TEXT COLLATE "C",
	ALTER COLUMN last_seen_ip TYPE TEXT COLLATE "C";
ALTER TABLE fallback_keys
	ALTER COLUMN user_id TYPE TEXT COLLATE "C",
	ALTER COLUMN device_id TYPE TEXT COLLATE "C",
	ALTER COLUMN algorithm TYPE TEXT COLLATE "C",
	ALTER COLUMN key_id TYPE TEXT COLLATE "C",
	ALTER COLUMN key_json TYPE TEXT COLLATE "C";
ALTER TABLE inbound_transactions
	ALTER COLUMN origin TYPE TEXT COLLATE "C",
	ALTER COLUMN txn_id TYPE TEXT COLLATE "C",
	ALTER COLUMN response TYPE TEXT COLLATE "C";
ALTER TABLE memberships
	ALTER COLUMN room_id TYPE TEXT COLLATE "C",
	ALTER COLUMN user_id TYPE TEXT COLLATE "C",
	ALTER COLUMN membership TYPE TEXT COLLATE "C";
ALTER TABLE one_time_key_counts
	ALTER COLUMN user_id TYPE TEXT COLLATE "C",
	ALTER COLUMN device_id TYPE TEXT COLLATE "C",
	ALTER COLUMN algorithm TYPE TEXT COLLATE "C";
ALTER TABLE one_time_keys
	ALTER COLUMN user_id TYPE TEXT COLLATE "C",
	ALTER COLUMN device_id TYPE TEXT COLLATE "C",
	ALTER COLUMN algorithm TYPE TEXT COLLATE "C",
	ALTER COLUMN key_id TYPE TEXT COLLATE "C",
	ALTER COLUMN key_json TYPE TEXT COLLATE "C";
ALTER TABLE outbound_device_updates
	ALTER COLUMN destination TYPE TEXT COLLATE "C",
	ALTER COLUMN user_id TYPE TEXT COLLATE "C",
	ALTER COLUMN device_id TYPE TEXT COLLATE "C";
ALTER TABLE outbound_last_sent
	ALTER COLUMN destination TYPE TEXT COLLATE "C",
	ALTER COLUMN user_id TYPE TEXT COLLATE "C";
ALTER TABLE outbound_leases
	ALTER COLUMN destination TYPE TEXT COLLATE "C",
	ALTER COLUMN owner TYPE TEXT COLLATE "C";
ALTER TABLE remote_device_lists
	ALTER COLUMN user_id TYPE TEXT COLLATE "C",
	ALTER COLUMN server_name TYPE TEXT COLLATE "C";
ALTER TABLE remote_devices
	ALTER COLUMN user_id TYPE TEXT COLLATE "C",
	ALTER COLUMN device_id TYPE TEXT COLLATE "C",
	ALTER COLUMN display_name TYPE TEXT COLLATE "C",
	ALTER COLUMN key_json TYPE TEXT COLLATE "C";
ALTER TABLE remote_stream_ids
	ALTER COLUMN user_id TYPE TEXT COLLATE "C";
ALTER TABLE server_keys
	ALTER COLUMN server_name TYPE TEXT COLLATE "C",
	ALTER COLUMN key_id TYPE TEXT COLLATE "C",
	ALTER COLUMN public_key TYPE TEXT COLLATE "C";
ALTER TABLE stale_device_lists
	ALTER COLUMN user_id TYPE TEXT COLLATE "C",
	ALTER COLUMN server_name TYPE TEXT COLLATE "C";`

// IsURI reports whether uri names a PostgreSQL database.
func IsURI(uri string) bool {
	return strings.HasPrefix(uri, "postgres://") || strings.HasPrefix(uri, "postgresql://")
}

// Open opens a connection pool to the database at uri.
func Open(uri string) (*sql.DB, error) {
	db, err := sql.Open("postgres", uri)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	return db, nil
}

// NewListener opens a connection that receives notifications, reconnecting
// by itself when it drops. connected is told when the connection is lost
// (false) and when it is back and listening again (true).
func NewListener(uri string, connected func(bool)) *pq.Listener {
	return pq.NewListener(uri, time.Second, time.Minute, func(ev pq.ListenerEventType, _ error) {
		switch ev {
		case pq.ListenerEventDisconnected:
			connected(false)
		case pq.ListenerEventReconnected:
			connected(true)
		}
	})
}

// IsUniqueViolation reports whether err is a unique constraint failure.
func IsUniqueViolation(err error) bool {
	var pe *pq.Error
	return errors.As(err, &pe) && pe.Code == "23505"
}

// MigrationLock is the advisory lock key that keeps several daemons sharing
// one database from migrating it at the same time.
const MigrationLock = 0x6b657973 // "keys"

// DeviceKeysLock is the first key of the advisory locks that serialize the
// changes of a device's keys (uploads, deletion); the second is a hash of
// the user and device IDs. Locks of two keys never meet MigrationLock.
const DeviceKeysLock = 0x6f746b73 // "otks"

// OutboundOwnerLock is the first key of the session advisory lock each
// daemon's outbound sender holds while it lives; the second is a hash of
// its name, the owner of its leases on destinations.
const OutboundOwnerLock = 0x6f757462 // "outb"
