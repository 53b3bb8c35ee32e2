package sqlstore

import (
	"testing"
	"time"
)

func TestTokenCacheRules(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newTokenCache(true)
	c.now = func() time.Time { return now }

	gen, ok := c.generation()
	if !ok {
		t.Fatal("an enabled cache says it is off")
	}
	c.put(gen, "h1", "@a:x", "D1")
	if u, d, ok := c.get("h1"); !ok || u != "@a:x" || d != "D1" {
		t.Fatalf("get after put: %q %q %v", u, d, ok)
	}

	// A lookup that began before a revocation must not store what it read.
	gen, _ = c.generation()
	c.revoke("@someone:x")
	c.put(gen, "h2", "@b:x", "D2")
	if _, _, ok := c.get("h2"); ok {
		t.Fatal("a lookup older than a revocation was stored")
	}

	// Revoking a user drops all of that user's tokens and no one else's.
	gen, _ = c.generation()
	c.put(gen, "h3", "@a:x", "D3")
	c.put(gen, "h4", "@b:x", "D4")
	c.revoke("@a:x")
	for _, h := range []string{"h1", "h3"} {
		if _, _, ok := c.get(h); ok {
			t.Fatalf("%s of the revoked user is still cached", h)
		}
	}
	if _, _, ok := c.get("h4"); !ok {
		t.Fatal("another user's token was dropped")
	}

	// Entries expire.
	now = now.Add(tokenCacheTTL + time.Second)
	if _, _, ok := c.get("h4"); ok {
		t.Fatal("an expired entry was served")
	}

	// Turned off, the cache serves and stores nothing, and it starts empty
	// when turned on again.
	gen, _ = c.generation()
	c.put(gen, "h5", "@c:x", "D5")
	c.setEnabled(false)
	if _, _, ok := c.get("h5"); ok {
		t.Fatal("a disabled cache served an entry")
	}
	gen, ok = c.generation()
	if ok {
		t.Fatal("a disabled cache says it is on")
	}
	c.put(gen, "h6", "@c:x", "D6")
	c.setEnabled(true)
	for _, h := range []string{"h5", "h6"} {
		if _, _, ok := c.get(h); ok {
			t.Fatalf("%s survived the cache being off", h)
		}
	}
}
