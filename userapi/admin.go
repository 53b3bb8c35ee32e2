package userapi

import (
	"context"
	"errors"
	"strings"

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
