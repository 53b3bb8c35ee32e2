package keyserver

import (
	"context"
	"errors"
	"unicode/utf8"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

const maxDisplayNameLength = 100 // characters

func checkDisplayName(name *string) error {
	if name != nil && utf8.RuneCountInString(*name) > maxDisplayNameLength {
		return mxerr.InvalidParam("device display names are at most %d characters", maxDisplayNameLength)
	}
	return nil
}

// DeviceInfo is a device as GET /devices shows it.
type DeviceInfo struct {
	DeviceID    string  `json:"device_id"`
	DisplayName *string `json:"display_name,omitempty"`
	LastSeenIP  string  `json:"last_seen_ip,omitempty"`
	LastSeenTS  int64   `json:"last_seen_ts,omitempty"`
}

func deviceInfo(d storage.Device) DeviceInfo {
	return DeviceInfo{DeviceID: d.DeviceID, DisplayName: d.DisplayName, LastSeenIP: d.LastSeenIP, LastSeenTS: d.LastSeenTS}
}

// Devices lists the caller's devices.
func (s *Service) Devices(ctx context.Context, c Caller) ([]DeviceInfo, error) {
	ds, err := s.db.Devices(ctx, c.UserID)
	if err != nil {
		return nil, err
	}
	out := make([]DeviceInfo, 0, len(ds))
	for _, d := range ds {
		out = append(out, deviceInfo(d))
	}
	return out, nil
}

// Device returns one of the caller's devices.
func (s *Service) Device(ctx context.Context, c Caller, deviceID string) (DeviceInfo, error) {
	d, err := s.db.Device(ctx, c.UserID, deviceID)
	if errors.Is(err, storage.ErrNotFound) {
		return DeviceInfo{}, mxerr.NotFound("unknown device")
	}
	return deviceInfo(d), err
}

// RenameDevice sets a device's display name; nil leaves it as it is.
func (s *Service) RenameDevice(ctx context.Context, c Caller, deviceID string, name *string) error {
	if err := checkDisplayName(name); err != nil {
		return err
	}
	if name == nil {
		_, err := s.Device(ctx, c, deviceID)
		return err
	}
	pos, err := s.db.SetDeviceDisplayName(ctx, c.UserID, deviceID, *name)
	if errors.Is(err, storage.ErrNotFound) {
		return mxerr.NotFound("unknown device")
	}
	s.localChange(pos)
	return err
}

// DeleteDevices deletes devices of the caller after a password stage of
// user-interactive auth. Devices that do not exist are ignored.
func (s *Service) DeleteDevices(ctx context.Context, c Caller, deviceIDs []string, auth *AuthData) error {
	if err := s.passwordStage(ctx, c, auth); err != nil {
		return err
	}
	_, pos, err := s.db.DeleteDevices(ctx, c.UserID, deviceIDs)
	s.localChange(pos)
	return err
}

// passwordStage runs the m.login.password stage for the caller: without
// auth it answers the challenge; auth naming another user is forbidden; a
// wrong password repeats the challenge with the error.
func (s *Service) passwordStage(ctx context.Context, c Caller, auth *AuthData) error {
	const stage = "m.login.password"
	if auth == nil {
		return challenge(stage, "", nil)
	}
	if auth.Type != stage {
		return challenge(stage, auth.Session, mxerr.Forbidden("auth type %q is not offered; use %s", auth.Type, stage))
	}
	user := auth.User
	if auth.Identifier != nil {
		if auth.Identifier.Type != "m.id.user" {
			return challenge(stage, auth.Session, mxerr.Forbidden("identifier type %q is not supported", auth.Identifier.Type))
		}
		user = auth.Identifier.User
	}
	if user == "" {
		user = c.UserID
	}
	userID := s.resolveUser(user)
	if userID != c.UserID {
		return mxerr.Forbidden("auth is for another user than the access token's")
	}
	if _, err := s.checkPassword(ctx, userID, auth.Password); err != nil {
		var me *mxerr.Error
		if errors.As(err, &me) {
			return challenge(stage, auth.Session, me)
		}
		return err
	}
	return nil
}
