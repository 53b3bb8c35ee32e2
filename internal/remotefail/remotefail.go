// Package remotefail turns another server's failure, met while a client
// waits, into the client's error.
package remotefail

import (
	"context"
	"errors"
	"net"
	"net/http"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/mxerr"
)

// StatusError is a remote server's error answer (fedclient.HTTPError).
type StatusError interface {
	error
	StatusCode() int
	ErrCode() string
	ErrMessage() string
}

// ForClient is how another server's failure reaches a client: its "not
// found" as 404 M_NOT_FOUND with the message notFound, a timeout as 504,
// anything else (down, backing off, 5xx, a refusal, an answer that makes
// no sense) as 502, each with a fixed message; the error itself, which may
// name addresses and ports, goes to the log only (debug).
func ForClient(log logrus.FieldLogger, server string, err error, notFound string) error {
	var status StatusError
	if errors.As(err, &status) && status.StatusCode() == http.StatusNotFound {
		return mxerr.NotFound("%s", notFound)
	}
	log.WithFields(logrus.Fields{"server": server, "error": err.Error()}).Debug("remote server failed")
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return mxerr.New(http.StatusGatewayTimeout, "M_UNKNOWN", "%s did not answer in time", server)
	}
	if status != nil {
		return mxerr.New(http.StatusBadGateway, "M_UNKNOWN", "%s answered with an error", server)
	}
	return mxerr.New(http.StatusBadGateway, "M_UNKNOWN", "%s could not be reached", server)
}
