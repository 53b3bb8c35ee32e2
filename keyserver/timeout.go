package keyserver

import (
	"bytes"
	"context"
	"strconv"
	"time"

	"github.com/sirupsen/logrus"
)

// Timeout is how long a key query or claim may wait for other servers,
// as its client sent it: milliseconds, a non-negative integer, in the
// body or the query string. Clients send other shapes too (Element's
// Rust crypto sends {"secs": 10, "nanos": 0}); such a value is ignored
// and the default used, never a reason to refuse the request.
type Timeout struct {
	ms      *int64
	ignored []string // values sent that were not a non-negative integer
}

// TimeoutMS is a timeout of ms milliseconds.
func TimeoutMS(ms int64) Timeout {
	if ms < 0 {
		return Timeout{ignored: []string{strconv.FormatInt(ms, 10)}}
	}
	return Timeout{ms: &ms}
}

// UnmarshalJSON reads a timeout of any shape; it never fails.
func (t *Timeout) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if string(b) == "null" {
		*t = Timeout{}
		return nil
	}
	*t = parseTimeout(string(b))
	return nil
}

// ParseTimeout reads the timeout query parameter ("" when there is none).
func ParseTimeout(s string) Timeout {
	if s == "" {
		return Timeout{}
	}
	return parseTimeout(s)
}

func parseTimeout(s string) Timeout {
	ms, err := strconv.ParseInt(s, 10, 64)
	if err != nil || ms < 0 {
		return Timeout{ignored: []string{s}}
	}
	return Timeout{ms: &ms}
}

// Or returns t when it holds a valid value, else u, remembering what
// either ignored.
func (t Timeout) Or(u Timeout) Timeout {
	if t.ms != nil {
		return t
	}
	u.ignored = append(t.ignored[:len(t.ignored):len(t.ignored)], u.ignored...)
	return u
}

// remoteTimeout is how long a request may wait for other servers: the
// client's timeout, 10 s by default (also for 0 and for a value that is
// not a non-negative integer), a minute at most.
func (s *Service) remoteTimeout(ctx context.Context, t Timeout) time.Duration {
	if len(t.ignored) > 0 {
		ignored := make([]string, len(t.ignored))
		for i, v := range t.ignored {
			if len(v) > 64 {
				v = v[:64] + "..."
			}
			ignored[i] = v
		}
		s.logger(ctx).WithFields(logrus.Fields{"timeout": ignored, "valid_timeout_sent": t.ms != nil}).
			Debug("a timeout that is not a non-negative integer of milliseconds is ignored")
	}
	if t.ms == nil || *t.ms == 0 {
		return defaultRemoteTimeout
	}
	if *t.ms >= maxRemoteTimeout.Milliseconds() {
		return maxRemoteTimeout
	}
	return time.Duration(*t.ms) * time.Millisecond
}
