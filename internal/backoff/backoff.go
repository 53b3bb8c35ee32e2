// Package backoff computes the waits between retries of the background
// workers.
package backoff

import "time"

// Delay is base·2^(attempt-1), capped at limit, plus up to a quarter of
// jitter (jitter draws a random duration in [0, n)) so that retries of many
// peers that failed together spread out.
func Delay(attempt int, base, limit time.Duration, jitter func(n int64) int64) time.Duration {
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
