package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"

	"github.com/keyserver/keyserver/storage"
)

// CurrentPos returns the newest stream position; every change at or below
// it is committed.
func (s *Store) CurrentPos(ctx context.Context) (_ storage.StreamPos, err error) {
	defer named("CurrentPos", &err)
	var pos storage.StreamPos
	err = s.q.QueryRowContext(ctx, `SELECT pos FROM stream_position WHERE id = 1`).Scan(&pos)
	return pos, err
}

// Users share a room when each is joined to it or invited into it: an
// invited user's devices are tracked as Synapse does, so that the
// invitee can read the messages sent to the room from the start. Every
// query here and in the other files of the device-list side writes this
// as membership IN ('join', 'invite').

// sharesRoom is true when user $1 and the user in column col are both
// joined to (or invited into) some room.
const sharesRoom = `EXISTS (
	SELECT 1 FROM memberships shared_mine JOIN memberships shared_theirs ON shared_theirs.room_id = shared_mine.room_id
	WHERE shared_mine.user_id = $1 AND shared_mine.membership IN ('join', 'invite')
	AND shared_theirs.user_id = %s AND shared_theirs.membership IN ('join', 'invite'))`

// The users whose device lists user $1 must re-fetch after position $2, up
// to $3: users sharing a room with $1 (or $1 itself) with a device change
// or a cross-signing change in the range (one for the owner only counts for
// $1 alone), and users with whom $1 began to share a room in the range:
// another user who joined (or was invited to) a room $1 is in, and every
// member of a room $1 itself joined or was invited to, $1 included.
var changedQuery = `
SELECT c.user_id FROM device_list_changes c
WHERE (c.user_id = $1 OR ` + fmt.Sprintf(sharesRoom, "c.user_id") + `) AND c.pos > $2 AND c.pos <= $3
UNION
SELECT x.user_id FROM cross_signing_changes x
WHERE (x.user_id = $1 OR (NOT x.owner_only AND ` + fmt.Sprintf(sharesRoom, "x.user_id") + `)) AND x.pos > $2 AND x.pos <= $3
UNION
SELECT theirs.user_id FROM memberships mine JOIN memberships theirs ON theirs.room_id = mine.room_id
WHERE mine.user_id = $1 AND mine.membership IN ('join', 'invite') AND theirs.membership IN ('join', 'invite')
AND ((theirs.user_id <> $1 AND theirs.pos > $2 AND theirs.pos <= $3) OR (mine.pos > $2 AND mine.pos <= $3))`

// The users $1 stopped sharing every room with in the range: those who left
// a room $1 is or was in, and the members of rooms $1 left, that now share
// no room with $1.
var leftQuery = `
SELECT DISTINCT theirs.user_id FROM memberships mine JOIN memberships theirs ON theirs.room_id = mine.room_id
WHERE mine.user_id = $1 AND theirs.user_id <> $1
AND ((theirs.membership = 'leave' AND theirs.pos > $2 AND theirs.pos <= $3)
  OR (mine.membership = 'leave' AND mine.pos > $2 AND mine.pos <= $3 AND theirs.membership IN ('join', 'invite')))
AND NOT ` + fmt.Sprintf(sharesRoom, "theirs.user_id")

// DeviceListChanges answers /keys/changes and /sync's device_lists for
// userID between two positions.
func (s *Store) DeviceListChanges(ctx context.Context, userID string, from, to storage.StreamPos) (_ storage.DeviceListChanges, err error) {
	defer named("DeviceListChanges", &err)
	var res storage.DeviceListChanges
	if to <= from {
		return storage.DeviceListChanges{Changed: []string{}, Left: []string{}}, nil
	}
	if res.Changed, err = s.userList(ctx, changedQuery, userID, from, to); err != nil {
		return res, err
	}
	if res.Left, err = s.userList(ctx, leftQuery, userID, from, to); err != nil {
		return res, err
	}
	return res, nil
}

// userList runs a query of one text column (user IDs, or other IDs) and
// returns its values sorted.
func (s *Store) userList(ctx context.Context, query string, params ...any) ([]string, error) {
	rows, err := s.q.QueryContext(ctx, query, params...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	users := []string{}
	for rows.Next() {
		var u string
		if err := rows.Scan(&u); err != nil {
			return nil, err
		}
		users = append(users, u)
	}
	sort.Strings(users)
	return users, rows.Err()
}

// SetMembership records a user's membership of a room. Setting the
// membership it already has changes nothing. A join starts tracking the
// remote users who now share a room with a local user and had no cached
// list (they are marked stale, to be fetched); a leave stops tracking the
// remote users who no longer share any room with a local user (their
// cache is dropped: their server stops sending us their changes).
func (s *Store) SetMembership(ctx context.Context, roomID, userID, membership string, now int64) (_ storage.MembershipResult, err error) {
	defer named("SetMembership", &err)
	var res storage.MembershipResult
	ch, err := s.writeChange(ctx, func(tx *txn) error {
		res = storage.MembershipResult{}
		stale, err := s.txSetMembership(ctx, tx, roomID, userID, membership, now)
		res.NewlyStale = stale
		return err
	})
	res.Change = ch
	return res, err
}

// txSetMembership is SetMembership inside a transaction of its caller
// (an admin write, or the write of a room's membership event), returning
// the remote users it started tracking. membership is join, invite
// (which shares the room like a join, as Synapse counts it) or leave.
func (s *Store) txSetMembership(ctx context.Context, tx *txn, roomID, userID, membership string, now int64) ([]storage.StaleUser, error) {
	local := strings.HasSuffix(userID, ":"+s.serverName)
	var newlyStale []storage.StaleUser
	var old string
	err := tx.QueryRowContext(ctx, `SELECT membership FROM memberships WHERE room_id = $1 AND user_id = $2`+s.d.forUpdate,
		roomID, userID).Scan(&old)
	if err != nil && err != sql.ErrNoRows {
		return nil, err
	}
	if old == membership {
		return nil, nil
	}
	pos, err := s.nextPos(ctx, tx)
	if err != nil {
		return nil, err
	}
	if _, err = tx.ExecContext(ctx, `
		INSERT INTO memberships (room_id, user_id, membership, pos) VALUES ($1, $2, $3, $4)
		ON CONFLICT (room_id, user_id) DO UPDATE SET membership = excluded.membership, pos = excluded.pos`,
		roomID, userID, membership, pos); err != nil {
		return nil, err
	}
	// The change concerns the user and the room's local members, past
	// ones included: a join brings changes, a leave enters "left".
	members, err := s.txUserList(ctx, tx, `SELECT user_id FROM memberships WHERE room_id = $1 AND user_id LIKE $2`,
		roomID, s.localPattern())
	if err != nil {
		return nil, err
	}
	tx.concern(members...)
	if local {
		tx.concern(userID)
	}
	// Whose tracking this changes: when a local user moved, the room's
	// remote members (each query one statement, however many: a join to a
	// large federated room must not cost two statements a member while
	// the write holds the stream); else the remote user who moved.
	sharing := membership != storage.MembershipLeave
	var start, stop []string
	switch {
	case local && sharing:
		// Every remote member of the room now shares it with userID.
		if start, err = s.txUserList(ctx, tx, untrackedRemoteMembersQuery, roomID, s.localPattern()); err != nil {
			return nil, err
		}
	case local:
		if stop, err = s.txUserList(ctx, tx, unsharedRemoteMembersQuery, roomID, s.localPattern()); err != nil {
			return nil, err
		}
	default:
		shares, err := s.txSharesRoomWithLocal(ctx, tx, userID)
		if err != nil {
			return nil, err
		}
		if sharing && shares {
			var tracked int
			if err := tx.QueryRowContext(ctx, `SELECT
				(SELECT COUNT(*) FROM remote_device_lists WHERE user_id = $1) + (SELECT COUNT(*) FROM stale_device_lists WHERE user_id = $1)`,
				userID).Scan(&tracked); err != nil {
				return nil, err
			}
			if tracked == 0 {
				start = []string{userID}
			}
		}
		if !sharing && !shares {
			stop = []string{userID}
		}
	}
	for _, u := range start {
		server := u[strings.IndexByte(u, ':')+1:]
		if err := markStale(ctx, tx, u, server, now, 0); err != nil {
			return nil, err
		}
		newlyStale = append(newlyStale, storage.StaleUser{UserID: u, ServerName: server})
	}
	// Their server stops sending us their changes: what we hold of them goes.
	for len(stop) > 0 {
		n := min(len(stop), maxUsersPerStatement)
		ids := make([]any, n)
		for i, u := range stop[:n] {
			ids[i] = u
		}
		for _, table := range []string{"remote_devices", "remote_cross_signing_keys", "remote_device_lists", "remote_stream_ids", "stale_device_lists"} {
			if _, err := tx.ExecContext(ctx, `DELETE FROM `+table+` WHERE user_id IN (`+placeholders(1, n)+`)`, ids...); err != nil {
				return nil, err
			}
		}
		stop = stop[n:]
	}
	return newlyStale, nil
}

// untrackedRemoteMembersQuery lists the remote users joined to or invited
// into room $1 (users not matching the local pattern $2) whose device
// lists are neither cached nor waiting to be fetched.
const untrackedRemoteMembersQuery = `SELECT m.user_id FROM memberships m
	WHERE m.room_id = $1 AND m.membership IN ('join', 'invite') AND m.user_id NOT LIKE $2
	AND NOT EXISTS (SELECT 1 FROM remote_device_lists r WHERE r.user_id = m.user_id)
	AND NOT EXISTS (SELECT 1 FROM stale_device_lists st WHERE st.user_id = m.user_id)`

// unsharedRemoteMembersQuery lists the remote users joined to or invited
// into room $1 who share no room with a user matching the local pattern
// $2.
const unsharedRemoteMembersQuery = `SELECT m.user_id FROM memberships m
	WHERE m.room_id = $1 AND m.membership IN ('join', 'invite') AND m.user_id NOT LIKE $2
	AND NOT EXISTS (SELECT 1 FROM memberships theirs JOIN memberships ours ON ours.room_id = theirs.room_id
		WHERE theirs.user_id = m.user_id AND theirs.membership IN ('join', 'invite')
		AND ours.membership IN ('join', 'invite') AND ours.user_id LIKE $2)`

// maxUsersPerStatement bounds the users one statement names.
const maxUsersPerStatement = 500

func (s *Store) txSharesRoomWithLocal(ctx context.Context, tx *txn, userID string) (bool, error) {
	var n int
	err := tx.QueryRowContext(ctx, sharesRoomWithLocalQuery, userID, s.localPattern()).Scan(&n)
	return n > 0, err
}

// sharesRoomWithLocalQuery counts the rooms user $1 shares with users
// matching the local pattern $2.
const sharesRoomWithLocalQuery = `
	SELECT COUNT(*) FROM memberships theirs JOIN memberships ours ON ours.room_id = theirs.room_id
	WHERE theirs.user_id = $1 AND theirs.membership IN ('join', 'invite') AND ours.membership IN ('join', 'invite') AND ours.user_id LIKE $2`

func (s *Store) txUserList(ctx context.Context, tx *txn, query string, params ...any) ([]string, error) {
	rows, err := tx.QueryContext(ctx, query, params...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var u string
		if err := rows.Scan(&u); err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, rows.Err()
}
