package roomserver

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/mxerr"
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

// remoteFailure is how another server's failure reaches a client: its
// "not found" as 404 M_NOT_FOUND, a timeout as 504, anything else (down,
// backing off, 5xx, a refusal, an answer that makes no sense) as 502,
// each with a fixed message; the error itself, which may name addresses
// and ports, goes to the log only.
func (s *Service) remoteFailure(server string, err error, notFound string) error {
	var status statusError
	if errors.As(err, &status) && status.StatusCode() == http.StatusNotFound {
		return mxerr.NotFound("%s", notFound)
	}
	s.opts.Logger.WithFields(logrus.Fields{"server": server, "error": err.Error()}).Debug("remote server failed")
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return mxerr.New(http.StatusGatewayTimeout, "M_UNKNOWN", "%s did not answer in time", server)
	}
	if status != nil {
		return mxerr.New(http.StatusBadGateway, "M_UNKNOWN", "%s answered with an error", server)
	}
	return mxerr.New(http.StatusBadGateway, "M_UNKNOWN", "%s could not be reached", server)
}
