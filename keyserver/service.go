// Package keyserver is the keys domain of the server: the upload, query
// and claim of end-to-end keys, the cross-signing use cases, and the
// device-list stream that tells clients whose keys to fetch again
// (accounts and devices are package userapi's). It speaks in Go values and
// *mxerr.Error; the HTTP packages only decode requests and encode answers.
package keyserver

import (
	"context"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/reqlog"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/syncnotify"
)

// Options are the settings the domain needs.
type Options struct {
	ServerName     string
	MaxOneTimeKeys int // unclaimed one-time keys a device may hold
	// Federation reaches other servers; nil answers remote users with a
	// failure and sends nothing.
	Federation Federation
	// Outbound is the federation outbound queue, poked when updates are
	// queued for other servers; nil: none (nothing is sent).
	Outbound Outbound
	// RemoteLists gives other servers' users' device lists; nil: remote
	// users are answered with a failure.
	RemoteLists RemoteLists
	// StaleLists is the updater of remote device lists, woken when users
	// are marked stale; nil: none.
	StaleLists StaleLists
	// Notifier wakes the waiting /sync requests a change concerns; nil:
	// one of the service's own. The server shares one with the domains
	// that write the stream and with package syncapi.
	Notifier *syncnotify.Notifier
	// Passwords asks callers for their password before a change of
	// cross-signing keys; nil: such a change is refused.
	Passwords PasswordConfirmer
	// DeviceNamesOverFederation shows device display names to other servers.
	DeviceNamesOverFederation bool
	Logger                    logrus.FieldLogger
	Now                       func() time.Time // the clock; time.Now when nil

	// LaxKeyValidation checks only the shape of uploaded keys, not their
	// signatures or key values (keys.strict_validation: false); the zero
	// value is the strict default.
	LaxKeyValidation bool
}

// Outbound is the federation outbound queue as the domain tells it of
// new work (package federationsender).
type Outbound interface{ Poke() }

// StaleLists is the updater of stale remote device lists as the domain
// tells it of new work (package devicelist).
type StaleLists interface{ Wake() }

// PasswordConfirmer runs the password stage of user-interactive auth for
// a request of the caller's (package userapi).
type PasswordConfirmer interface {
	ConfirmPassword(ctx context.Context, c matrixid.Caller, req matrixid.AuthRequest, auth *matrixid.AuthData) error
}

// Service is the keyserver's domain layer.
type Service struct {
	db       Store
	fed      Federation
	sender   Outbound   // nil: nothing is sent
	updater  StaleLists // nil: no background resyncs
	opts     Options
	notifier *syncnotify.Notifier
	log      logrus.FieldLogger
	now      func() time.Time
}

// Store is what the keys domain uses of the database: the storage areas
// of keys, devices, cross-signing, the stream of changes and the
// memberships that decide who shares a room, and the cache of remote
// device lists with its stale queue.
type Store interface {
	storage.Keys
	storage.Devices
	storage.CrossSigningKeys
	storage.Stream
	storage.Memberships
	storage.RemoteDeviceLists
	storage.StaleQueue
	// AccountExists answers other servers asking for a user's devices.
	AccountExists(ctx context.Context, userID string) (bool, error)
	// The admin commands' view of the outbound queue.
	OutboundQueue(ctx context.Context) (map[string]int, error)
	OutboundDestinations(ctx context.Context) ([]storage.OutboundDestination, error)
	ResetDestination(ctx context.Context, destination string, heardAt int64) (bool, error)
}

// New makes a Service.
func New(db Store, opts Options) *Service {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = logrus.StandardLogger()
	}
	if opts.MaxOneTimeKeys <= 0 {
		opts.MaxOneTimeKeys = 500
	}
	s := &Service{db: db, fed: opts.Federation, opts: opts, notifier: opts.Notifier, log: opts.Logger, now: opts.Now,
		sender: opts.Outbound, updater: opts.StaleLists}
	if s.notifier == nil {
		s.notifier = syncnotify.New()
	}
	return s
}

// logger is the logger of the request ctx belongs to (with its request
// ID), or the service's.
func (s *Service) logger(ctx context.Context) logrus.FieldLogger { return reqlog.From(ctx, s.log) }

// ServerName is the server's name.
func (s *Service) ServerName() string { return s.opts.ServerName }

// localChange follows a committed change of a local user's device list:
// the waiters it concerns are told, and the updates queued for other
// servers are sent.
func (s *Service) localChange(ch storage.Change) {
	s.streamAdvanced(ch)
	if ch.Pos > 0 && s.sender != nil {
		s.sender.Poke()
	}
}

// streamAdvanced tells the waiters a committed change concerns about it
// (Pos 0: nothing changed).
func (s *Service) streamAdvanced(ch storage.Change) {
	if ch.Pos > 0 {
		s.notifier.StreamAdvanced(ch.Users)
	}
}

func (s *Service) nowMS() int64 { return s.now().UnixMilli() }

// isLocal reports whether a user ID belongs to this server.
func (s *Service) isLocal(server string) bool { return server == s.opts.ServerName }

// confirmPassword asks the caller for their password before req goes
// ahead.
func (s *Service) confirmPassword(ctx context.Context, c matrixid.Caller, req matrixid.AuthRequest, auth *matrixid.AuthData) error {
	if s.opts.Passwords == nil {
		return mxerr.Forbidden("this server cannot ask for your password")
	}
	return s.opts.Passwords.ConfirmPassword(ctx, c, req, auth)
}
