package sqlstore

import (
	"fmt"
	"testing"
	"time"
)

func TestUserCacheRules(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newUserCache[string](true, time.Minute, 100)
	c.now = func() time.Time { return now }

	gen, ok := c.generation()
	if !ok {
		t.Fatal("an enabled cache says it is off")
	}
	c.put(gen, "h1", "@a:x", "D1")
	if v, ok := c.get("h1"); !ok || v != "D1" {
		t.Fatalf("get after put: %q %v", v, ok)
	}

	// A lookup that began before a revocation must not store what it read.
	gen, _ = c.generation()
	c.revoke("@someone:x")
	c.put(gen, "h2", "@b:x", "D2")
	if _, ok := c.get("h2"); ok {
		t.Fatal("a lookup older than a revocation was stored")
	}

	// Revoking a user drops all of that user's entries and no one else's.
	gen, _ = c.generation()
	c.put(gen, "h3", "@a:x", "D3")
	c.put(gen, "h4", "@b:x", "D4")
	c.revoke("@a:x")
	for _, h := range []string{"h1", "h3"} {
		if _, ok := c.get(h); ok {
			t.Fatalf("%s of the revoked user is still cached", h)
		}
	}
	if _, ok := c.get("h4"); !ok {
		t.Fatal("another user's token was dropped")
	}

	// Entries expire.
	now = now.Add(time.Minute + time.Second)
	if _, ok := c.get("h4"); ok {
		t.Fatal("an expired entry was served")
	}

	// Turned off, the cache serves and stores nothing, and it starts empty
	// when turned on again.
	gen, _ = c.generation()
	c.put(gen, "h5", "@c:x", "D5")
	c.setEnabled(false)
	if _, ok := c.get("h5"); ok {
		t.Fatal("a disabled cache served an entry")
	}
	gen, ok = c.generation()
	if ok {
		t.Fatal("a disabled cache says it is on")
	}
	c.put(gen, "h6", "@c:x", "D6")
	c.setEnabled(true)
	for _, h := range []string{"h5", "h6"} {
		if _, ok := c.get(h); ok {
			t.Fatalf("%s survived the cache being off", h)
		}
	}
}

// A full cache makes room by dropping some entries, keeping the user index
// in step.
func TestUserCacheEvicts(t *testing.T) {
	c := newUserCache[int](true, time.Minute, 16)
	for i := 0; i < 100; i++ {
		gen, _ := c.generation()
		c.put(gen, fmt.Sprint("k", i), fmt.Sprint("@u", i%5, ":x"), i)
		if len(c.entries) > 16 {
			t.Fatalf("%d entries in a cache of 16", len(c.entries))
		}
	}
	n := 0
	for _, keys := range c.byUser {
		n += len(keys)
	}
	if n != len(c.entries) {
		t.Fatalf("the user index holds %d keys, the cache %d entries", n, len(c.entries))
	}
	if v, ok := c.get("k99"); !ok || v != 99 {
		t.Fatalf("the newest entry is missing: %v %v", v, ok)
	}
}
