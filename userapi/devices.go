package userapi

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"unicode/utf8"

	"github.com/keyserver/keyserver/internal/matrixid"
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
func (s *Service) Devices(ctx context.Context, c matrixid.Caller) ([]DeviceInfo, error) {
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
func (s *Service) Device(ctx context.Context, c matrixid.Caller, deviceID string) (DeviceInfo, error) {
	d, err := s.db.Device(ctx, c.UserID, deviceID)
	if errors.Is(err, storage.ErrNotFound) {
		return DeviceInfo{}, mxerr.NotFound("unknown device")
	}
	return deviceInfo(d), err
}

// RenameDevice sets a device's display name; nil leaves it as it is.
func (s *Service) RenameDevice(ctx context.Context, c matrixid.Caller, deviceID string, name *string) error {
	if err := checkDisplayName(name); err != nil {
		return err
	}
	if name == nil {
		_, err := s.Device(ctx, c, deviceID)
		return err
	}
	ch, err := s.db.SetDeviceDisplayName(ctx, c.UserID, deviceID, *name)
	if errors.Is(err, storage.ErrNotFound) {
		return mxerr.NotFound("unknown device")
	}
	s.localChange(ch)
	return err
}

// DeleteDevice deletes one device of the caller (DELETE /devices/{id})
// after a password stage of user-interactive auth. A device that does not
// exist is ignored.
func (s *Service) DeleteDevice(ctx context.Context, c matrixid.Caller, deviceID string, auth *matrixid.AuthData) error {
	req := matrixid.AuthRequest{UserID: c.UserID, Method: http.MethodDelete, Path: "/devices/" + deviceID}
	return s.deleteDevices(ctx, c, []string{deviceID}, req, auth)
}

// DeleteDevices deletes devices of the caller (POST /delete_devices) after
// a password stage of user-interactive auth. Devices that do not exist are
// ignored.
func (s *Service) DeleteDevices(ctx context.Context, c matrixid.Caller, deviceIDs []string, auth *matrixid.AuthData) error {
	// The session is bound to the set of devices, in any order.
	set := slices.Clone(deviceIDs)
	slices.Sort(set)
	req := matrixid.AuthRequest{UserID: c.UserID, Method: http.MethodPost, Path: "/delete_devices", Params: slices.Compact(set)}
	return s.deleteDevices(ctx, c, deviceIDs, req, auth)
}

func (s *Service) deleteDevices(ctx context.Context, c matrixid.Caller, deviceIDs []string, req matrixid.AuthRequest, auth *matrixid.AuthData) error {
	if err := s.userInteractive(ctx, stagePassword, req, auth, s.passwordStage(ctx, c)); err != nil {
		return err
	}
	_, ch, err := s.db.DeleteDevices(ctx, c.UserID, deviceIDs)
	s.localChange(ch)
	return err
}
