package sqlstore

import (
	"context"
	"database/sql"
	"strings"

	"github.com/keyserver/keyserver/storage"
)

// PendingDestinations lists the servers with updates waiting.
func (s *Store) PendingDestinations(ctx context.Context) (_ []string, err error) {
	defer named("PendingDestinations", &err)
	return s.userList(ctx, `SELECT destination FROM outbound_device_updates
		UNION SELECT destination FROM outbound_signing_key_updates`)
}

// OutboundQueue counts the pending updates per destination.
func (s *Store) OutboundQueue(ctx context.Context) (_ map[string]int, err error) {
	defer named("OutboundQueue", &err)
	rows, err := s.q.QueryContext(ctx, `SELECT destination, COUNT(*) FROM (
		SELECT destination FROM outbound_device_updates
		UNION ALL SELECT destination FROM outbound_signing_key_updates) q GROUP BY destination`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var d string
		var n int
		if err := rows.Scan(&d, &n); err != nil {
			return nil, err
		}
		out[d] = n
	}
	return out, rows.Err()
}

// PendingUpdates returns up to limit updates waiting for a destination,
// oldest first, each with the device's current state and the prev_id that
// keeps the destination's chain of the user's stream_ids unbroken: the
// last stream_id delivered there, the previous update in this batch, or,
// for a destination never sent this user's updates, where its chain
// starts (see chainStart). Signing-key updates come in the same order, by
// their stream_id, outside the chain.
func (s *Store) PendingUpdates(ctx context.Context, destination string, limit int) (_ []storage.OutboundUpdate, err error) {
	defer named("PendingUpdates", &err)
	rows, err := s.q.QueryContext(ctx, `
		SELECT o.user_id, o.device_id, o.stream_id, l.stream_id, d.user_id IS NULL, d.key_json, d.display_name, 0
		FROM outbound_device_updates o
		LEFT JOIN outbound_last_sent l ON l.destination = o.destination AND l.user_id = o.user_id
		LEFT JOIN devices d ON d.user_id = o.user_id AND d.device_id = o.device_id
		WHERE o.destination = $1
		UNION ALL
		SELECT k.user_id, '', k.stream_id, NULL, 0 = 1, NULL, NULL, 1
		FROM outbound_signing_key_updates k WHERE k.destination = $1
		ORDER BY 3 LIMIT $2`, destination, limit)
	if err != nil {
		return nil, err
	}
	var out []storage.OutboundUpdate
	var lastSent []sql.NullInt64
	for rows.Next() {
		var u storage.OutboundUpdate
		var sent sql.NullInt64
		var name sql.NullString
		var signingKeys int
		if err := rows.Scan(&u.UserID, &u.DeviceID, &u.StreamID, &sent, &u.Deleted, &u.KeyJSON, &name, &signingKeys); err != nil {
			rows.Close()
			return nil, err
		}
		if name.Valid {
			u.DisplayName = &name.String
		}
		u.SigningKeys = signingKeys == 1
		out = append(out, u)
		lastSent = append(lastSent, sent)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	prev := map[string]int64{}
	for i := range out {
		u := &out[i]
		if u.SigningKeys {
			continue
		}
		if p, ok := prev[u.UserID]; ok {
			u.PrevID = p
		} else if lastSent[i].Valid {
			u.PrevID = lastSent[i].Int64
		} else {
			p, err := s.chainStart(ctx, destination, u.UserID, u.StreamID)
			if err != nil {
				return nil, err
			}
			u.PrevID = p
		}
		prev[u.UserID] = u.StreamID
	}
	return out, s.withCurrentKeys(ctx, out)
}

// chainStart is the prev_id of the first update of userID sent to a
// destination: the user's newest change from before the destination began
// sharing a room with them, and before the update itself. That is the
// stream_id its first fetch of the list reports; every later change was
// queued for it. It is not simply the change before the update: a queued
// update is replaced by a newer change of its device, so that change may
// never have been sent, and a prev_id naming it makes the destination
// resync although it missed nothing.
func (s *Store) chainStart(ctx context.Context, destination, userID string, before int64) (int64, error) {
	var since sql.NullInt64
	if err := s.q.QueryRowContext(ctx, sharingSinceQuery, userID, likeServer(destination)).Scan(&since); err != nil {
		return 0, err
	}
	if since.Valid {
		before = min(before, since.Int64)
	}
	var p sql.NullInt64
	err := s.q.QueryRowContext(ctx, `SELECT MAX(pos) FROM device_list_changes WHERE user_id = $1 AND pos < $2`,
		userID, before).Scan(&p)
	return p.Int64, err
}

// sharingSinceQuery finds the position since which user $1 has shared a
// room with a user matching $2: in each room, the later of the two joins.
const sharingSinceQuery = `
	SELECT MIN(CASE WHEN mine.pos > theirs.pos THEN mine.pos ELSE theirs.pos END)
	FROM memberships mine JOIN memberships theirs ON theirs.room_id = mine.room_id
	WHERE mine.user_id = $1 AND mine.membership IN ('join', 'invite') AND theirs.membership IN ('join', 'invite')
	AND theirs.user_id LIKE $2 ESCAPE '\'`

// likeServer matches the user IDs of a server with LIKE ... ESCAPE '\'.
func likeServer(serverName string) string {
	return "%:" + strings.NewReplacer(`\`, `\\`, "%", `\%`, "_", `\_`).Replace(serverName)
}

// MarkUpdatesSent records a delivered batch: each update leaves the queue
// unless a newer change of its device replaced it meanwhile, and the
// destination's last delivered stream_id of each user moves on (signing-key
// updates, outside that chain, leave it).
func (s *Store) MarkUpdatesSent(ctx context.Context, destination string, sent []storage.OutboundUpdate) (err error) {
	defer named("MarkUpdatesSent", &err)
	return s.write(ctx, func(tx *txn) error {
		newest := map[string]int64{}
		for _, u := range sent {
			if u.SigningKeys {
				if _, err := tx.ExecContext(ctx, `DELETE FROM outbound_signing_key_updates
					WHERE destination = $1 AND user_id = $2 AND stream_id = $3`,
					destination, u.UserID, u.StreamID); err != nil {
					return err
				}
				continue
			}
			if _, err := tx.ExecContext(ctx, `DELETE FROM outbound_device_updates
				WHERE destination = $1 AND user_id = $2 AND device_id = $3 AND stream_id = $4`,
				destination, u.UserID, u.DeviceID, u.StreamID); err != nil {
				return err
			}
			newest[u.UserID] = max(newest[u.UserID], u.StreamID)
		}
		for user, id := range newest {
			if _, err := tx.ExecContext(ctx, `
				INSERT INTO outbound_last_sent (destination, user_id, stream_id) VALUES ($1, $2, $3)
				ON CONFLICT (destination, user_id) DO UPDATE SET stream_id = excluded.stream_id`,
				destination, user, id); err != nil {
				return err
			}
		}
		return nil
	})
}

// AcquireDestination takes or renews the lease on sending to destination:
// held when the caller has it now, kept when it already had it and nobody
// took it meanwhile (see PauseDestination), so that a batch it prepared
// under it may still go out under its transaction ID. A lease can be taken
// from another owner once it expires or, on PostgreSQL, as soon as its
// owner's session lock is gone (see HoldOutboundOwner).
func (s *Store) AcquireDestination(ctx context.Context, destination, owner string, now, expires int64) (held, kept bool, err error) {
	defer named("AcquireDestination", &err)
	err = s.write(ctx, func(tx *txn) error {
		var prior string
		err := tx.QueryRowContext(ctx, `SELECT owner FROM outbound_leases WHERE destination = $1`+s.d.forUpdate, destination).Scan(&prior)
		if err != nil && err != sql.ErrNoRows {
			return err
		}
		r, err := tx.ExecContext(ctx, `
			INSERT INTO outbound_leases (destination, owner, expires_ts) VALUES ($1, $2, $3)
			ON CONFLICT (destination) DO UPDATE SET owner = excluded.owner, expires_ts = excluded.expires_ts
			WHERE outbound_leases.owner = excluded.owner OR outbound_leases.expires_ts < $4`+s.leaseOwnerGone(),
			destination, owner, expires, now)
		if err != nil {
			return err
		}
		n, err := r.RowsAffected()
		held = n == 1
		kept = held && prior == owner
		return err
	})
	return held, kept, err
}

// ReleaseDestination gives up a lease. On PostgreSQL the other daemons are
// told (WatchOutbound), so that one waiting for it sends at once.
func (s *Store) ReleaseDestination(ctx context.Context, destination, owner string) (err error) {
	defer named("ReleaseDestination", &err)
	return s.release(ctx, destination, owner, storage.OutboundReleased)
}

// HandOverDestination gives up a lease with work left: on PostgreSQL every
// daemon is told, to take it up.
func (s *Store) HandOverDestination(ctx context.Context, destination, owner string) (err error) {
	defer named("HandOverDestination", &err)
	return s.release(ctx, destination, owner, storage.OutboundHandedOver)
}

func (s *Store) release(ctx context.Context, destination, owner, kind string) error {
	return s.write(ctx, func(tx *txn) error {
		r, err := tx.ExecContext(ctx, `DELETE FROM outbound_leases WHERE destination = $1 AND owner = $2`, destination, owner)
		if err != nil {
			return err
		}
		if n, err := r.RowsAffected(); err != nil || n == 0 {
			return err
		}
		return s.notifyOutbound(ctx, tx, kind, destination)
	})
}

// InboundTransaction returns the stored answer to a transaction.
func (s *Store) InboundTransaction(ctx context.Context, origin, txnID string) (_ []byte, _ bool, err error) {
	defer named("InboundTransaction", &err)
	var resp []byte
	err = s.q.QueryRowContext(ctx, `SELECT response FROM inbound_transactions WHERE origin = $1 AND txn_id = $2`, origin, txnID).Scan(&resp)
	if err == sql.ErrNoRows {
		return nil, false, nil
	}
	return resp, err == nil, err
}

// transactionRetention is how long answers to transactions are kept for
// retries: senders retry within minutes, not days.
const transactionRetention = 24 * 60 * 60 * 1000

// StoreInboundTransaction keeps a transaction's answer (the first one
// stored wins) and drops those older than a day.
func (s *Store) StoreInboundTransaction(ctx context.Context, origin, txnID string, response []byte, now int64) (err error) {
	defer named("StoreInboundTransaction", &err)
	return s.write(ctx, func(tx *txn) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO inbound_transactions (origin, txn_id, response, received_ts) VALUES ($1, $2, $3, $4)
			ON CONFLICT (origin, txn_id) DO NOTHING`, origin, txnID, string(response), now); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM inbound_transactions WHERE received_ts < $1`, now-transactionRetention)
		return err
	})
}

// DueStaleUsers returns stale users whose retry time has come and whose
// resync nobody holds, earliest first.
func (s *Store) DueStaleUsers(ctx context.Context, now int64, limit int) (_ []storage.StaleUser, err error) {
	defer named("DueStaleUsers", &err)
	rows, err := s.q.QueryContext(ctx, `SELECT user_id, server_name, attempts, retry_at_ts, resync_until FROM stale_device_lists
		WHERE retry_at_ts <= $1 AND resync_until <= $1 ORDER BY retry_at_ts, user_id LIMIT $2`, now, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.StaleUser
	for rows.Next() {
		var u storage.StaleUser
		if err := rows.Scan(&u.UserID, &u.ServerName, &u.Attempts, &u.RetryAtTS, &u.ResyncUntil); err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, rows.Err()
}

// StaleEntry returns a user's stale mark, if any.
func (s *Store) StaleEntry(ctx context.Context, userID string) (_ storage.StaleUser, _ bool, err error) {
	defer named("StaleEntry", &err)
	u := storage.StaleUser{UserID: userID}
	err = s.q.QueryRowContext(ctx, `SELECT server_name, attempts, retry_at_ts, resync_until FROM stale_device_lists WHERE user_id = $1`, userID).
		Scan(&u.ServerName, &u.Attempts, &u.RetryAtTS, &u.ResyncUntil)
	if err == sql.ErrNoRows {
		return u, false, nil
	}
	return u, err == nil, err
}

// StaleCount counts the stale users.
func (s *Store) StaleCount(ctx context.Context) (_ int, err error) {
	defer named("StaleCount", &err)
	var n int
	err = s.q.QueryRowContext(ctx, `SELECT COUNT(*) FROM stale_device_lists`).Scan(&n)
	return n, err
}

// NextStaleRetry returns the earliest retry time of any stale user (for a
// user whose resync is held, the end of the hold if later).
func (s *Store) NextStaleRetry(ctx context.Context) (_ int64, _ bool, err error) {
	defer named("NextStaleRetry", &err)
	var at sql.NullInt64
	err = s.q.QueryRowContext(ctx, `SELECT MIN(CASE WHEN resync_until > retry_at_ts THEN resync_until ELSE retry_at_ts END)
		FROM stale_device_lists`).Scan(&at)
	return at.Int64, at.Valid, err
}

// RescheduleStale records a failed resync attempt and when to try again.
func (s *Store) RescheduleStale(ctx context.Context, userID string, attempts int, retryAt int64) (err error) {
	defer named("RescheduleStale", &err)
	return s.write(ctx, func(tx *txn) error {
		_, err := tx.ExecContext(ctx, `UPDATE stale_device_lists SET attempts = $1, retry_at_ts = $2 WHERE user_id = $3`,
			attempts, retryAt, userID)
		return err
	})
}

// DeferServer holds back a server's stale users until a time.
func (s *Store) DeferServer(ctx context.Context, serverName string, until int64) (err error) {
	defer named("DeferServer", &err)
	return s.write(ctx, func(tx *txn) error {
		_, err := tx.ExecContext(ctx, `UPDATE stale_device_lists SET retry_at_ts = $1 WHERE server_name = $2 AND retry_at_ts < $1`,
			until, serverName)
		return err
	})
}

// RetryServerNow makes a server's stale users due at once.
func (s *Store) RetryServerNow(ctx context.Context, serverName string) (err error) {
	defer named("RetryServerNow", &err)
	return s.write(ctx, func(tx *txn) error {
		_, err := tx.ExecContext(ctx, `UPDATE stale_device_lists SET retry_at_ts = 0 WHERE server_name = $1 AND retry_at_ts > 0`, serverName)
		return err
	})
}
