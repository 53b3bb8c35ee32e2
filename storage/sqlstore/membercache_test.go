package sqlstore

import (
	"fmt"
	"testing"
)

func members(n int) memberList {
	l := memberList{}
	for i := range n {
		l.all = append(l.all, roomMember{userID: fmt.Sprintf("@u%d:x", i), membership: "join"})
	}
	return l
}

// A room keeps one list in the cache, of its snapshot last read; other
// rooms' lists stay.
func TestMemberCacheKeepsOneSnapshotPerRoom(t *testing.T) {
	var c memberCache
	c.put("!a:x", 1, members(3))
	c.put("!b:x", 2, members(4))
	c.put("!a:x", 3, members(5))
	if _, ok := c.lists[1]; ok {
		t.Error("room !a:x's older snapshot is still cached")
	}
	for snap, n := range map[int64]int{2: 4, 3: 5} {
		if l, ok := c.lists[snap]; !ok || len(l.all) != n {
			t.Errorf("snapshot %d: cached %v with %d members, want %d", snap, ok, len(l.all), n)
		}
	}
	if c.members != 9 {
		t.Errorf("members counted %d, want 9", c.members)
	}
	c.put("!a:x", 3, members(5)) // read again: counted once
	if c.members != 9 || len(c.lists) != 2 {
		t.Errorf("after the same snapshot again: %d members in %d lists, want 9 in 2", c.members, len(c.lists))
	}
}

// A full cache starts over.
func TestMemberCacheBound(t *testing.T) {
	var c memberCache
	c.put("!a:x", 1, members(maxCachedMembers-10))
	c.put("!b:x", 2, members(20))
	if _, ok := c.lists[1]; ok || len(c.lists) != 1 || c.members != 20 {
		t.Errorf("after overflowing: %d lists, %d members; want only the new list's 20", len(c.lists), c.members)
	}
}
