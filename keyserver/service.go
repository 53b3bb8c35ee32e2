// Package keyserver is the domain of the server: accounts and devices, the
// upload, query and claim of end-to-end keys, and the device-list stream
// that tells clients whose keys to fetch again. It speaks in Go values and
// *mxerr.Error; the HTTP packages only decode requests and encode answers.
package keyserver

import (
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/storage"
)

// Options are the settings the domain needs.
type Options struct {
	ServerName       string
	RegistrationOpen bool
	BcryptCost       int
	MaxOneTimeKeys   int           // unclaimed one-time keys a device may hold
	SyncMaxTimeout   time.Duration // cap on a /sync long-poll
	// Federation reaches other servers; nil answers remote users with a
	// failure.
	Federation Federation
	// UntrackedCacheTTL is how long a remote device list is trusted when
	// no local user shares a room with its user (so no updates arrive).
	UntrackedCacheTTL time.Duration
	// DeviceNamesOverFederation shows device display names to other servers.
	DeviceNamesOverFederation bool
	Logger                    logrus.FieldLogger
	Now                       func() time.Time // the clock; time.Now when nil
}

// Service is the keyserver's domain layer.
type Service struct {
	db       storage.Database
	fed      Federation
	opts     Options
	notifier *Notifier
	log      logrus.FieldLogger
	now      func() time.Time
	// dummyHash is compared against when a login names an unknown user, so
	// that answering takes as long as for a wrong password.
	dummyHash []byte
}

// New makes a Service.
func New(db storage.Database, opts Options) *Service {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = logrus.StandardLogger()
	}
	if opts.MaxOneTimeKeys <= 0 {
		opts.MaxOneTimeKeys = 500
	}
	if opts.SyncMaxTimeout <= 0 {
		opts.SyncMaxTimeout = time.Minute
	}
	if opts.UntrackedCacheTTL <= 0 {
		opts.UntrackedCacheTTL = time.Minute
	}
	s := &Service{db: db, fed: opts.Federation, opts: opts, notifier: NewNotifier(), log: opts.Logger, now: opts.Now}
	s.dummyHash, _ = hashPassword("not a password", opts.BcryptCost)
	return s
}

// ServerName is the server's name.
func (s *Service) ServerName() string { return s.opts.ServerName }

// Close releases waiting requests, for shutdown.
func (s *Service) Close() { s.notifier.Close() }

// WaitingSyncs counts the users with a /sync request waiting for news.
func (s *Service) WaitingSyncs() int { return s.notifier.waiting() }

// streamAdvanced tells waiters about a committed change at pos (0: none).
func (s *Service) streamAdvanced(pos storage.StreamPos) {
	if pos > 0 {
		s.notifier.StreamAdvanced()
	}
}

func (s *Service) nowMS() int64 { return s.now().UnixMilli() }

// isLocal reports whether a user ID belongs to this server.
func (s *Service) isLocal(server string) bool { return server == s.opts.ServerName }
