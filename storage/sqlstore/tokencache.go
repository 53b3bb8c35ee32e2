package sqlstore

import (
	"sync"
	"time"
)

// tokenCache remembers which user and device an access token hash belongs
// to, so that authenticating a request costs no database round trip.
//
// Tokens are only ever revoked per user (a login that takes over a device,
// a device deletion), and every revocation goes through revoke after its
// transaction commits: in this process directly, and in the other daemons
// sharing a PostgreSQL database through a notification. A lookup that
// raced with a revocation must not store what it read before the commit,
// so put only stores when no revocation happened since the lookup began
// (the generation did not move).
//
// On PostgreSQL the cache is used only while the notification connection
// is up; entries also expire after tokenCacheTTL, which bounds how long a
// revocation can go unnoticed if that connection dies silently.
type tokenCache struct {
	mu      sync.RWMutex
	enabled bool
	gen     uint64
	entries map[string]tokenEntry          // token hash -> owner
	byUser  map[string]map[string]struct{} // user -> token hashes
	now     func() time.Time
}

type tokenEntry struct {
	userID, deviceID string
	expires          time.Time
}

const (
	tokenCacheTTL = 30 * time.Second
	// tokenCacheMax bounds memory: past it the cache starts over.
	tokenCacheMax = 100_000
)

func newTokenCache(enabled bool) *tokenCache {
	return &tokenCache{enabled: enabled, entries: map[string]tokenEntry{}, byUser: map[string]map[string]struct{}{}, now: time.Now}
}

// get returns the owner of a cached token hash.
func (c *tokenCache) get(hash string) (userID, deviceID string, ok bool) {
	c.mu.RLock()
	e, ok := c.entries[hash]
	enabled := c.enabled
	c.mu.RUnlock()
	if !ok || !enabled || c.now().After(e.expires) {
		return "", "", false
	}
	return e.userID, e.deviceID, true
}

// generation is read before a lookup in the database; ok is false when the
// cache is off and what is read must not be stored.
func (c *tokenCache) generation() (gen uint64, ok bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.gen, c.enabled
}

// put stores what a database lookup begun at generation gen found, unless
// a revocation happened since.
func (c *tokenCache) put(gen uint64, hash, userID, deviceID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.enabled || c.gen != gen {
		return
	}
	if len(c.entries) >= tokenCacheMax {
		c.clearLocked()
	}
	c.entries[hash] = tokenEntry{userID: userID, deviceID: deviceID, expires: c.now().Add(tokenCacheTTL)}
	hashes := c.byUser[userID]
	if hashes == nil {
		hashes = map[string]struct{}{}
		c.byUser[userID] = hashes
	}
	hashes[hash] = struct{}{}
}

// revoke forgets every cached token of the user. It must be called after
// the revoking transaction committed.
func (c *tokenCache) revoke(userID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	for h := range c.byUser[userID] {
		delete(c.entries, h)
	}
	delete(c.byUser, userID)
}

// setEnabled turns the cache on or off; either way it starts empty, since
// revocations may have been missed while it was off.
func (c *tokenCache) setEnabled(on bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.enabled = on
	c.clearLocked()
}

func (c *tokenCache) clearLocked() {
	c.gen++
	c.entries = map[string]tokenEntry{}
	c.byUser = map[string]map[string]struct{}{}
}
