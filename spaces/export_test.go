package spaces

import "time"

// SetNow sets the clock that ages other servers' answers.
func SetNow(s *Service, now func() time.Time) { s.now = now }
