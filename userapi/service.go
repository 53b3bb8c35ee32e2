// Package userapi is accounts and their devices: registration and login,
// access tokens, user-interactive auth, passwords, device names and
// deletion, and deactivation. Device changes are reported (Changes) so
// that the keys domain's stream and the servers sharing rooms with the
// user learn of them; the keys domain asks for passwords through
// ConfirmPassword.
package userapi

import (
	"context"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/ratelimit"
	"github.com/keyserver/keyserver/internal/reqlog"
	"github.com/keyserver/keyserver/storage"
)

// Options are the settings of accounts.
type Options struct {
	ServerName       string
	RegistrationOpen bool
	BcryptCost       int
	// FailedLogins limits wrong passwords per account; nil: no limit.
	FailedLogins *ratelimit.Limiter
	// BcryptConcurrency bounds the password hashes computed at once
	// (default half of GOMAXPROCS, at least 1).
	BcryptConcurrency int
	// UIASessionLifetime is how long a user-interactive auth session may
	// be completed after it started (default 30 minutes).
	UIASessionLifetime time.Duration
	// Changes is told of committed changes of device lists and
	// memberships; nil: nobody is.
	Changes Changes
	Logger  logrus.FieldLogger
	Now     func() time.Time // the clock; time.Now when nil
}

// Changes hears of the committed changes of accounts that others follow
// (the server's change fan-out): new and deleted devices, and the rooms a
// deactivated user left.
type Changes interface {
	DeviceListChanged(ch storage.Change)
	MembershipChanged(ch storage.Change, newlyStale []storage.StaleUser)
}

// Service serves accounts and devices.
type Service struct {
	db        Store
	opts      Options
	changes   Changes
	log       logrus.FieldLogger
	now       func() time.Time
	passwords *passwordPool
	// dummyHash is compared against when a login names an unknown user, so
	// that answering takes as long as for a wrong password.
	dummyHash []byte
}

// Store is what accounts use of the database: accounts and their
// tokens, user-interactive auth sessions, devices, and the memberships a
// deactivated user leaves; and whether the database answers (readiness).
type Store interface {
	storage.Accounts
	storage.UIASessions
	storage.Devices
	storage.Memberships
	Ping(ctx context.Context) error
}

// New makes a Service.
func New(db Store, opts Options) *Service {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = logrus.StandardLogger()
	}
	if opts.UIASessionLifetime <= 0 {
		opts.UIASessionLifetime = 30 * time.Minute
	}
	s := &Service{db: db, opts: opts, changes: opts.Changes, log: opts.Logger, now: opts.Now,
		passwords: newPasswordPool(opts.BcryptConcurrency)}
	s.dummyHash, _ = hashPassword("not a password", opts.BcryptCost)
	return s
}

// Ready reports whether the server can serve: its database answers.
func (s *Service) Ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return s.db.Ping(ctx)
}

// logger is the logger of the request ctx belongs to (with its request
// ID), or the service's.
func (s *Service) logger(ctx context.Context) logrus.FieldLogger { return reqlog.From(ctx, s.log) }

func (s *Service) nowMS() int64 { return s.now().UnixMilli() }

// localChange passes on a committed change of a local user's device list.
func (s *Service) localChange(ch storage.Change) {
	if s.changes != nil {
		s.changes.DeviceListChanged(ch)
	}
}
