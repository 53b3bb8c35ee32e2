package userapi

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"

	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/bcrypt"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// Authenticate resolves an access token.
func (s *Service) Authenticate(ctx context.Context, token string) (matrixid.Caller, error) {
	if token == "" {
		return matrixid.Caller{}, mxerr.MissingToken("missing access token")
	}
	u, d, err := s.db.TokenOwner(ctx, hashToken(token))
	if errors.Is(err, storage.ErrNotFound) {
		return matrixid.Caller{}, mxerr.UnknownToken("unknown or expired access token")
	}
	return matrixid.Caller{UserID: u, DeviceID: d}, err
}

// RegisterRequest is POST /register.
type RegisterRequest struct {
	Auth                     *matrixid.AuthData `json:"auth"`
	Username                 *string            `json:"username"`
	Password                 *string            `json:"password"`
	DeviceID                 *string            `json:"device_id"`
	InitialDeviceDisplayName *string            `json:"initial_device_display_name"`
	InhibitLogin             bool               `json:"inhibit_login"`
	Kind                     string             `json:"-"` // ?kind=
	IP                       string             `json:"-"`
}

// LoginResponse is what /register and /login answer.
type LoginResponse struct {
	UserID      string `json:"user_id"`
	AccessToken string `json:"access_token,omitempty"`
	DeviceID    string `json:"device_id,omitempty"`
}

const maxPasswordLength = 512

// Register creates an account. The checks on the username come before the
// auth stage, as the spec requires, so a client learns the name is taken
// before completing any stage.
func (s *Service) Register(ctx context.Context, r RegisterRequest) (LoginResponse, error) {
	if r.Kind != "" && r.Kind != "user" {
		return LoginResponse{}, mxerr.Forbidden("registration of kind %q is not supported", r.Kind)
	}
	if !s.opts.RegistrationOpen {
		return LoginResponse{}, mxerr.Forbidden("registration is disabled")
	}
	localpart := ""
	if r.Username != nil {
		localpart = strings.ToLower(*r.Username)
		if !validLocalpart(localpart) {
			return LoginResponse{}, mxerr.InvalidUsername("user names may contain only a-z, 0-9 and . _ = - / +")
		}
	}
	if r.Password != nil && len(*r.Password) > maxPasswordLength {
		return LoginResponse{}, mxerr.InvalidParam("password is longer than %d bytes", maxPasswordLength)
	}
	if r.DeviceID != nil {
		if err := checkDeviceID(*r.DeviceID); err != nil {
			return LoginResponse{}, err
		}
	}
	if err := checkDisplayName(r.InitialDeviceDisplayName); err != nil {
		return LoginResponse{}, err
	}
	var userID string
	if localpart != "" {
		userID = "@" + localpart + ":" + s.opts.ServerName
		if len(userID) > 255 {
			return LoginResponse{}, mxerr.InvalidUsername("user ID would be longer than 255 bytes")
		}
		exists, err := s.db.AccountExists(ctx, userID)
		if err != nil {
			return LoginResponse{}, err
		}
		if exists {
			return LoginResponse{}, mxerr.UserInUse("user ID %s is already taken", userID)
		}
	}
	// Checked after the challenge, so a client may learn the flows with an
	// empty request, and before the stage, so that a mistake does not use
	// up the session.
	if r.Auth != nil && r.Password == nil {
		return LoginResponse{}, mxerr.MissingParam("password is required")
	}
	// The session is bound to registering, not to the body: the dummy
	// stage vouches for nothing in it, and clients commonly learn the
	// flows with a request that names no user yet.
	kind := r.Kind
	if kind == "" {
		kind = "user"
	}
	req := matrixid.AuthRequest{Method: http.MethodPost, Path: "/register", Params: kind}
	if err := s.userInteractive(ctx, stageDummy, req, r.Auth, func(*matrixid.AuthData) error { return nil }); err != nil {
		return LoginResponse{}, err
	}
	hash, err := s.hashPassword(ctx, *r.Password)
	if err != nil {
		return LoginResponse{}, err
	}
	var login *storage.NewLogin
	var token string
	if !r.InhibitLogin {
		token = newAccessToken()
		login = &storage.NewLogin{
			DeviceID: newDeviceID(), DisplayName: r.InitialDeviceDisplayName,
			TokenHash: hashToken(token), IP: r.IP, TS: s.nowMS(),
		}
		if r.DeviceID != nil {
			login.DeviceID = *r.DeviceID
		}
	}
	for attempt := 0; ; attempt++ {
		generated := localpart == ""
		if generated {
			userID = "@u" + randomString(11, "abcdefghijklmnopqrstuvwxyz0123456789") + ":" + s.opts.ServerName
		}
		if login != nil {
			login.UserID = userID
		}
		res, err := s.db.CreateAccount(ctx, userID, string(hash), login)
		if errors.Is(err, storage.ErrUserExists) {
			if generated && attempt < 3 {
				continue
			}
			return LoginResponse{}, mxerr.UserInUse("user ID %s is already taken", userID)
		}
		if err != nil {
			return LoginResponse{}, err
		}
		s.localChange(res.Change)
		s.logger(ctx).WithField("user_id", userID).Info("account registered")
		out := LoginResponse{UserID: userID}
		if login != nil {
			out.AccessToken, out.DeviceID = token, login.DeviceID
		}
		return out, nil
	}
}

// Available answers GET /register/available.
func (s *Service) Available(ctx context.Context, username string) error {
	localpart := strings.ToLower(username)
	if !validLocalpart(localpart) {
		return mxerr.InvalidUsername("user names may contain only a-z, 0-9 and . _ = - / +")
	}
	if !s.opts.RegistrationOpen {
		return mxerr.Forbidden("registration is disabled")
	}
	exists, err := s.db.AccountExists(ctx, "@"+localpart+":"+s.opts.ServerName)
	if err != nil {
		return err
	}
	if exists {
		return mxerr.UserInUse("user name %s is already taken", localpart)
	}
	return nil
}

// LoginRequest is POST /login.
type LoginRequest struct {
	Type       string `json:"type"`
	Identifier *struct {
		Type string `json:"type"`
		User string `json:"user"`
	} `json:"identifier"`
	User                     string  `json:"user"` // deprecated form of identifier
	Password                 *string `json:"password"`
	DeviceID                 *string `json:"device_id"`
	InitialDeviceDisplayName *string `json:"initial_device_display_name"`
	IP                       string  `json:"-"`
}

// Login checks a password and logs a device in.
func (s *Service) Login(ctx context.Context, r LoginRequest) (LoginResponse, error) {
	if r.Type != "m.login.password" {
		return LoginResponse{}, mxerr.Unknown("login type %q is not supported", r.Type)
	}
	user := r.User
	if r.Identifier != nil {
		if r.Identifier.Type != "m.id.user" {
			return LoginResponse{}, mxerr.Unknown("identifier type %q is not supported", r.Identifier.Type)
		}
		user = r.Identifier.User
	}
	if user == "" {
		return LoginResponse{}, mxerr.MissingParam("identifier.user is required")
	}
	if r.Password == nil {
		return LoginResponse{}, mxerr.MissingParam("password is required")
	}
	if r.DeviceID != nil {
		if err := checkDeviceID(*r.DeviceID); err != nil {
			return LoginResponse{}, err
		}
	}
	if err := checkDisplayName(r.InitialDeviceDisplayName); err != nil {
		return LoginResponse{}, err
	}
	userID, err := s.checkPassword(ctx, user, *r.Password, r.IP)
	if err != nil {
		return LoginResponse{}, err
	}
	token := newAccessToken()
	l := storage.NewLogin{UserID: userID, DeviceID: newDeviceID(), DisplayName: r.InitialDeviceDisplayName,
		TokenHash: hashToken(token), IP: r.IP, TS: s.nowMS()}
	if r.DeviceID != nil {
		l.DeviceID = *r.DeviceID
	}
	res, err := s.db.Login(ctx, l)
	if errors.Is(err, storage.ErrDeactivated) {
		return LoginResponse{}, errDeactivated()
	}
	if err != nil {
		return LoginResponse{}, err
	}
	s.localChange(res.Change)
	return LoginResponse{UserID: userID, AccessToken: token, DeviceID: l.DeviceID}, nil
}

// resolveUser turns what a client names a user by (a localpart of ours or
// a user ID) into a user ID. The localpart of our own users is lower-cased
// in both forms, as Synapse and Dendrite do: every ID this server creates
// is lower case, and clients pass on what the user typed.
func (s *Service) resolveUser(user string) string {
	if !strings.HasPrefix(user, "@") {
		return "@" + strings.ToLower(user) + ":" + s.opts.ServerName
	}
	if localpart, server, ok := strings.Cut(user[1:], ":"); ok && server == s.opts.ServerName {
		return "@" + strings.ToLower(localpart) + ":" + server
	}
	return user
}

// checkPassword resolves a localpart or user ID of ours and checks the
// password. Every failure is the same 403 and takes as long, but for a
// deactivated account (M_USER_DEACTIVATED, as the spec has it) and an
// account with too many recent failures (429, before any check, so that
// guessing on stops). Failures are logged, never the password.
func (s *Service) checkPassword(ctx context.Context, user, password, ip string) (string, error) {
	userID := s.resolveUser(user)
	log := s.logger(ctx).WithFields(logrus.Fields{"user_id": userID, "ip": ip})
	if ok, wait := s.opts.FailedLogins.Peek(userID); !ok {
		log.Info("password refused unchecked: too many failed attempts for the account")
		return "", mxerr.LimitExceeded(wait)
	}
	hash, err := s.db.PasswordHash(ctx, userID)
	known := err == nil
	if err != nil && !errors.Is(err, storage.ErrNotFound) && !errors.Is(err, storage.ErrDeactivated) {
		return "", err
	}
	if !known {
		hash = string(s.dummyHash)
	}
	match, cerr := s.comparePassword(ctx, []byte(hash), password)
	if cerr != nil {
		return "", cerr
	}
	switch {
	case errors.Is(err, storage.ErrDeactivated):
		log.Info("login to a deactivated account refused")
		return "", errDeactivated()
	case !known:
		s.opts.FailedLogins.Allow(userID)
		log.Info("failed login: no such user")
		return "", mxerr.Forbidden("invalid username or password")
	case !match:
		s.opts.FailedLogins.Allow(userID)
		log.Info("failed login: wrong password")
		return "", mxerr.Forbidden("invalid username or password")
	}
	return userID, nil
}

func errDeactivated() *mxerr.Error {
	return mxerr.New(http.StatusForbidden, "M_USER_DEACTIVATED", "this account has been deactivated")
}

// Logout deletes the caller's device (and so its token and keys).
func (s *Service) Logout(ctx context.Context, c matrixid.Caller) error {
	_, ch, err := s.db.DeleteDevices(ctx, c.UserID, []string{c.DeviceID})
	s.localChange(ch)
	return err
}

// LogoutAll deletes every device of the caller.
func (s *Service) LogoutAll(ctx context.Context, c matrixid.Caller) error {
	_, ch, err := s.db.DeleteDevices(ctx, c.UserID, nil)
	s.localChange(ch)
	return err
}

// passwordInput turns a password into bcrypt's input. bcrypt reads at most
// 72 bytes, so longer passwords are first condensed with SHA-256: every
// byte of them then counts.
func passwordInput(password string) []byte {
	if len(password) <= 72 {
		return []byte(password)
	}
	sum := sha256.Sum256([]byte(password))
	return []byte(base64.RawStdEncoding.EncodeToString(sum[:]))
}

func hashPassword(password string, cost int) ([]byte, error) {
	if cost < bcrypt.MinCost {
		cost = bcrypt.DefaultCost
	}
	return bcryptGenerate(passwordInput(password), cost)
}

func comparePassword(hash []byte, password string) error {
	return bcryptCompare(hash, passwordInput(password))
}
