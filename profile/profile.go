// Package profile is users' public profiles: a display name and an avatar
// URL (GET and PUT /profile/{userId}...), served to other servers
// (/query/profile), asked of theirs for their users, and carried in each
// user's member events: a change is written into every room the user is
// joined to.
package profile

import (
	"context"
	"errors"
	"time"
	"unicode/utf8"

	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/remotefail"
	"github.com/keyserver/keyserver/storage"
)

// Store keeps local users' profiles (package sqlstore).
type Store interface {
	storage.Profiles
}

// Remote asks another server for a user's profile (fedclient.Client).
type Remote interface {
	QueryProfile(ctx context.Context, dest, userID string) (storage.Profile, error)
}

// Rooms writes a changed profile into the user's member events
// (roomserver.Service).
type Rooms interface {
	ProfileChanged(ctx context.Context, userID string, p storage.Profile) error
}

// Fields and their limits (Synapse's).
const (
	DisplayName = "displayname"
	AvatarURL   = "avatar_url"
	// MaxDisplayName and MaxAvatarURL bound a field's length in
	// characters.
	MaxDisplayName = 256
	MaxAvatarURL   = 1000
	// remoteTimeout bounds a query to another server.
	remoteTimeout = 10 * time.Second
)

// LocalProfiles reads the profiles of this server's users. It needs no
// rooms: the rooms, which carry profiles in their member events, are
// built with it, and the Service that writes profiles into rooms after.
type LocalProfiles struct {
	db         Store
	serverName string
}

// NewLocal makes a LocalProfiles.
func NewLocal(db Store, serverName string) LocalProfiles {
	return LocalProfiles{db: db, serverName: serverName}
}

// Service serves profiles.
type Service struct {
	LocalProfiles
	remote Remote // nil: other servers' users have no profile here
	rooms  Rooms  // nil: member events are not updated
	log    logrus.FieldLogger
}

// New makes a Service; remote and rooms may be nil.
func New(db Store, serverName string, remote Remote, rooms Rooms, log logrus.FieldLogger) *Service {
	if log == nil {
		log = logrus.StandardLogger()
	}
	return &Service{LocalProfiles: NewLocal(db, serverName), remote: remote, rooms: rooms, log: log}
}

// Get returns a user's profile, asking their server for one of another.
func (s *Service) Get(ctx context.Context, userID string) (storage.Profile, error) {
	if _, err := spec.NewUserID(userID, true); err != nil {
		return storage.Profile{}, mxerr.InvalidParam("%q is not a user ID", userID)
	}
	server := matrixid.Server(userID)
	if server == s.serverName {
		return s.Local(ctx, userID)
	}
	if s.remote == nil {
		return storage.Profile{}, mxerr.NotFound("no profile for %s", userID)
	}
	ctx, cancel := context.WithTimeout(ctx, remoteTimeout)
	defer cancel()
	p, err := s.remote.QueryProfile(ctx, server, userID)
	if err != nil {
		return storage.Profile{}, remotefail.ForClient(s.log, server, err, "no profile for "+userID)
	}
	return p, nil
}

// Local returns the profile of a user of this server: 400 for a string
// that is not a user ID (a server part that is no server name included),
// 404 for one who has no account (or of another server).
func (s LocalProfiles) Local(ctx context.Context, userID string) (storage.Profile, error) {
	if _, err := spec.NewUserID(userID, true); err != nil {
		return storage.Profile{}, mxerr.InvalidParam("%q is not a user ID", userID)
	}
	if matrixid.Server(userID) != s.serverName {
		return storage.Profile{}, mxerr.NotFound("no profile for %s", userID)
	}
	p, err := s.db.Profile(ctx, userID)
	if errors.Is(err, storage.ErrNotFound) {
		return storage.Profile{}, mxerr.NotFound("no profile for %s", userID)
	}
	return p, err
}

// Set sets (value non-nil) or removes one field of the caller's profile,
// then writes the new profile into the member events of every room they
// are joined to; a room that refuses is logged and left as it was.
func (s *Service) Set(ctx context.Context, callerID, userID, field string, value *string) error {
	if userID != callerID {
		return mxerr.Forbidden("cannot change the profile of another user")
	}
	limit := map[string]int{DisplayName: MaxDisplayName, AvatarURL: MaxAvatarURL}[field]
	if limit == 0 {
		return mxerr.InvalidParam("unknown profile field %q", field)
	}
	if value != nil && utf8.RuneCountInString(*value) > limit {
		return mxerr.InvalidParam("%s is longer than %d characters", field, limit)
	}
	if matrixid.Server(userID) != s.serverName {
		return mxerr.NotFound("no profile for %s", userID)
	}
	v := ""
	if value != nil {
		v = *value
	}
	p, err := s.db.SetProfileField(ctx, userID, field, v)
	if errors.Is(err, storage.ErrNotFound) {
		return mxerr.NotFound("no profile for %s", userID)
	} else if err != nil {
		return err
	}
	if s.rooms != nil {
		if err := s.rooms.ProfileChanged(ctx, userID, p); err != nil {
			s.log.WithFields(logrus.Fields{"user_id": userID, "error": err.Error()}).Warn("profile not written into every room")
		}
	}
	return nil
}
