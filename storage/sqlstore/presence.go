package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"slices"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/storage"
)

// Presence.
//
// Table presence holds one row per user whose presence the server knows,
// local or remote, and every change clients are told of takes a stream
// position (pos), so /sync reads the changes of its range by position as
// it reads account data; the same write wakes the /sync requests of the
// local users joined to a room with the user, on every daemon of the
// database. Writes that clients are not told of (a /sync that only moves
// the user's last sync forward) keep the row's position.
//
// Table outbound_presence is the queue of presence for other servers: one
// entry of an m.presence push list per destination and user; a newer one
// replaces an unsent older one (deleted, and inserted with a new id, so
// that marking the older one sent leaves the newer one queued).

const presenceColumns = `user_id, state, status_msg, last_active_ts, last_user_sync_ts, last_federation_update_ts, currently_active, pos`

// scanPresence reads a row of presenceColumns.
func scanPresence(row interface{ Scan(...any) error }) (storage.Presence, error) {
	var p storage.Presence
	var msg sql.NullString
	err := row.Scan(&p.UserID, &p.State, &msg, &p.LastActiveTS, &p.LastUserSyncTS, &p.LastFederationUpdateTS, &p.CurrentlyActive, &p.Pos)
	p.StatusMsg = msg.String
	return p, err
}

// Presence returns the stored presence of the given users that have one.
func (s *Store) Presence(ctx context.Context, userIDs []string) (_ map[string]storage.Presence, err error) {
	defer named("Presence", &err)
	out := map[string]storage.Presence{}
	for chunk := range slices.Chunk(userIDs, maxUsersPerStatement) {
		params := make([]any, len(chunk))
		for i, u := range chunk {
			params[i] = u
		}
		rows, err := s.q.QueryContext(ctx, `SELECT `+presenceColumns+` FROM presence WHERE user_id IN (`+placeholders(1, len(chunk))+`)`, params...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			p, err := scanPresence(rows)
			if err != nil {
				rows.Close()
				return nil, err
			}
			out[p.UserID] = p
		}
		if err := rows.Close(); err != nil {
			return nil, err
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// presenceSharersQuery lists the users joined to a room $1 is joined to
// whose IDs match $2 (a LIKE pattern).
const presenceSharersQuery = `SELECT DISTINCT theirs.user_id FROM memberships mine
	JOIN memberships theirs ON theirs.room_id = mine.room_id
	WHERE mine.user_id = $1 AND mine.membership = 'join' AND theirs.membership = 'join' AND theirs.user_id LIKE $2`

// UpdatePresence writes what decide makes of a user's stored presence, in
// one transaction holding the user's row (on PostgreSQL a row lock; a
// SQLite database has one writer).
func (s *Store) UpdatePresence(ctx context.Context, userID string, decide func(prev storage.Presence, stored bool) storage.PresenceWrite) (_ storage.Change, queued bool, err error) {
	defer named("UpdatePresence", &err)
	lock := ""
	if s.d.name == "postgres" {
		lock = " FOR UPDATE"
	}
	ch, err := s.writeChange(ctx, func(tx *txn) error {
		queued = false
		prev, err := scanPresence(tx.QueryRowContext(ctx, `SELECT `+presenceColumns+` FROM presence WHERE user_id = $1`+lock, userID))
		stored := err == nil
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if !stored {
			prev = storage.Presence{UserID: userID, State: "offline"}
		}
		w := decide(prev, stored)
		if !w.Write {
			return nil
		}
		p := w.Presence
		p.UserID, p.Pos = userID, prev.Pos
		if w.Notify {
			if p.Pos, err = s.nextPos(ctx, tx); err != nil {
				return err
			}
			local, err := s.txUserList(ctx, tx, presenceSharersQuery, userID, s.localPattern())
			if err != nil {
				return err
			}
			tx.concern(local...)
			if matrixid.Server(userID) == s.serverName {
				tx.concern(userID)
			}
		}
		var msg any
		if p.StatusMsg != "" {
			msg = p.StatusMsg
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO presence (`+presenceColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
			ON CONFLICT (user_id) DO UPDATE SET state = excluded.state, status_msg = excluded.status_msg,
			last_active_ts = excluded.last_active_ts, last_user_sync_ts = excluded.last_user_sync_ts,
			last_federation_update_ts = excluded.last_federation_update_ts, currently_active = excluded.currently_active,
			pos = excluded.pos`,
			userID, p.State, msg, p.LastActiveTS, p.LastUserSyncTS, p.LastFederationUpdateTS, p.CurrentlyActive, p.Pos); err != nil {
			return err
		}
		if w.Federate == nil {
			return nil
		}
		dests, err := s.txPresenceDestinations(ctx, tx, userID)
		if err != nil {
			return err
		}
		for _, d := range dests {
			if err := txQueuePresence(ctx, tx, d, userID, w.Federate); err != nil {
				return err
			}
			queued = true
		}
		return nil
	})
	return ch, queued, err
}

// txPresenceDestinations lists the other servers with a user joined to a
// room userID is joined to.
func (s *Store) txPresenceDestinations(ctx context.Context, tx *txn, userID string) ([]string, error) {
	rows, err := tx.QueryContext(ctx, `SELECT DISTINCT theirs.user_id FROM memberships mine
		JOIN memberships theirs ON theirs.room_id = mine.room_id
		WHERE mine.user_id = $1 AND mine.membership = 'join' AND theirs.membership = 'join' AND theirs.user_id NOT LIKE $2`,
		userID, s.localPattern())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var servers []string
	for rows.Next() {
		var u string
		if err := rows.Scan(&u); err != nil {
			return nil, err
		}
		if server := matrixid.Server(u); server != "" && server != s.serverName {
			servers = append(servers, server)
		}
	}
	slices.Sort(servers)
	return slices.Compact(servers), rows.Err()
}

// PresenceChanges returns the presence of userID and of the users joined
// to a room userID is joined to, changed in (from, to]; from 0: every
// such presence up to to that is not offline. With from, it also returns
// the presence (not offline) of the users who began to share a room with
// userID in the range (either joined), as Synapse adds the newly joined.
func (s *Store) PresenceChanges(ctx context.Context, userID string, from, to storage.StreamPos) (_ []storage.Presence, err error) {
	defer named("PresenceChanges", &err)
	if to <= from {
		return nil, nil
	}
	q := `SELECT ` + presenceColumns + ` FROM presence WHERE (user_id = $1 OR user_id IN (
		SELECT theirs.user_id FROM memberships mine JOIN memberships theirs ON theirs.room_id = mine.room_id
		WHERE mine.user_id = $1 AND mine.membership = 'join' AND theirs.membership = 'join')) AND pos > $2 AND pos <= $3`
	if from == 0 {
		q += ` AND state <> 'offline'`
	} else {
		q += ` UNION SELECT ` + presenceColumns + ` FROM presence WHERE user_id IN (
		SELECT theirs.user_id FROM memberships mine JOIN memberships theirs ON theirs.room_id = mine.room_id
		WHERE mine.user_id = $1 AND mine.membership = 'join' AND theirs.membership = 'join' AND theirs.user_id <> $1
		AND ((theirs.pos > $2 AND theirs.pos <= $3) OR (mine.pos > $2 AND mine.pos <= $3))) AND state <> 'offline' AND pos <= $3`
	}
	rows, err := s.q.QueryContext(ctx, q+` ORDER BY pos`, userID, from, to)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.Presence
	for rows.Next() {
		p, err := scanPresence(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// DuePresence lists up to limit users whose presence may have timed out.
func (s *Store) DuePresence(ctx context.Context, due storage.PresenceDue, limit int) (_ []string, err error) {
	defer named("DuePresence", &err)
	return s.userList(ctx, `SELECT user_id FROM presence WHERE state <> 'offline' AND (
		(user_id LIKE $1 AND (last_user_sync_ts < $2 AND last_active_ts < $2
			OR (state = 'online' AND last_active_ts < $3)
			OR (currently_active AND last_active_ts < $4)
			OR last_federation_update_ts < $5))
		OR (user_id NOT LIKE $1 AND last_federation_update_ts < $6))
		ORDER BY user_id LIMIT $7`,
		s.localPattern(), due.SyncBefore, due.IdleBefore, due.ActiveBefore, due.PingBefore, due.RemoteBefore, limit)
}

// ShareJoinedRoom reports whether two users are joined to a common room.
func (s *Store) ShareJoinedRoom(ctx context.Context, a, b string) (_ bool, err error) {
	defer named("ShareJoinedRoom", &err)
	var n int
	err = s.q.QueryRowContext(ctx, `SELECT COUNT(*) FROM memberships x JOIN memberships y ON y.room_id = x.room_id
		WHERE x.user_id = $1 AND x.membership = 'join' AND y.user_id = $2 AND y.membership = 'join'`, a, b).Scan(&n)
	return n > 0, err
}

// JoinsIn returns the joins written in (from, to].
func (s *Store) JoinsIn(ctx context.Context, from, to storage.StreamPos) (_ []storage.RoomMember, err error) {
	defer named("JoinsIn", &err)
	rows, err := s.q.QueryContext(ctx, `SELECT room_id, user_id, pos FROM memberships WHERE pos > $1 AND pos <= $2 AND membership = 'join'
		ORDER BY room_id, user_id`, from, to)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.RoomMember
	for rows.Next() {
		m := storage.RoomMember{Membership: storage.MembershipJoin}
		if err := rows.Scan(&m.RoomID, &m.UserID, &m.Pos); err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// RoomLocalPresence returns the stored presence of the local users joined
// to a room.
func (s *Store) RoomLocalPresence(ctx context.Context, roomID string) (_ []storage.Presence, err error) {
	defer named("RoomLocalPresence", &err)
	rows, err := s.q.QueryContext(ctx, `SELECT `+presenceColumns+` FROM presence WHERE user_id IN (
		SELECT user_id FROM memberships WHERE room_id = $1 AND membership = 'join' AND user_id LIKE $2) ORDER BY user_id`,
		roomID, s.localPattern())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.Presence
	for rows.Next() {
		p, err := scanPresence(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// QueuePresence queues push entries for destinations, in one transaction.
func (s *Store) QueuePresence(ctx context.Context, destinations []string, entries map[string]json.RawMessage) (err error) {
	defer named("QueuePresence", &err)
	if len(destinations) == 0 || len(entries) == 0 {
		return nil
	}
	users := make([]string, 0, len(entries))
	for u := range entries {
		users = append(users, u)
	}
	slices.Sort(users)
	return s.write(ctx, func(tx *txn) error {
		for _, d := range destinations {
			for _, u := range users {
				if err := txQueuePresence(ctx, tx, d, u, entries[u]); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// txQueuePresence queues one push entry, replacing an unsent older one of
// the user (a new id puts it behind what is being sent).
func txQueuePresence(ctx context.Context, tx *txn, destination, userID string, content json.RawMessage) error {
	if _, err := tx.ExecContext(ctx, `DELETE FROM outbound_presence WHERE destination = $1 AND user_id = $2`, destination, userID); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO outbound_presence (destination, user_id, content) VALUES ($1, $2, $3)`,
		destination, userID, string(content))
	return err
}

// PresenceDestinations lists the servers with presence waiting.
func (s *Store) PresenceDestinations(ctx context.Context) (_ []string, err error) {
	defer named("PresenceDestinations", &err)
	return s.userList(ctx, `SELECT DISTINCT destination FROM outbound_presence`)
}

// PendingPresence returns up to limit push entries waiting for a
// destination, oldest first.
func (s *Store) PendingPresence(ctx context.Context, destination string, limit int) (_ []storage.OutboundEDU, err error) {
	defer named("PendingPresence", &err)
	rows, err := s.q.QueryContext(ctx, `SELECT id, content FROM outbound_presence WHERE destination = $1 ORDER BY id LIMIT $2`,
		destination, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.OutboundEDU
	for rows.Next() {
		e := storage.OutboundEDU{Destination: destination}
		var content string
		if err := rows.Scan(&e.ID, &content); err != nil {
			return nil, err
		}
		e.Content = json.RawMessage(content)
		out = append(out, e)
	}
	return out, rows.Err()
}

// MarkPresenceSent removes delivered push entries from the queue; newer
// ones queued meanwhile stay.
func (s *Store) MarkPresenceSent(ctx context.Context, destination string, sent []storage.OutboundEDU) (err error) {
	defer named("MarkPresenceSent", &err)
	if len(sent) == 0 {
		return nil
	}
	return s.deleteSentEDUs(ctx, "outbound_presence", destination, sent)
}
