// Package lograte keeps a recurring problem from flooding the log: a
// background worker that meets the same error on every round (the
// database is down, say) writes one line per interval for it, and that
// line says how many were left out since the previous one.
package lograte

import (
	"sync"
	"time"

	"github.com/sirupsen/logrus"
)

// Limiter decides which lines of each kind are written. Kinds are the
// messages of the call sites, a fixed set, so its memory stays bounded.
type Limiter struct {
	interval time.Duration
	now      func() time.Time

	mu    sync.Mutex
	kinds map[string]*kind
}

type kind struct {
	last       time.Time // when a line of this kind was last written
	suppressed int       // lines left out since
}

// New makes a limiter writing at most one line per interval and kind; now
// is the clock (time.Now when nil).
func New(interval time.Duration, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	return &Limiter{interval: interval, now: now, kinds: map[string]*kind{}}
}

// Allow reports whether a line of kind k may be written now and, when it
// may, how many lines of that kind were left out since the last one.
func (l *Limiter) Allow(k string) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	st := l.kinds[k]
	if st == nil {
		l.kinds[k] = &kind{last: now}
		return true, 0
	}
	if now.Sub(st.last) < l.interval {
		st.suppressed++
		return false, 0
	}
	suppressed, st.suppressed, st.last = st.suppressed, 0, now
	return true, suppressed
}

// Warn logs err at warning level with msg, which is also the kind: at
// most once per interval, with a "suppressed" field counting the lines
// left out before it.
func (l *Limiter) Warn(log logrus.FieldLogger, err error, msg string) {
	ok, suppressed := l.Allow(msg)
	if !ok {
		return
	}
	entry := log.WithError(err)
	if suppressed > 0 {
		entry = entry.WithField("suppressed", suppressed)
	}
	entry.Warn(msg)
}
