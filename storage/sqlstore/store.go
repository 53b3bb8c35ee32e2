// Package sqlstore implements storage.Database once for both SQLite and
// PostgreSQL. The SQL is written in the subset both dialects share ($n
// placeholders numbered in order of first appearance, ON CONFLICT,
// RETURNING, IN lists expanded here); the few differences come from
// packages sqlite3 and postgres through the dialect struct.
package sqlstore

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/postgres"
	"github.com/keyserver/keyserver/storage/sqlite3"
)

// dialect is what differs between the databases.
type dialect struct {
	name string
	// schema fills the placeholders in the schema.
	schema map[string]string
	// forUpdate is appended to a SELECT that must lock the rows it reads
	// until the transaction ends; SQLite needs none (one writer at a time).
	forUpdate string
	// lockDeviceKeys takes the transaction-long lock of a device's keys
	// ($1 user, $2 device; see Store.lockDeviceKeys), "" where none is
	// needed (SQLite).
	lockDeviceKeys string
	// oldestKey selects the id of a device's oldest one-time key of an
	// algorithm ($1 user, $2 device, $3 algorithm), for a claim to delete.
	oldestKey string
	// writingCTEs: a WITH clause may hold INSERT, UPDATE and DELETE, so
	// that a key and its count change in one statement (PostgreSQL).
	// Without (SQLite), uploads count their keys in a second statement of
	// their transaction, and a trigger counts claims.
	writingCTEs       bool
	isUniqueViolation func(error) bool
}

// Store is the SQL implementation of storage.Database.
type Store struct {
	db *sql.DB
	// wdb runs the write transactions: db itself on PostgreSQL, a pool of
	// one connection on SQLite (see sqlite3.Open).
	wdb *sql.DB
	// lite is the SQLite database behind db and wdb (nil on PostgreSQL).
	lite *sqlite3.DB
	// batcher writes SQLite's writes, several to a commit (nil on
	// PostgreSQL, where each write is a transaction of its own).
	batcher *writeBatcher
	// messages writes PostgreSQL's room messages, several to a call
	// (nil on SQLite; see writeMessages).
	messages *writeBatcher
	// roomWrites orders PostgreSQL's room writes started one after the
	// other (StartRoomWrite): room ID -> closed when its last one ends.
	roomWrites sync.Map
	// q runs the store's statements on db, prepared once and reused;
	// wstmts are the write pool's prepared statements.
	q      pool
	stmts  *stmtCache
	wstmts *stmtCache
	// tokens caches access token owners by token hash, devices what key
	// queries show of local users: devices with keys, cross-signing keys
	// and signatures (see userCache).
	tokens  *userCache[tokenOwner]
	devices *userCache[*cachedKeys]
	// rev: revocations of cached tokens awaiting the other daemons'
	// confirmation (PostgreSQL; see revocation.go).
	rev *revocations
	// channels are the PostgreSQL notification channels of the schema.
	channels notifyChannels
	// roomMembers keeps rooms' members by state snapshot.
	roomMembers memberCache
	d           dialect
	// serverName tells local users (whose changes go out over federation)
	// from remote ones.
	serverName string
	uri        string
}

var _ storage.Database = (*Store)(nil)

// Open connects to the database named by uri (a PostgreSQL URL, or an SQLite
// "file:" URI or path) and brings its schema up to date. serverName is the
// name of the server whose users are local.
func Open(ctx context.Context, uri, serverName string) (*Store, error) {
	var (
		db, wdb *sql.DB
		lite    *sqlite3.DB
		d       dialect
		err     error
	)
	switch {
	case postgres.IsURI(uri):
		db, err = postgres.Open(uri)
		wdb = db
		d = dialect{
			name: "postgres", schema: postgres.Schema,
			forUpdate: " FOR UPDATE",
			// Devices whose IDs hash alike share a lock, which costs them
			// only some waiting.
			lockDeviceKeys: `SELECT pg_advisory_xact_lock(` + strconv.Itoa(postgres.DeviceKeysLock) + `, hashtext($1 || ' ' || $2))`,
			// SKIP LOCKED: concurrent claims take different keys instead
			// of waiting for and then missing the same one.
			oldestKey: `SELECT id FROM one_time_keys WHERE user_id = $1 AND device_id = $2 AND algorithm = $3
				ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED`,
			writingCTEs: true, isUniqueViolation: postgres.IsUniqueViolation,
		}
	case sqlite3.IsURI(uri):
		if lite, err = sqlite3.Open(uri); err == nil {
			db, wdb = lite.Read, lite.Write
		}
		d = dialect{
			name: "sqlite3", schema: sqlite3.Schema,
			// Claims are serial (one writer). MIN reads the ids from the
			// unique index, which holds them as its last column, without
			// sorting; an index ordered by id would cost every upload its
			// upkeep (see migration 5).
			oldestKey:         `SELECT MIN(id) FROM one_time_keys WHERE user_id = $1 AND device_id = $2 AND algorithm = $3`,
			isUniqueViolation: sqlite3.IsUniqueViolation,
		}
	default:
		return nil, fmt.Errorf("unsupported database %q", uri)
	}
	if err != nil {
		return nil, err
	}
	cache, wcache := &stmtCache{db: db, uncancelable: lite != nil}, &stmtCache{db: wdb, uncancelable: lite != nil}
	if wdb == db {
		wcache = cache
	}
	s := &Store{db: db, wdb: wdb, lite: lite, q: pool{db: db, cache: cache}, stmts: cache, wstmts: wcache, d: d, serverName: serverName, uri: uri,
		// An SQLite database belongs to one daemon, which sees every
		// change; on PostgreSQL the caches wait for WatchStream to listen
		// for the changes of the other daemons.
		tokens:  newUserCache[tokenOwner](d.name == "sqlite3", cacheTTL, 100_000),
		devices: newUserCache[*cachedKeys](d.name == "sqlite3", cacheTTL, 10_000),
		rev:     newRevocations(serverName)}
	if lite != nil {
		s.batcher = newWriteBatcher(s)
	} else {
		s.messages = &writeBatcher{s: s, run: s.writeMessages}
	}
	if err := db.PingContext(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("connect to %s database: %w", d.name, err)
	}
	if d.name == "postgres" {
		var schema string
		if err := db.QueryRowContext(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
			s.Close()
			return nil, fmt.Errorf("read the database's schema: %w", err)
		}
		s.channels = channelsOf(schema)
		s.rev.server = revocationServer(serverName, schema)
	}
	if err := s.migrate(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// opError is an error of a method of the store, named after it, so that a
// log line says which operation met it ("storage: UploadKeys: database is
// locked"). errors.Is and errors.As see through it: to the storage
// sentinels (storage.ErrNotFound...), to context cancellation and to the
// driver's errors.
type opError struct {
	op  string
	err error
}

func (e *opError) Error() string {
	return "storage: " + e.op + ": " + strings.TrimPrefix(e.err.Error(), "storage: ")
}

func (e *opError) Unwrap() error { return e.err }

// named gives the error a method returns, if any, the method's name; each
// method of storage.Database defers it first thing. An error already named
// (by a method called from another) keeps the inner name.
func named(op string, err *error) {
	var named *opError
	if *err != nil && !errors.As(*err, &named) {
		*err = &opError{op: op, err: *err}
	}
}

// Dialect names the database in use ("sqlite3" or "postgres").
func (s *Store) Dialect() string { return s.d.name }

// DB exposes the pool, for health checks and tests.
func (s *Store) DB() *sql.DB { return s.db }

// WriteDB exposes the pool of the write transactions (DB itself on
// PostgreSQL), for its metrics.
func (s *Store) WriteDB() *sql.DB { return s.wdb }

// StatementsSent counts the statements this store has sent to the
// database since it was opened, transaction begins and ends included.
func (s *Store) StatementsSent() int64 {
	n := s.stmts.sent.Load()
	if s.wstmts != s.stmts {
		n += s.wstmts.sent.Load()
	}
	return n
}

// Ping checks that the database answers.
func (s *Store) Ping(ctx context.Context) (err error) {
	defer named("Ping", &err)
	return s.db.PingContext(ctx)
}

// Close closes the pool.
func (s *Store) Close() error {
	if s.messages != nil {
		s.messages.close()
	}
	if s.batcher != nil {
		s.batcher.close()
	}
	s.stmts.close()
	if s.wstmts != s.stmts {
		s.wstmts.close()
	}
	if s.lite != nil {
		return s.lite.Close()
	}
	return s.db.Close()
}

// writeTurn waits for this process's turn to write on SQLite, which has
// one writer at a time (see sqlite3.DB.LockWrites); it returns the end of
// the turn.
func (s *Store) writeTurn() (end func()) {
	if s.lite == nil {
		return func() {}
	}
	s.lite.LockWrites()
	return s.lite.UnlockWrites
}

// writeStatements runs fn's statements on the write pool without a
// transaction around them, each one a transaction by itself; on SQLite
// they go with the other writes waiting (see writeBatcher), in a savepoint
// of their transaction.
func (s *Store) writeStatements(ctx context.Context, fn func(q querier) error) error {
	if s.batcher != nil {
		_, err := s.batcher.write(&pendingWrite{ctx: ctx, stmts: fn})
		return err
	}
	return fn(pool{db: s.wdb, cache: s.wstmts})
}

// write runs fn in one transaction, committing when it returns nil.
func (s *Store) write(ctx context.Context, fn func(tx *txn) error) error {
	_, err := s.writeChange(ctx, fn)
	return err
}

// writeChange is write, returning what the transaction did to the stream.
// On SQLite the transaction is a savepoint of one that holds the other
// writes waiting too (see writeBatcher).
func (s *Store) writeChange(ctx context.Context, fn func(tx *txn) error) (storage.Change, error) {
	if s.batcher != nil {
		return s.batcher.write(&pendingWrite{ctx: ctx, fn: fn})
	}
	s.wstmts.sent.Add(2) // BEGIN and COMMIT (or ROLLBACK)
	tx, err := s.wdb.BeginTx(s.wstmts.statementContext(ctx), nil)
	if err != nil {
		return storage.Change{}, err
	}
	t := &txn{tx: tx, cache: s.wstmts}
	defer func() {
		// The connection goes back to the pool first, even if fn panicked:
		// preparing may need it (SQLite's write pool has only this one).
		// After a commit the rollback does nothing.
		_ = tx.Rollback()
		t.prepareMissed(context.WithoutCancel(ctx))
	}()
	if err := fn(t); err != nil {
		return storage.Change{}, err
	}
	if !t.notified {
		if err := s.notifyStream(ctx, t); err != nil {
			return storage.Change{}, err
		}
	}
	if err := tx.Commit(); err != nil {
		return storage.Change{}, err
	}
	for _, f := range t.afterCommit {
		f()
	}
	return t.change(), nil
}

// nextPos allocates the next stream position. The counter row stays locked
// until the transaction ends, so positions become visible in the order they
// were handed out and a reader that sees position P has seen all below it.
func (s *Store) nextPos(ctx context.Context, tx *txn) (storage.StreamPos, error) {
	var pos storage.StreamPos
	if err := tx.QueryRowContext(ctx, `UPDATE stream_position SET pos = pos + 1 WHERE id = 1 RETURNING pos`).Scan(&pos); err != nil {
		return 0, err
	}
	tx.pos = pos
	return pos, nil
}

// maxNotifyPayload keeps stream notifications under PostgreSQL's limit
// (8000 bytes); a change concerning more users is announced to everyone.
const maxNotifyPayload = 7900

// usersPrefix starts the payload of a stream notification that names the
// users it concerns; any other payload concerns everyone.
const usersPrefix = "u:"

// notifyStream tells the other daemons sharing a PostgreSQL database that
// tx advanced the stream, with the local users it concerns, so that they
// wake only those users' waiting /sync requests. Sent last, it is
// delivered at commit after the transaction's other notifications.
func (s *Store) notifyStream(ctx context.Context, tx *txn) error {
	if s.d.name != "postgres" || tx.pos == 0 {
		return nil
	}
	payload := notifyPayload(tx.change().Users)
	_, err := tx.ExecContext(ctx, `SELECT pg_notify($1, $2)`, s.channels.stream, payload)
	return err
}

// notifyPayload is the payload of a stream notification that concerns
// the users of lists: each user once, if they fit, else everyone. One
// list is taken as it is; several must be sorted and each without
// repeats (as memberList.local is), and are merged.
func notifyPayload(lists ...[]string) string {
	if len(lists) == 1 {
		if len(usersPrefix)+joinedLen(lists[0]) > maxNotifyPayload {
			return ""
		}
		return usersPrefix + strings.Join(lists[0], "\n")
	}
	// Merged, the lists are no shorter than the longest of them and no
	// longer than all of them together.
	longest, total := 0, 0
	for _, l := range lists {
		n := joinedLen(l)
		longest, total = max(longest, n), total+n+1
	}
	if len(usersPrefix)+longest > maxNotifyPayload {
		return ""
	}
	var b strings.Builder
	b.Grow(min(len(usersPrefix)+total, maxNotifyPayload+1))
	b.WriteString(usersPrefix)
	// A merge of all the lists at once, into the payload: the smallest
	// head is written, and every list it heads moves past it (a user in
	// several lists heads each of them at the same time).
	heads := slices.Clone(lists)
	for first := true; ; first = false {
		var user string
		found := false
		for _, l := range heads {
			if len(l) > 0 && (!found || l[0] < user) {
				user, found = l[0], true
			}
		}
		if !found {
			return b.String()
		}
		for i, l := range heads {
			if len(l) > 0 && l[0] == user {
				heads[i] = l[1:]
			}
		}
		if !first {
			b.WriteByte('\n')
		}
		b.WriteString(user)
		if b.Len() > maxNotifyPayload {
			return ""
		}
	}
}

// joinedLen is the length of l's strings joined by one byte.
func joinedLen(l []string) int {
	n := max(len(l)-1, 0)
	for _, s := range l {
		n += len(s)
	}
	return n
}

// notifyEarly sends tx's stream notification before it takes its stream
// position, for a write that knows every user it concerns by then and
// sends no other notification: from the position to the commit every
// other write of the server waits, and the notification is delivered at
// the commit wherever it was sent.
func (s *Store) notifyEarly(ctx context.Context, tx *txn) error {
	if s.d.name != "postgres" {
		return nil
	}
	tx.pos = -1 // a position is coming: notifyStream sends
	err := s.notifyStream(ctx, tx)
	tx.pos = 0
	tx.notified = err == nil
	return err
}

// notifiedUsers reads the users of a stream notification's payload: nil
// (everyone) unless it names them.
func notifiedUsers(payload string) []string {
	rest, ok := strings.CutPrefix(payload, usersPrefix)
	if !ok {
		return nil
	}
	if rest == "" {
		return []string{}
	}
	return strings.Split(rest, "\n")
}

// notifyChannels are the PostgreSQL notification channels: stream
// advances, users whose access tokens were revoked (the user ID and a
// revocation ID, see revocation.go), the other daemons' confirmations of
// those, and local users whose devices changed (the user ID).
//
// Channels are of the whole database, tables of a schema: the daemons of
// one schema share the channels, those of another schema of the same
// database (another deployment, or another test) have their own, so that
// they wake nobody here. The default schema keeps the plain names, which
// daemons of earlier releases sharing a database listen on.
type notifyChannels struct {
	stream, tokens, acks, devices string
}

func channelsOf(schema string) notifyChannels {
	suffix := ""
	if schema != "" && schema != "public" {
		sum := sha256.Sum256([]byte(schema))
		suffix = "_" + hex.EncodeToString(sum[:6])
	}
	return notifyChannels{stream: "keyserver_stream" + suffix, tokens: "keyserver_tokens" + suffix,
		acks: "keyserver_token_acks" + suffix, devices: "keyserver_devices" + suffix}
}

// cacheTTL bounds how long a cached token or device list is trusted
// without a notification (see userCache).
const cacheTTL = 30 * time.Second

type tokenOwner struct{ userID, deviceID string }

// setCachesEnabled turns the caches that need every change heard on or off.
func (s *Store) setCachesEnabled(on bool) {
	s.tokens.setEnabled(on)
	s.devices.setEnabled(on)
}

// WatchStream calls advanced whenever another daemon sharing the database
// (or this one) advances the stream, until ctx ends. It also hears the
// other daemons' token revocations and device changes, and the caches of
// tokens and devices are on only while it does. Only PostgreSQL can be
// shared; on SQLite it just waits for ctx.
func (s *Store) WatchStream(ctx context.Context, advanced func(users []string)) (err error) {
	defer named("WatchStream", &err)
	if s.d.name != "postgres" {
		<-ctx.Done()
		return nil
	}
	// The caches are on while the listener is both listening and
	// connected. While the connection is down changes go unheard; once it
	// is back (and listening again) the caches restart empty. The listener
	// reports a drop even before the first Listen returns, so both facts
	// are kept rather than the last event.
	var mu sync.Mutex
	connected, listening := true, false
	set := func(f func()) {
		mu.Lock()
		defer mu.Unlock()
		f()
		s.setCachesEnabled(connected && listening)
	}
	l := postgres.NewListener(s.listenerURI(), func(up bool) { set(func() { connected = up }) })
	defer set(func() { listening = false })
	defer l.Close()
	ch := s.channels
	for _, ch := range []string{ch.stream, ch.tokens, ch.devices, ch.acks} {
		if err := l.Listen(ch); err != nil {
			return err
		}
	}
	set(func() { listening = true })
	// Changes made before the listening began (the daemon starting, or
	// this watch following one that failed) went unheard: whoever waits
	// looks again.
	advanced(nil)
	for {
		select {
		case <-ctx.Done():
			return nil
		case n := <-l.Notify:
			switch {
			case n == nil:
				// The connection was re-established: something may have
				// been missed, so wake the waiters anyway.
				advanced(nil)
			case n.Channel == ch.tokens:
				s.heardRevocation(n.Extra)
			case n.Channel == ch.acks:
				s.rev.acked(n.Extra)
			case n.Channel == ch.devices:
				// Sent before the stream advance of the same change, so
				// the cache is dropped before any /sync wakes to read it.
				s.devices.revoke(n.Extra)
			default:
				advanced(notifiedUsers(n.Extra))
			}
		}
	}
}

// revokeTokens drops the cached tokens of userID once tx commits, here and,
// on PostgreSQL, in the other daemons sharing the database, which confirm
// it before the commit returns to the caller (see revocation.go).
func (s *Store) revokeTokens(ctx context.Context, tx *txn, userID string) error {
	tx.onCommit(func() { s.tokens.revoke(userID) })
	if s.d.name != "postgres" {
		return nil
	}
	revID, w := s.rev.start()
	tx.onCommit(func() { s.confirmRevocation(revID, w) })
	_, err := tx.ExecContext(ctx, `SELECT pg_notify($1, $2)`, s.channels.tokens, tokensPayload(userID, revID))
	return err
}

// revokeUserKeys drops the cached keys of a local user (devices,
// cross-signing keys, signatures on them) once tx commits, here and, on
// PostgreSQL, in the other daemons sharing the database. It must come
// before the stream advance (nextPos) of the change, so that other daemons
// drop their copy before they wake anyone for it.
func (s *Store) revokeUserKeys(ctx context.Context, tx *txn, userID string) error {
	tx.onCommit(func() { s.devices.revoke(userID) })
	if s.d.name != "postgres" {
		return nil
	}
	_, err := tx.ExecContext(ctx, `SELECT pg_notify($1, $2)`, s.channels.devices, userID)
	return err
}

// recordDeviceChange adds a device-list change of userID at a new position.
func (s *Store) recordDeviceChange(ctx context.Context, tx *txn, userID, deviceID string, deleted bool) (storage.StreamPos, error) {
	pos, err := s.nextPos(ctx, tx)
	if err != nil {
		return 0, err
	}
	_, err = tx.ExecContext(ctx,
		`INSERT INTO device_list_changes (pos, user_id, device_id, deleted) VALUES ($1, $2, $3, $4)`,
		pos, userID, deviceID, deleted)
	return pos, err
}

// recordRemoteChange records a change of a remote user's device list,
// which concerns the local users sharing a room with them.
func (s *Store) recordRemoteChange(ctx context.Context, tx *txn, userID, deviceID string, deleted bool) (storage.StreamPos, error) {
	pos, err := s.recordDeviceChange(ctx, tx, userID, deviceID, deleted)
	if err != nil {
		return 0, err
	}
	return pos, s.concernRoomMates(ctx, tx, userID)
}

// concernRoomMates adds to tx's concerned users userID, when local, and
// the local users sharing a room with them (once per user and
// transaction).
func (s *Store) concernRoomMates(ctx context.Context, tx *txn, userID string) error {
	if tx.lookedUp[userID] {
		return nil
	}
	mates, err := s.txUserList(ctx, tx, `
		SELECT DISTINCT ours.user_id FROM memberships theirs JOIN memberships ours ON ours.room_id = theirs.room_id
		WHERE theirs.user_id = $1 AND theirs.membership IN ('join', 'invite') AND ours.membership IN ('join', 'invite') AND ours.user_id LIKE $2`,
		userID, s.localPattern())
	if err != nil {
		return err
	}
	tx.concern(mates...)
	if s.isLocal(userID) {
		tx.concern(userID)
	}
	if tx.lookedUp == nil {
		tx.lookedUp = map[string]bool{}
	}
	tx.lookedUp[userID] = true
	return nil
}

// isLocal reports whether userID is one of this server's users.
func (s *Store) isLocal(userID string) bool { return strings.HasSuffix(userID, ":"+s.serverName) }

// recordLocalChange records a change of a local user's device list and
// queues it for every remote server sharing a room with the user now, in
// the caller's transaction: a change is never committed without its
// delivery being due. The user's cached devices are dropped at commit.
func (s *Store) recordLocalChange(ctx context.Context, tx *txn, userID, deviceID string, deleted bool) (storage.StreamPos, error) {
	if err := s.revokeUserKeys(ctx, tx, userID); err != nil {
		return 0, err
	}
	pos, err := s.recordDeviceChange(ctx, tx, userID, deviceID, deleted)
	if err != nil {
		return 0, err
	}
	// The user's room-mates: the local ones (and the user) are concerned,
	// the servers of the others are sent the change.
	rows, err := tx.QueryContext(ctx, `
		SELECT DISTINCT theirs.user_id FROM memberships mine JOIN memberships theirs ON theirs.room_id = mine.room_id
		WHERE mine.user_id = $1 AND mine.membership IN ('join', 'invite') AND theirs.membership IN ('join', 'invite')`,
		userID)
	if err != nil {
		return 0, err
	}
	tx.concern(userID)
	if tx.lookedUp == nil {
		tx.lookedUp = map[string]bool{}
	}
	tx.lookedUp[userID] = true // its local room-mates are concerned below
	dests := map[string]bool{}
	for rows.Next() {
		var other string
		if err := rows.Scan(&other); err != nil {
			rows.Close()
			return 0, err
		}
		if _, server, ok := strings.Cut(other, ":"); ok {
			if server == s.serverName {
				tx.concern(other)
			} else {
				dests[server] = true
			}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	for dest := range dests {
		if _, err := tx.ExecContext(ctx, `
			INSERT INTO outbound_device_updates (destination, user_id, device_id, stream_id) VALUES ($1, $2, $3, $4)
			ON CONFLICT (destination, user_id, device_id) DO UPDATE SET stream_id = excluded.stream_id`,
			dest, userID, deviceID, pos); err != nil {
			return 0, err
		}
	}
	return pos, nil
}

// localPattern matches the user IDs of local users with LIKE. Server names
// hold no LIKE wildcards; any that slipped in are removed rather than
// allowed to widen the match.
func (s *Store) localPattern() string {
	return "%:" + strings.NewReplacer("%", "", "_", "").Replace(s.serverName)
}

// placeholders returns "$from, $from+1, ..." for n values.
func placeholders(from, n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('$')
		b.WriteString(strconv.Itoa(from + i))
	}
	return b.String()
}

// valueRows returns the VALUES rows of a multi-row insert of rows rows
// of width values each: "($1, $2), ($3, $4)" for 2 and 2.
func valueRows(rows, width int) string {
	out := make([]string, rows)
	for i := range out {
		out[i] = "(" + placeholders(i*width+1, width) + ")"
	}
	return strings.Join(out, ", ")
}

// args appends strings to a parameter list.
func args(head []any, values []string) []any {
	out := make([]any, 0, len(head)+len(values))
	out = append(out, head...)
	for _, v := range values {
		out = append(out, v)
	}
	return out
}

func notFound(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return storage.ErrNotFound
	}
	return err
}
