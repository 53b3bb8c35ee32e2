package sqlstore

import (
	"context"
	"slices"
	"strings"
	"sync"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/storage"
)

// roomMember is a user joined to or invited into a room.
type roomMember struct {
	userID, membership string
}

// memberList is a room's joined and invited members, and the local ones
// among them by user ID, sorted: what a write concerns (a message
// concerns every local member; the list is handed on as it is, not
// copied per message).
type memberList struct {
	all   []roomMember
	local []string
	// servers are the other servers with a joined member, sorted: where
	// the room's events go (txQueueRoomPDUs, writeMessages), worked out
	// once per list rather than once per event.
	servers []string
}

// newMemberList makes a memberList of the server's members.
func (s *Store) newMemberList(all []roomMember) memberList {
	suffix := ":" + s.serverName
	l := memberList{all: all, local: []string{}}
	for _, m := range all {
		if strings.HasSuffix(m.userID, suffix) {
			l.local = append(l.local, m.userID)
		}
		if server := matrixid.Server(m.userID); m.membership == storage.MembershipJoin && server != "" && server != s.serverName {
			l.servers = append(l.servers, server)
		}
	}
	slices.Sort(l.local)
	l.local = slices.Compact(l.local)
	slices.Sort(l.servers)
	l.servers = slices.Compact(l.servers)
	return l
}

// memberCache keeps the joined and invited members of state snapshots.
// A snapshot never changes, so neither does its member list (a redaction
// keeps a member event's membership): every event
// written on the same state (every message) finds the room's members
// without reading them again. Lists are kept only once their transaction
// committed: a snapshot number of a rolled-back transaction may be used
// again (SQLite). A room has one list in the cache, of the snapshot last
// read: once a room's state has changed, events are built on the new
// one, and older lists would only lengthen every garbage collection's
// marking.
type memberCache struct {
	mu      sync.Mutex
	lists   map[int64]memberList
	current map[string]int64 // room -> its snapshot in lists
	members int              // members in lists, bounded by maxCachedMembers
}

// maxCachedMembers bounds the cache; when it is full it starts over.
const maxCachedMembers = 200000

// txRoomMembers returns the joined and invited members of a room's
// current state in tx, whose snapshot is snapshot (0: not known, not
// kept).
func (s *Store) txRoomMembers(ctx context.Context, tx *txn, roomID string, snapshot int64) (memberList, error) {
	c := &s.roomMembers
	if snapshot != 0 {
		c.mu.Lock()
		list, ok := c.lists[snapshot]
		c.mu.Unlock()
		if ok {
			return list, nil
		}
	}
	rows, err := tx.QueryContext(ctx, `SELECT state_key, membership FROM room_current_state
		WHERE room_id = $1 AND event_type = 'm.room.member' AND membership IN ('join', 'invite')`, roomID)
	if err != nil {
		return memberList{}, err
	}
	defer rows.Close()
	all := []roomMember{}
	for rows.Next() {
		var m roomMember
		if err := rows.Scan(&m.userID, &m.membership); err != nil {
			return memberList{}, err
		}
		all = append(all, m)
	}
	if err := rows.Err(); err != nil {
		return memberList{}, err
	}
	list := s.newMemberList(all)
	if snapshot != 0 {
		tx.onCommit(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.put(roomID, snapshot, list)
		})
	}
	return list, nil
}

// put keeps list as the members of a room's snapshot, in place of the
// room's list before it; mu is held.
func (c *memberCache) put(roomID string, snapshot int64, list memberList) {
	old, ok := c.current[roomID]
	if ok {
		c.members -= len(c.lists[old].all)
		delete(c.lists, old)
	}
	if c.lists == nil || c.members+len(list.all) > maxCachedMembers {
		c.lists, c.current, c.members = map[int64]memberList{}, map[string]int64{}, 0
	}
	c.lists[snapshot] = list
	c.current[roomID] = snapshot
	c.members += len(list.all)
}

// concernLocalMembers tells the stream that a write concerns the local
// members among members: their waiting /sync requests wake.
func (s *Store) concernLocalMembers(tx *txn, members memberList) {
	tx.concernSorted(members.local)
}
