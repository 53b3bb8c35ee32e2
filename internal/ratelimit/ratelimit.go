// Package ratelimit is a token bucket per key (an access token, a remote
// server): each key may make Burst requests at once and Rate per second
// after that.
package ratelimit

import (
	"sync"
	"time"
)

// Limiter holds one bucket per key. Buckets that have refilled are dropped
// on a periodic sweep, so memory follows the number of recently active keys.
type Limiter struct {
	rate  float64 // tokens per second
	burst float64
	now   func() time.Time

	mu        sync.Mutex
	buckets   map[string]*bucket
	lastSweep time.Time
}

type bucket struct {
	tokens float64
	at     time.Time
}

// New makes a limiter; rate <= 0 makes one that allows everything.
func New(rate float64, burst int, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	if burst < 1 {
		burst = 1
	}
	return &Limiter{rate: rate, burst: float64(burst), now: now, buckets: map[string]*bucket{}}
}

// Allow takes a token for key. When none is left it returns false and how
// long until one is.
func (l *Limiter) Allow(key string) (bool, time.Duration) {
	return l.take(key, true)
}

// Peek reports what Allow would, without taking a token: for limits on
// failures, which are checked before the attempt and counted after it.
func (l *Limiter) Peek(key string) (bool, time.Duration) {
	return l.take(key, false)
}

func (l *Limiter) take(key string, take bool) (bool, time.Duration) {
	if l == nil || l.rate <= 0 {
		return true, 0
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweep(now)
	b := l.buckets[key]
	if b == nil {
		b = &bucket{tokens: l.burst, at: now}
		l.buckets[key] = b
	}
	b.tokens = min(l.burst, b.tokens+now.Sub(b.at).Seconds()*l.rate)
	b.at = now
	if b.tokens >= 1 {
		if take {
			b.tokens--
		}
		return true, 0
	}
	wait := time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
	return false, max(wait, time.Millisecond)
}

// sweep drops buckets that would be full again: they hold no state. mu is held.
func (l *Limiter) sweep(now time.Time) {
	refill := time.Duration(l.burst / l.rate * float64(time.Second))
	if now.Sub(l.lastSweep) < refill {
		return
	}
	l.lastSweep = now
	for k, b := range l.buckets {
		if now.Sub(b.at) >= refill {
			delete(l.buckets, k)
		}
	}
}

// Size counts the buckets held (for tests).
func (l *Limiter) Size() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}
