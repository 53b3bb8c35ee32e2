package keyserver

import "time"

// Clock is the time source of the background workers, so tests can drive
// their waits instead of sleeping.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// backoff is base·2^(attempt-1), capped, plus up to a quarter of jitter so
// that retries of many peers that failed together spread out.
func backoff(attempt int, base, limit time.Duration, jitter func(n int64) int64) time.Duration {
	wait := limit
	if attempt < 1 {
		attempt = 1
	}
	if attempt <= 40 {
		wait = min(base<<(attempt-1), limit)
	}
	if wait <= 0 {
		wait = limit
	}
	return wait + time.Duration(jitter(int64(wait)/4+1))
}
