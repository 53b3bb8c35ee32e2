package keyserver

import "time"

// SyncMaxWait is the longest a /sync request waits for news.
func (s *Service) SyncMaxWait() time.Duration { return s.opts.SyncMaxTimeout }

// RemoteMaxWait is the longest a request waits for other servers.
func (s *Service) RemoteMaxWait() time.Duration { return maxRemoteTimeout }
