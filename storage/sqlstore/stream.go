package sqlstore

import (
	"context"
	"fmt"
	"slices"
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
// remote users who now share a room with a local user: their lists are
// fetched when a local client first needs them (see txSetMemberships); a
// local user's join queues their devices for the servers of the room that
// did not share a room with them; a leave stops tracking the remote users
// who no longer share any room with a local user (their cache is dropped:
// their server stops sending us their changes).
func (s *Store) SetMembership(ctx context.Context, roomID, userID, membership string, now int64) (_ storage.MembershipResult, err error) {
	defer named("SetMembership", &err)
	var res storage.MembershipResult
	ch, err := s.writeChange(ctx, func(tx *txn) error {
		res = storage.MembershipResult{}
		stale, err := s.txSetMembership(ctx, tx, roomID, userID, membership, now)
		res.NewlyStale, res.DeviceUpdatesQueued = stale, tx.deviceUpdatesQueued
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
	stale, _, err := s.txSetMemberships(ctx, tx, roomID, []memberMove{{userID, membership}}, now, false)
	return stale, err
}

// memberMove is a user's new membership of a room, as device lists count
// it: join, invite or leave.
type memberMove struct {
	userID, membership string
}

// txSetMemberships records users' memberships of one room, as
// txSetMembership does for one, in a number of statements that
// does not grow with the room's members: joining a large room over
// federation brings thousands of member events at once, and on
// PostgreSQL the write holds the stream's counter meanwhile. A move to
// the membership a user has changes nothing; the others share one stream
// position. Tracking starts for the remote users who now share a room
// with a local user and did not before the write, among those who joined
// or were invited and, when a local user joined or was invited, the
// room's remote members. Starting fetches nothing: a list is fetched when
// a local client first needs it (a /keys/query or a claim), so that
// joining a room of thousands of remote users sends no request for
// them, and only a list cached meanwhile (for a query, while they shared
// no room here) is marked stale: their server did not send us its
// changes. Tracking stops for those who share no room with a local user
// any more, among those who left and, when a local user left, the room's
// remote members. A local user who joined or was invited is announced
// (announceDevices) to the servers of the room's members that shared no
// room with them before. With later, the changed rows get no stream
// position (0): the caller gives them one after (PostgreSQL's room writes
// take their positions last, placeLast), and gets their users.
func (s *Store) txSetMemberships(ctx context.Context, tx *txn, roomID string, moves []memberMove, now int64, later bool) (_ []storage.StaleUser, changedUsers []string, _ error) {
	// A user moved twice (a join and a leave in one write) ends as the
	// last move says.
	last := make(map[string]int, len(moves))
	for i, m := range moves {
		last[m.userID] = i
	}
	if len(last) < len(moves) {
		kept := make([]memberMove, 0, len(last))
		for i, m := range moves {
			if last[m.userID] == i {
				kept = append(kept, m)
			}
		}
		moves = kept
	}
	old := map[string]string{}
	for chunk := range slices.Chunk(moves, maxUsersPerStatement) {
		ids := make([]any, 0, len(chunk)+1)
		ids = append(ids, roomID)
		for _, m := range chunk {
			ids = append(ids, m.userID)
		}
		rows, err := tx.QueryContext(ctx, `SELECT user_id, membership FROM memberships WHERE room_id = $1 AND user_id IN (`+
			placeholders(2, len(chunk))+`)`+s.d.forUpdate, ids...)
		if err != nil {
			return nil, nil, err
		}
		for rows.Next() {
			var u, m string
			if err := rows.Scan(&u, &m); err != nil {
				rows.Close()
				return nil, nil, err
			}
			old[u] = m
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, nil, err
		}
	}
	var changed []memberMove
	var localSharing, localLeft bool
	var localJoiners []string
	var remoteSharing, remoteLeft []any
	for _, m := range moves {
		if old[m.userID] == m.membership {
			continue
		}
		changed = append(changed, m)
		sharing := m.membership != storage.MembershipLeave
		switch local := strings.HasSuffix(m.userID, ":"+s.serverName); {
		case local && sharing:
			localSharing = true
			localJoiners = append(localJoiners, m.userID)
		case local:
			localLeft = true
		case sharing:
			remoteSharing = append(remoteSharing, m.userID)
		default:
			remoteLeft = append(remoteLeft, m.userID)
		}
	}
	if len(changed) == 0 {
		return nil, nil, nil
	}
	// Who among the users whose tracking may start shares a room with a
	// local user already, read before the write: the others start being
	// tracked by it, and a list of theirs cached meanwhile (by a query,
	// while nobody here shared a room with them) was not kept up to date
	// by their server, so it is fetched again.
	var sharedBefore map[string]bool
	if localSharing || len(remoteSharing) > 0 {
		var err error
		if sharedBefore, err = s.txSharingBefore(ctx, tx, roomID, localSharing, remoteSharing); err != nil {
			return nil, nil, err
		}
	}
	var pos storage.StreamPos
	if !later {
		var err error
		if pos, err = s.nextPos(ctx, tx); err != nil {
			return nil, nil, err
		}
	}
	for chunk := range slices.Chunk(changed, maxUsersPerStatement/4) {
		params := make([]any, 0, 4*len(chunk))
		for _, m := range chunk {
			changedUsers = append(changedUsers, m.userID)
			params = append(params, roomID, m.userID, m.membership, pos)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO memberships (room_id, user_id, membership, pos) VALUES `+valueRows(len(chunk), 4)+`
			ON CONFLICT (room_id, user_id) DO UPDATE SET membership = excluded.membership, pos = excluded.pos`, params...); err != nil {
			return nil, nil, err
		}
	}
	// The change concerns the room's local members, past ones included (a
	// join brings changes, a leave enters "left"): the local movers among
	// them.
	members, err := s.txUserList(ctx, tx, `SELECT user_id FROM memberships WHERE room_id = $1 AND user_id LIKE $2`,
		roomID, s.localPattern())
	if err != nil {
		return nil, nil, err
	}
	tx.concern(members...)

	// Whose tracking starts and stops, each set by one query (a chunk of
	// listed users at a time).
	var start, stop, sharing []string
	if localSharing {
		// Every remote member of the room now shares it with a local user.
		if sharing, err = s.txUserList(ctx, tx, remoteMembersQuery, roomID, s.localPattern()); err != nil {
			return nil, nil, err
		}
	} else if len(remoteSharing) > 0 {
		if sharing, err = s.txListedUsers(ctx, tx, sharingMoversQuery, roomID, remoteSharing); err != nil {
			return nil, nil, err
		}
	}
	for _, u := range sharing {
		if !sharedBefore[u] {
			start = append(start, u)
		}
	}
	if start, err = s.txCachedRemoteUsers(ctx, tx, start); err != nil {
		return nil, nil, err
	}
	if err := s.announceDevices(ctx, tx, roomID, localJoiners, sharing); err != nil {
		return nil, nil, err
	}
	if localLeft {
		if stop, err = s.txUserList(ctx, tx, unsharedRemoteMembersQuery, roomID, s.localPattern()); err != nil {
			return nil, nil, err
		}
	}
	if len(remoteLeft) > 0 {
		left, err := s.txListedUsers(ctx, tx, unsharedMoversQuery, roomID, remoteLeft)
		if err != nil {
			return nil, nil, err
		}
		stop = append(stop, left...)
	}
	newlyStale := make([]storage.StaleUser, 0, len(start))
	for _, u := range start {
		newlyStale = append(newlyStale, storage.StaleUser{UserID: u, ServerName: u[strings.IndexByte(u, ':')+1:]})
	}
	if err := markManyStale(ctx, tx, newlyStale, now); err != nil {
		return nil, nil, err
	}
	// Their server stops sending us their changes: what we hold of them goes.
	for chunk := range slices.Chunk(stop, maxUsersPerStatement) {
		ids := make([]any, len(chunk))
		for i, u := range chunk {
			ids[i] = u
		}
		for _, table := range []string{"remote_devices", "remote_cross_signing_keys", "remote_device_lists", "remote_stream_ids", "stale_device_lists"} {
			if _, err := tx.ExecContext(ctx, `DELETE FROM `+table+` WHERE user_id IN (`+placeholders(1, len(chunk))+`)`, ids...); err != nil {
				return nil, nil, err
			}
		}
	}
	return newlyStale, changedUsers, nil
}

// txSharingBefore returns, among the remote members of room roomID
// (joined or invited; when localSharing) and the remote users listed in
// movers, those who share a room with a local user. It runs before a
// membership write, to tell apart the users whose tracking the write
// starts.
func (s *Store) txSharingBefore(ctx context.Context, tx *txn, roomID string, localSharing bool, movers []any) (map[string]bool, error) {
	out := map[string]bool{}
	if localSharing {
		users, err := s.txUserList(ctx, tx, sharingRemoteMembersQuery, roomID, s.localPattern())
		if err != nil {
			return nil, err
		}
		for _, u := range users {
			out[u] = true
		}
	}
	for chunk := range slices.Chunk(movers, maxUsersPerStatement) {
		users, err := s.txUserList(ctx, tx, strings.Replace(sharingListedQuery, "LISTED", placeholders(2, len(chunk)), 1),
			append([]any{s.localPattern()}, chunk...)...)
		if err != nil {
			return nil, err
		}
		for _, u := range users {
			out[u] = true
		}
	}
	return out, nil
}

// txListedUsers runs a query of user IDs whose $1 is roomID and whose
// LISTED stands for the placeholders of users, a chunk at a time.
func (s *Store) txListedUsers(ctx context.Context, tx *txn, query, roomID string, users []any) ([]string, error) {
	var out []string
	for chunk := range slices.Chunk(users, maxUsersPerStatement) {
		got, err := s.txUserList(ctx, tx, strings.Replace(query, "LISTED", placeholders(3, len(chunk)), 1),
			append([]any{roomID, s.localPattern()}, chunk...)...)
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	return out, nil
}

// markManyStale marks remote users' lists stale (markStale), many a
// statement; none of them is held for a resync.
func markManyStale(ctx context.Context, tx *txn, users []storage.StaleUser, now int64) error {
	for chunk := range slices.Chunk(users, maxUsersPerStatement/6) {
		params := make([]any, 0, 6*len(chunk))
		for _, u := range chunk {
			params = append(params, u.UserID, u.ServerName, now, 0, 0, 0)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO stale_device_lists (user_id, server_name, since_ts, attempts, retry_at_ts, resync_until)
			VALUES `+valueRows(len(chunk), 6)+` ON CONFLICT (user_id) DO NOTHING`, params...); err != nil {
			return err
		}
	}
	return nil
}

// The queries of txSetMemberships. A user in m.user_id shares a room
// with a local user (one matching the pattern $2) when some room has both
// joined or invited.

// remoteMembersQuery lists the remote users joined to or invited into
// room $1.
const remoteMembersQuery = `SELECT m.user_id FROM memberships m
	WHERE m.room_id = $1 AND m.membership IN ('join', 'invite') AND m.user_id NOT LIKE $2`

// sharingRemoteMembersQuery lists the remote users joined to or invited
// into room $1 who share a room with a local user.
const sharingRemoteMembersQuery = `SELECT m.user_id FROM memberships m
	WHERE m.room_id = $1 AND m.membership IN ('join', 'invite') AND m.user_id NOT LIKE $2
	AND EXISTS (SELECT 1 FROM memberships theirs JOIN memberships ours ON ours.room_id = theirs.room_id
		WHERE theirs.user_id = m.user_id AND theirs.membership IN ('join', 'invite')
		AND ours.membership IN ('join', 'invite') AND ours.user_id LIKE $2)`

// sharingListedQuery lists the users LISTED who share a room with a
// local user (matching $1).
const sharingListedQuery = `SELECT DISTINCT theirs.user_id FROM memberships theirs JOIN memberships ours ON ours.room_id = theirs.room_id
	WHERE theirs.user_id IN (LISTED) AND theirs.membership IN ('join', 'invite')
	AND ours.membership IN ('join', 'invite') AND ours.user_id LIKE $1`

// sharingMoversQuery lists the remote users LISTED, joined to or invited
// into room $1, who share a room with a local user.
const sharingMoversQuery = `SELECT m.user_id FROM memberships m
	WHERE m.room_id = $1 AND m.user_id NOT LIKE $2 AND m.user_id IN (LISTED) AND m.membership IN ('join', 'invite')
	AND EXISTS (SELECT 1 FROM memberships theirs JOIN memberships ours ON ours.room_id = theirs.room_id
		WHERE theirs.user_id = m.user_id AND theirs.membership IN ('join', 'invite')
		AND ours.membership IN ('join', 'invite') AND ours.user_id LIKE $2)`

// unsharedRemoteMembersQuery lists the remote users joined to or invited
// into room $1 who share no room with a local user.
const unsharedRemoteMembersQuery = `SELECT m.user_id FROM memberships m
	WHERE m.room_id = $1 AND m.membership IN ('join', 'invite') AND m.user_id NOT LIKE $2
	AND NOT EXISTS (SELECT 1 FROM memberships theirs JOIN memberships ours ON ours.room_id = theirs.room_id
		WHERE theirs.user_id = m.user_id AND theirs.membership IN ('join', 'invite')
		AND ours.membership IN ('join', 'invite') AND ours.user_id LIKE $2)`

// unsharedMoversQuery lists the remote users LISTED, members of room $1
// (who left it), who share no room with a local user.
const unsharedMoversQuery = `SELECT m.user_id FROM memberships m
	WHERE m.room_id = $1 AND m.user_id NOT LIKE $2 AND m.user_id IN (LISTED)
	AND NOT EXISTS (SELECT 1 FROM memberships theirs JOIN memberships ours ON ours.room_id = theirs.room_id
		WHERE theirs.user_id = m.user_id AND theirs.membership IN ('join', 'invite')
		AND ours.membership IN ('join', 'invite') AND ours.user_id LIKE $2)`

// sharesRoomWithLocalQuery counts the rooms user $1 shares with users
// matching the local pattern $2.
const sharesRoomWithLocalQuery = `
	SELECT COUNT(*) FROM memberships theirs JOIN memberships ours ON ours.room_id = theirs.room_id
	WHERE theirs.user_id = $1 AND theirs.membership IN ('join', 'invite') AND ours.membership IN ('join', 'invite') AND ours.user_id LIKE $2`

// maxUsersPerStatement bounds the values one statement names.
const maxUsersPerStatement = 500

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

// txCachedRemoteUsers returns those of users whose device list is cached.
func (s *Store) txCachedRemoteUsers(ctx context.Context, tx *txn, users []string) ([]string, error) {
	var out []string
	for chunk := range slices.Chunk(users, maxUsersPerStatement) {
		ids := make([]any, len(chunk))
		for i, u := range chunk {
			ids[i] = u
		}
		got, err := s.txUserList(ctx, tx, `SELECT user_id FROM remote_device_lists WHERE user_id IN (`+placeholders(1, len(chunk))+`)`, ids...)
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	return out, nil
}

// announceDevices queues the current devices of the local users who
// joined (or were invited into) room roomID for the servers of its remote
// members (remoteMembers) that shared no other room with them, and so were
// not receiving their device-list updates: as the spec asks, a server
// that newly shares a room with a user is told of the user's devices. Each
// device goes with its newest change; the prev_id the sender gives it
// (PendingUpdates) is one the destination has not seen, so a server that
// holds no list of the user fetches it, and one whose copy is older
// refreshes it.
func (s *Store) announceDevices(ctx context.Context, tx *txn, roomID string, joiners, remoteMembers []string) error {
	if len(joiners) == 0 || len(remoteMembers) == 0 {
		return nil
	}
	roomServers := map[string]bool{}
	for _, u := range remoteMembers {
		if _, server, ok := strings.Cut(u, ":"); ok {
			roomServers[server] = true
		}
	}
	for _, userID := range joiners {
		// The servers sharing another room with the user already receive
		// its updates.
		others, err := s.txUserList(ctx, tx, otherRoomsRemoteMatesQuery, userID, roomID, s.localPattern())
		if err != nil {
			return err
		}
		receiving := map[string]bool{}
		for _, u := range others {
			if _, server, ok := strings.Cut(u, ":"); ok {
				receiving[server] = true
			}
		}
		var dests []string
		for server := range roomServers {
			if !receiving[server] {
				dests = append(dests, server)
			}
		}
		if len(dests) == 0 {
			continue
		}
		sort.Strings(dests)
		type device struct {
			id  string
			pos int64
		}
		var devices []device
		rows, err := tx.QueryContext(ctx, `SELECT c.device_id, MAX(c.pos) FROM device_list_changes c
			JOIN devices d ON d.user_id = c.user_id AND d.device_id = c.device_id
			WHERE c.user_id = $1 GROUP BY c.device_id`, userID)
		if err != nil {
			return err
		}
		for rows.Next() {
			var d device
			if err := rows.Scan(&d.id, &d.pos); err != nil {
				rows.Close()
				return err
			}
			devices = append(devices, d)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if len(devices) == 0 {
			continue
		}
		var params []any
		flush := func() error {
			if len(params) == 0 {
				return nil
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO outbound_device_updates (destination, user_id, device_id, stream_id) VALUES `+
				valueRows(len(params)/4, 4)+` ON CONFLICT (destination, user_id, device_id) DO NOTHING`, params...)
			params = params[:0]
			return err
		}
		for _, dest := range dests {
			for _, d := range devices {
				params = append(params, dest, userID, d.id, d.pos)
				if len(params) >= 4*(maxUsersPerStatement/4) {
					if err := flush(); err != nil {
						return err
					}
				}
			}
		}
		if err := flush(); err != nil {
			return err
		}
		tx.deviceUpdatesQueued = true
	}
	return nil
}

// otherRoomsRemoteMatesQuery lists the remote users (not matching $3)
// who share a room other than $2 with user $1.
const otherRoomsRemoteMatesQuery = `SELECT DISTINCT theirs.user_id FROM memberships mine
	JOIN memberships theirs ON theirs.room_id = mine.room_id
	WHERE mine.user_id = $1 AND mine.room_id <> $2 AND mine.membership IN ('join', 'invite')
	AND theirs.membership IN ('join', 'invite') AND theirs.user_id NOT LIKE $3`
