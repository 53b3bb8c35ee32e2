package keyserver

import (
	"context"
	"errors"
	"math"
	"strings"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// What an operator does from the command line (keyserver admin ...).

// CreateUser creates an account with a password, whatever the
// registration setting.
func (s *Service) CreateUser(ctx context.Context, localpart, password string) (string, error) {
	localpart = strings.ToLower(localpart)
	if !validLocalpart(localpart) {
		return "", mxerr.InvalidUsername("user names may contain only a-z, 0-9 and . _ = - / +")
	}
	if password == "" || len(password) > maxPasswordLength {
		return "", mxerr.InvalidParam("the password must be 1 to %d bytes", maxPasswordLength)
	}
	userID := "@" + localpart + ":" + s.opts.ServerName
	hash, err := hashPassword(password, s.opts.BcryptCost)
	if err != nil {
		return "", err
	}
	if _, err := s.db.CreateAccount(ctx, userID, string(hash), nil); errors.Is(err, storage.ErrUserExists) {
		return "", mxerr.UserInUse("%s already exists", userID)
	} else if err != nil {
		return "", err
	}
	return userID, nil
}

// UserDevice is a device as the admin listing shows it.
type UserDevice struct {
	DeviceInfo
	HasKeys bool
}

// UserDevices lists a local user's devices.
func (s *Service) UserDevices(ctx context.Context, userID string) ([]UserDevice, error) {
	if exists, err := s.db.AccountExists(ctx, userID); err != nil {
		return nil, err
	} else if !exists {
		return nil, mxerr.NotFound("no such user: %s", userID)
	}
	ds, err := s.db.Devices(ctx, userID)
	if err != nil {
		return nil, err
	}
	out := make([]UserDevice, 0, len(ds))
	for _, d := range ds {
		out = append(out, UserDevice{DeviceInfo: deviceInfo(d), HasKeys: d.KeyJSON != nil})
	}
	return out, nil
}

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
