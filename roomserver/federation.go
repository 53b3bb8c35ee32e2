package roomserver

import (
	"context"
	"time"

	"github.com/keyserver/keyserver/internal/remotefail"
)

// AliasDirectory resolves aliases of other servers (package fedclient).
type AliasDirectory interface {
	// LookupRoomAlias asks dest which room its alias names, and which
	// servers are in it (/query/directory).
	LookupRoomAlias(ctx context.Context, dest, alias string) (roomID string, servers []string, err error)
}

// defaultRemoteTimeout bounds a request to another server made while a
// client waits.
const defaultRemoteTimeout = 10 * time.Second

// remoteFailure is how another server's failure reaches a client (see
// remotefail.ForClient).
func (s *Service) remoteFailure(server string, err error, notFound string) error {
	return remotefail.ForClient(s.opts.Logger, server, err, notFound)
}
