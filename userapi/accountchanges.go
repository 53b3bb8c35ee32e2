package userapi

import (
	"context"
	"errors"
	"net/http"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// ChangePasswordRequest is POST /account/password.
type ChangePasswordRequest struct {
	NewPassword *string `json:"new_password"`
	// LogoutDevices logs out every other device of the user (default true).
	LogoutDevices *bool              `json:"logout_devices"`
	Auth          *matrixid.AuthData `json:"auth"`
}

// ChangePassword sets the caller's password after a password stage of
// user-interactive auth with the old one. Unless asked not to, every other
// device is logged out, with its keys, which other servers and clients
// learn as device-list changes; the caller's own device stays.
func (s *Service) ChangePassword(ctx context.Context, c matrixid.Caller, r ChangePasswordRequest) error {
	if r.NewPassword != nil && len(*r.NewPassword) > maxPasswordLength {
		return mxerr.InvalidParam("password is longer than %d bytes", maxPasswordLength)
	}
	// As for /register: a client may learn the flow with an empty request,
	// and a mistake does not use up the session.
	if r.Auth != nil && r.NewPassword == nil {
		return mxerr.MissingParam("new_password is required")
	}
	logout := r.LogoutDevices == nil || *r.LogoutDevices
	var newPassword string
	if r.NewPassword != nil {
		newPassword = *r.NewPassword
	}
	req := matrixid.AuthRequest{UserID: c.UserID, Method: http.MethodPost, Path: "/account/password", Params: struct {
		NewPassword   string `json:"new_password"`
		LogoutDevices bool   `json:"logout_devices"`
	}{newPassword, logout}}
	if err := s.userInteractive(ctx, stagePassword, req, r.Auth, s.passwordStage(ctx, c)); err != nil {
		return err
	}
	hash, err := s.hashPassword(ctx, newPassword)
	if err != nil {
		return err
	}
	ch, err := s.db.ChangePassword(ctx, c.UserID, string(hash), c.DeviceID, logout)
	if errors.Is(err, storage.ErrNotFound) {
		return mxerr.Forbidden("the account has been deactivated")
	}
	if err != nil {
		return err
	}
	s.localChange(ch)
	s.logger(ctx).WithField("user_id", c.UserID).WithField("logout_devices", logout).Info("password changed")
	return nil
}

// DeactivateRequest is POST /account/deactivate.
type DeactivateRequest struct {
	Auth *matrixid.AuthData `json:"auth"`
	// Erase asks that what the user sent be forgotten; everything of the
	// user is deleted in any case.
	Erase bool `json:"erase"`
}

// Deactivate closes the caller's account after a password stage of
// user-interactive auth: every device with its tokens and keys is deleted
// (and other servers told, as for DELETE /devices), the account stays as a
// deactivated row so that login is refused and the user ID is never
// registered again, and then the user leaves every room, as Synapse parts
// deactivated users.
func (s *Service) Deactivate(ctx context.Context, c matrixid.Caller, r DeactivateRequest) error {
	req := matrixid.AuthRequest{UserID: c.UserID, Method: http.MethodPost, Path: "/account/deactivate", Params: struct {
		Erase bool `json:"erase"`
	}{r.Erase}}
	if err := s.userInteractive(ctx, stagePassword, req, r.Auth, s.passwordStage(ctx, c)); err != nil {
		return err
	}
	ch, err := s.db.DeactivateAccount(ctx, c.UserID, s.nowMS())
	if errors.Is(err, storage.ErrNotFound) {
		return mxerr.Forbidden("the account has been deactivated")
	}
	if err != nil {
		return err
	}
	// The deletions are queued for the servers sharing a room with the
	// user now; only then does the user leave the rooms.
	s.localChange(ch)
	log := s.logger(ctx).WithField("user_id", c.UserID)
	log.Info("account deactivated")
	rooms, err := s.db.JoinedRooms(ctx, c.UserID)
	if err != nil {
		// The account is closed already; the memberships only decide
		// where the user's (now empty) device list is sent.
		log.WithError(err).Warn("cannot list the rooms of a deactivated user")
		return nil
	}
	for _, room := range rooms {
		if err := s.leave(ctx, room, c.UserID); err != nil {
			log.WithError(err).WithField("room_id", room).Warn("a deactivated user could not leave a room")
		}
	}
	return nil
}

// leave records that a deactivated user left a room: the device lists of
// the users sharing it change.
func (s *Service) leave(ctx context.Context, roomID, userID string) error {
	res, err := s.db.SetMembership(ctx, roomID, userID, storage.MembershipLeave, s.nowMS())
	if err != nil {
		return err
	}
	if s.changes != nil {
		s.changes.MembershipChanged(res.Change, res.NewlyStale)
	}
	return nil
}
