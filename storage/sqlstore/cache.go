package sqlstore

import (
	"sync"
	"time"
)

// userCache keeps what the store read for a user (an access token's owner,
// a local user's devices) so that reading it again costs no database round
// trip. Entries are grouped by user, and a user's entries are dropped
// whenever something of theirs changes:
//
//   - in this process, by revoke after the changing transaction commits;
//   - in the other daemons sharing a PostgreSQL database, by revoke when
//     the change's notification arrives (see WatchStream).
//
// A database read that raced with a change must not store what it read
// before the commit, so put only stores when no revocation happened since
// the read began (the generation did not move).
//
// On PostgreSQL the cache is used only while the notification connection
// is up; entries also expire after ttl, which bounds how long a change can
// go unnoticed if that connection dies silently.
type userCache[V any] struct {
	mu      sync.RWMutex
	enabled bool
	gen     uint64
	entries map[string]cacheEntry[V]
	byUser  map[string]map[string]struct{} // user -> keys of their entries
	ttl     time.Duration
	max     int
	now     func() time.Time
}

type cacheEntry[V any] struct {
	user    string
	value   V
	expires time.Time
}

func newUserCache[V any](enabled bool, ttl time.Duration, max int) *userCache[V] {
	return &userCache[V]{enabled: enabled, entries: map[string]cacheEntry[V]{}, byUser: map[string]map[string]struct{}{},
		ttl: ttl, max: max, now: time.Now}
}

// get returns the value cached under key.
func (c *userCache[V]) get(key string) (V, bool) {
	c.mu.RLock()
	e, ok := c.entries[key]
	enabled := c.enabled
	c.mu.RUnlock()
	if !ok || !enabled || c.now().After(e.expires) {
		var zero V
		return zero, false
	}
	return e.value, true
}

// generation is read before a read from the database; ok is false when the
// cache is off and what is read must not be stored.
func (c *userCache[V]) generation() (gen uint64, ok bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.gen, c.enabled
}

// put stores under key what a database read begun at generation gen found
// for user, unless a revocation happened since.
func (c *userCache[V]) put(gen uint64, key, user string, v V) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.enabled || c.gen != gen {
		return
	}
	if len(c.entries) >= c.max {
		c.evictLocked()
	}
	c.entries[key] = cacheEntry[V]{user: user, value: v, expires: c.now().Add(c.ttl)}
	keys := c.byUser[user]
	if keys == nil {
		keys = map[string]struct{}{}
		c.byUser[user] = keys
	}
	keys[key] = struct{}{}
}

// evictLocked drops an eighth of the entries, in map order, which is
// random enough to keep the ones read often coming back.
func (c *userCache[V]) evictLocked() {
	n := c.max/8 + 1
	for k, e := range c.entries {
		if n == 0 {
			break
		}
		n--
		delete(c.entries, k)
		if keys := c.byUser[e.user]; keys != nil {
			delete(keys, k)
			if len(keys) == 0 {
				delete(c.byUser, e.user)
			}
		}
	}
}

// revoke drops every entry of the user. It must be called after the
// changing transaction committed.
func (c *userCache[V]) revoke(user string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	for k := range c.byUser[user] {
		delete(c.entries, k)
	}
	delete(c.byUser, user)
}

// setEnabled turns the cache on or off; either way it starts empty, since
// changes may have gone unheard while it was off.
func (c *userCache[V]) setEnabled(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.enabled = on
	c.gen++
	c.entries = map[string]cacheEntry[V]{}
	c.byUser = map[string]map[string]struct{}{}
}
