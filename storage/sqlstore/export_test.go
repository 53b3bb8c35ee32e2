package sqlstore

// CachesOn reports whether the token and device caches are on, so that
// tests can wait for a store's listener before relying on them.
func (s *Store) CachesOn() bool {
	_, tokens := s.tokens.generation()
	_, devices := s.devices.generation()
	return tokens && devices
}
