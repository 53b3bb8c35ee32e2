package sqlstore

import "time"

// SetRevocationConfirmTimeout changes how long a revocation waits for
// confirmations, returning the old value.
func SetRevocationConfirmTimeout(d time.Duration) time.Duration {
	old := revocationConfirmTimeout
	revocationConfirmTimeout = d
	return old
}

// ListenerName is the application_name of instance id's listener.
func (s *Store) ListenerName(id string) string { return s.listenerName(id) }

// ListenerServer names the daemons a store's revocations wait for.
func ListenerServer(s *Store) string { return s.rev.server }
