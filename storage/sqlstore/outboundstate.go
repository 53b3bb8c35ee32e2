package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/postgres"
)

// Who may send to a destination.
//
// One daemon at a time sends to a destination: the one holding its lease
// (outbound_leases). A lease must not outlive the daemon holding it, or a
// daemon killed without giving its leases back would keep its successor,
// and the other daemons sharing the database, from its destinations.
//
// On SQLite only one daemon uses the database, so a lease found when a
// daemon starts belongs to one that is gone: HoldOutboundOwner drops them
// all.
//
// On PostgreSQL each daemon's sender holds, for as long as it lives, a
// session-level advisory lock named after its owner name, on a connection
// of its own that does nothing else. A lease whose owner does not hold
// that lock is void: PostgreSQL releases the lock when the owner's
// connection ends, which happens when its process does (kill -9 included:
// the kernel closes the socket; a host that vanishes is noticed by TCP
// keepalives set short on that connection, in about ten seconds). This was
// chosen over a lease of a few seconds renewed while sending: a short
// lease would have to be renewed for every destination being sent to,
// several times a second, by every daemon, and would lapse under a live
// daemon that is merely slow (a long garbage collection, a busy database),
// letting a second daemon send at the same time; the session lock costs
// one idle connection and lapses only when the owner is really gone or
// cut off from the database, and then the owner, which checks its
// connection every second, stops its sends too. The leases keep their
// expiry as a backstop against an owner that lives but no longer sends.
// The other daemons learn that a lease is free from a notification when it
// is released, and from ReclaimDeadLeases, which they run every second,
// when its owner is gone.

// leaseOwnerGone is the condition (starting with OR, on a row of
// outbound_leases) under which a lease's owner is gone: on PostgreSQL, its
// session lock is not held; SQLite drops such leases at start instead.
func (s *Store) leaseOwnerGone() string {
	if s.d.name != "postgres" {
		return ""
	}
	return ` OR NOT EXISTS (` + liveOwnerLocks + ` AND l.objid = hashtext(outbound_leases.owner)::oid)`
}

// liveOwnerLocks selects the outbound owners' session locks held in this
// database (the second key of a two-key advisory lock is objid).
var liveOwnerLocks = `SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted
	AND l.classid = ` + strconv.Itoa(postgres.OutboundOwnerLock) + ` AND l.objsubid = 2
	AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`

// ownerCheckInterval is how often the owner's connection is checked.
const ownerCheckInterval = time.Second

// HoldOutboundOwner makes owner the name of a live holder of leases until
// ctx ends (lost is closed then) or lost is closed before (the hold broke:
// the owner must stop sending and hold again under a new name). See the
// comment above.
func (s *Store) HoldOutboundOwner(ctx context.Context, owner string) (_ <-chan struct{}, err error) {
	defer named("HoldOutboundOwner", &err)
	lost := make(chan struct{})
	if s.d.name != "postgres" {
		err := s.write(ctx, func(tx *txn) error {
			_, err := tx.ExecContext(ctx, `DELETE FROM outbound_leases`)
			return err
		})
		if err != nil {
			return nil, err
		}
		go func() { <-ctx.Done(); close(lost) }()
		return lost, nil
	}
	if err := s.db.PingContext(ctx); err != nil {
		return nil, err
	}
	// A pool of its own: the lock lives as long as this one connection.
	db, err := sql.Open("postgres", s.uri)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	conn, err := db.Conn(ctx)
	if err != nil {
		db.Close()
		return nil, err
	}
	fail := func(err error) (<-chan struct{}, error) {
		conn.Close()
		db.Close()
		return nil, err
	}
	// The server notices a vanished client after about 5 + 3·2 s instead
	// of the system's default of hours.
	if _, err := conn.ExecContext(ctx, `SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 2; SET tcp_keepalives_count = 3`); err != nil {
		return fail(err)
	}
	var ok bool
	if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1, hashtext($2))`, postgres.OutboundOwnerLock, owner).Scan(&ok); err != nil {
		return fail(err)
	}
	if !ok {
		return fail(fmt.Errorf("outbound owner name %q is in use", owner))
	}
	go func() {
		defer close(lost)
		defer db.Close()
		defer conn.Close() // the lock goes with the connection
		t := time.NewTicker(ownerCheckInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			pctx, cancel := context.WithTimeout(ctx, 2*ownerCheckInterval)
			var one int
			err := conn.QueryRowContext(pctx, `SELECT 1`).Scan(&one)
			cancel()
			if err != nil {
				return
			}
		}
	}()
	return lost, nil
}

// ReclaimDeadLeases drops the leases whose owners are gone and returns
// their destinations; on SQLite there are none once HoldOutboundOwner ran.
func (s *Store) ReclaimDeadLeases(ctx context.Context) (_ []string, err error) {
	defer named("ReclaimDeadLeases", &err)
	if s.d.name != "postgres" {
		return nil, nil
	}
	dead, err := s.userList(ctx, `SELECT destination FROM outbound_leases WHERE 0 = 1`+s.leaseOwnerGone())
	if err != nil || len(dead) == 0 {
		return nil, err
	}
	var out []string
	err = s.write(ctx, func(tx *txn) error {
		out = out[:0]
		rows, err := tx.QueryContext(ctx, `DELETE FROM outbound_leases WHERE 0 = 1`+s.leaseOwnerGone()+` RETURNING destination`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var d string
			if err := rows.Scan(&d); err != nil {
				return err
			}
			out = append(out, d)
		}
		return rows.Err()
	})
	return out, err
}

// OutboundOwners identifies the live holders of leases on PostgreSQL (by
// their locks); nil on SQLite.
func (s *Store) OutboundOwners(ctx context.Context) (_ []int64, err error) {
	defer named("OutboundOwners", &err)
	if s.d.name != "postgres" {
		return nil, nil
	}
	rows, err := s.q.QueryContext(ctx, strings.Replace(liveOwnerLocks, "SELECT 1", "SELECT l.objid::bigint", 1)+` ORDER BY 1`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// PauseDestination lets anyone take owner's lease (it waits to retry)
// while keeping its name on it: if nobody does, AcquireDestination gives
// it back kept.
func (s *Store) PauseDestination(ctx context.Context, destination, owner string) (err error) {
	defer named("PauseDestination", &err)
	return s.write(ctx, func(tx *txn) error {
		_, err := tx.ExecContext(ctx, `UPDATE outbound_leases SET expires_ts = 0 WHERE destination = $1 AND owner = $2`, destination, owner)
		return err
	})
}

// DestinationRetries lists the failing destinations' retry state.
func (s *Store) DestinationRetries(ctx context.Context) (_ []storage.DestinationRetry, err error) {
	defer named("DestinationRetries", &err)
	rows, err := s.q.QueryContext(ctx, `SELECT destination, attempts, failing_since_ts, retry_at_ts, recorded_ts FROM outbound_destinations`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.DestinationRetry
	for rows.Next() {
		var r storage.DestinationRetry
		if err := rows.Scan(&r.Destination, &r.Attempts, &r.FailingSince, &r.RetryAt, &r.RecordedAt); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// DestinationRetryOf returns a destination's retry state, if it fails.
func (s *Store) DestinationRetryOf(ctx context.Context, destination string) (_ storage.DestinationRetry, _ bool, err error) {
	defer named("DestinationRetryOf", &err)
	r := storage.DestinationRetry{Destination: destination}
	err = s.q.QueryRowContext(ctx, `SELECT attempts, failing_since_ts, retry_at_ts, recorded_ts FROM outbound_destinations WHERE destination = $1`,
		destination).Scan(&r.Attempts, &r.FailingSince, &r.RetryAt, &r.RecordedAt)
	if err == sql.ErrNoRows {
		return r, false, nil
	}
	return r, err == nil, err
}

// RecordDestinationFailure stores a failing destination's retry state.
func (s *Store) RecordDestinationFailure(ctx context.Context, r storage.DestinationRetry) (err error) {
	defer named("RecordDestinationFailure", &err)
	return s.write(ctx, func(tx *txn) error {
		_, err := tx.ExecContext(ctx, `
			INSERT INTO outbound_destinations (destination, attempts, failing_since_ts, retry_at_ts, recorded_ts) VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (destination) DO UPDATE SET attempts = excluded.attempts,
				failing_since_ts = excluded.failing_since_ts, retry_at_ts = excluded.retry_at_ts, recorded_ts = excluded.recorded_ts`,
			r.Destination, r.Attempts, r.FailingSince, r.RetryAt, r.RecordedAt)
		return err
	})
}

// ResetDestination forgets a destination's failures stored at or before
// heardAt (ms): a sign of life says nothing of a failure after it, which a
// reset that comes late must not wipe. When it forgot some, the other
// daemons are told.
func (s *Store) ResetDestination(ctx context.Context, destination string, heardAt int64) (had bool, err error) {
	defer named("ResetDestination", &err)
	err = s.write(ctx, func(tx *txn) error {
		r, err := tx.ExecContext(ctx, `DELETE FROM outbound_destinations WHERE destination = $1 AND recorded_ts <= $2`, destination, heardAt)
		if err != nil {
			return err
		}
		n, err := r.RowsAffected()
		if had = n > 0; err != nil || !had {
			return err
		}
		return s.notifyOutbound(ctx, tx, storage.OutboundAlive, destination)
	})
	return had, err
}

// outboundChannel carries OutboundEvents between the daemons sharing a
// PostgreSQL database, as "schema kind destination": the schema keeps
// apart the servers whose databases are schemas of one database.
const outboundChannel = "keyserver_outbound"

// notifyOutbound tells the other daemons of kind about destination when tx
// commits (PostgreSQL only).
func (s *Store) notifyOutbound(ctx context.Context, tx *txn, kind, destination string) error {
	if s.d.name != "postgres" {
		return nil
	}
	_, err := tx.ExecContext(ctx, `SELECT pg_notify('`+outboundChannel+`', current_schema() || ' ' || $1 || ' ' || $2)`, kind, destination)
	return err
}

// WatchOutbound calls fn with the OutboundEvents of the daemons sharing the
// database (this one's included) until ctx ends; on SQLite, which one
// daemon uses, it just waits.
func (s *Store) WatchOutbound(ctx context.Context, fn func(storage.OutboundEvent)) (err error) {
	defer named("WatchOutbound", &err)
	if s.d.name != "postgres" {
		<-ctx.Done()
		return nil
	}
	var schema string
	if err := s.q.QueryRowContext(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return err
	}
	l := postgres.NewListener(s.uri, func(bool) {})
	defer l.Close()
	if err := l.Listen(outboundChannel); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case n := <-l.Notify:
			if n == nil {
				continue // reconnected; the sender's own checks cover what was missed
			}
			f := strings.SplitN(n.Extra, " ", 3)
			if len(f) == 3 && f[0] == schema {
				fn(storage.OutboundEvent{Kind: f[1], Destination: f[2]})
			}
		}
	}
}

// OutboundDestinations lists the destinations with pending work or
// failures, by name.
func (s *Store) OutboundDestinations(ctx context.Context) (_ []storage.OutboundDestination, err error) {
	defer named("OutboundDestinations", &err)
	byName := map[string]*storage.OutboundDestination{}
	get := func(name string) *storage.OutboundDestination {
		d := byName[name]
		if d == nil {
			d = &storage.OutboundDestination{Destination: name}
			byName[name] = d
		}
		return d
	}
	rows, err := s.q.QueryContext(ctx, `SELECT destination, SUM(u), SUM(t), SUM(p) FROM (
		SELECT destination, 1 AS u, 0 AS t, 0 AS p FROM outbound_device_updates
		UNION ALL SELECT destination, 1, 0, 0 FROM outbound_signing_key_updates
		UNION ALL SELECT destination, 0, 1, 0 FROM outbound_to_device
		UNION ALL SELECT destination, 0, 0, 1 FROM outbound_pdus) q GROUP BY destination`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var name string
		var u, t, p int
		if err := rows.Scan(&name, &u, &t, &p); err != nil {
			rows.Close()
			return nil, err
		}
		d := get(name)
		d.Updates, d.ToDevice, d.PDUs = u, t, p
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	retries, err := s.DestinationRetries(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range retries {
		get(r.Destination).Retry = r
	}
	rows, err = s.q.QueryContext(ctx, `SELECT destination, owner, expires_ts FROM outbound_leases`)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var name, owner string
		var expires int64
		if err := rows.Scan(&name, &owner, &expires); err != nil {
			rows.Close()
			return nil, err
		}
		if d := byName[name]; d != nil {
			d.LeaseOwner, d.LeaseExpires = owner, expires
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make([]storage.OutboundDestination, 0, len(byName))
	for _, d := range byName {
		out = append(out, *d)
	}
	slices.SortFunc(out, func(a, b storage.OutboundDestination) int { return strings.Compare(a.Destination, b.Destination) })
	return out, nil
}
