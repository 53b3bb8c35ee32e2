package keyserver

import "time"

// RemoteMaxWait is the longest a request waits for other servers.
func (s *Service) RemoteMaxWait() time.Duration { return maxRemoteTimeout }
