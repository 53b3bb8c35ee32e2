package keyserver

import (
	"context"
	"math"
	"strings"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// What an operator does from the command line (keyserver admin ...).

// MarkStale marks a remote user's cached device list for a resync: the
// operator's answer to a user reporting undecryptable messages.
func (s *Service) MarkStale(ctx context.Context, userID string) error {
	server, ok := matrixid.ParseUserID(userID)
	if !ok {
		return mxerr.InvalidParam("%q is not a user ID", userID)
	}
	if s.isLocal(server) {
		return mxerr.InvalidParam("%s is a local user: its list is always current", userID)
	}
	return s.db.MarkRemoteStale(ctx, userID, server, s.nowMS())
}

// OutboundQueue counts the device-list updates waiting per destination.
func (s *Service) OutboundQueue(ctx context.Context) (map[string]int, error) {
	return s.db.OutboundQueue(ctx)
}

// OutboundDestinations lists the destinations with work waiting or
// failures: their queues, retry state and lease.
func (s *Service) OutboundDestinations(ctx context.Context) ([]storage.OutboundDestination, error) {
	return s.db.OutboundDestinations(ctx)
}

// RetryDestination forgets a destination's failures, so that the daemons
// sending to it try it at once (on PostgreSQL they are told; a daemon on
// SQLite reads it within a second). It reports whether there were any.
func (s *Service) RetryDestination(ctx context.Context, destination string) (bool, error) {
	if destination == "" || strings.ContainsAny(destination, " \t\r\n/@") {
		return false, mxerr.InvalidParam("%q is not a server name", destination)
	}
	if s.isLocal(destination) {
		return false, mxerr.InvalidParam("%s is this server", destination)
	}
	return s.db.ResetDestination(ctx, destination, math.MaxInt64)
}
