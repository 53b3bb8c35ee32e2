// Package clock is the time source of the background workers, so that
// tests drive their waits instead of sleeping.
package clock

import (
	"sync"
	"time"
)

// Clock tells the time and waits.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// Real is the system clock.
type Real struct{}

// Now is time.Now.
func (Real) Now() time.Time { return time.Now() }

// After is time.After.
func (Real) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Fake is a Clock a test moves by hand: waits end only when it advances
// past them.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers []fakeTimer
}

type fakeTimer struct {
	at time.Time
	ch chan time.Time
}

// NewFake makes a Fake clock at a fixed time.
func NewFake() *Fake { return &Fake{now: time.UnixMilli(1_700_000_000_000)} }

// Now is the fake time.
func (c *Fake) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// After returns a channel that receives once the clock has advanced by d.
func (c *Fake) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.timers = append(c.timers, fakeTimer{c.now.Add(d), ch})
	return ch
}

// Waiting counts the waits that have not ended, so that a test can advance
// the clock only once the code under test waits on it.
func (c *Fake) Waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// WaitsUntil reports whether a wait ends exactly at t, so that a test can
// advance the clock once the code under test waits for that moment.
func (c *Fake) WaitsUntil(t time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.timers {
		if w.at.Equal(t) {
			return true
		}
	}
	return false
}

// Advance moves the clock and fires the waits that have ended.
func (c *Fake) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.timers[:0]
	for _, t := range c.timers {
		if !t.at.After(c.now) {
			t.ch <- c.now
		} else {
			kept = append(kept, t)
		}
	}
	c.timers = kept
}
