package roomserver

import (
	"context"
	"errors"
	"net/http"

	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// Profiles gives the profiles of this server's users (profile.LocalProfiles),
// which their join and invite events carry.
type Profiles interface {
	Local(ctx context.Context, userID string) (storage.Profile, error)
}

// withProfile adds a local user's display name and avatar to the content
// of their member event; a user of another server, or one without a
// profile, gets none.
func (s *Service) withProfile(ctx context.Context, userID string, content map[string]any) (map[string]any, error) {
	if s.profiles == nil || !s.isLocalUser(userID) {
		return content, nil
	}
	p, err := s.profiles.Local(ctx, userID)
	var mx *mxerr.Error
	if errors.As(err, &mx) && mx.Status == http.StatusNotFound {
		return content, nil // no account (a user the admin endpoint named)
	} else if err != nil {
		return nil, err
	}
	// A name or avatar the request gave (a per-room one) is kept.
	if _, given := content["displayname"]; !given && p.DisplayName != "" {
		content["displayname"] = p.DisplayName
	}
	if _, given := content["avatar_url"]; !given && p.AvatarURL != "" {
		content["avatar_url"] = p.AvatarURL
	}
	return content, nil
}

// ProfileChanged writes a user's new profile into their member event in
// every room they are joined to (a join that follows a join). It goes on
// past a room that refuses, and returns the first error.
func (s *Service) ProfileChanged(ctx context.Context, userID string, p storage.Profile) error {
	rooms, err := s.JoinedRooms(ctx, userID)
	if err != nil {
		return err
	}
	var first error
	for _, roomID := range rooms {
		content := map[string]any{"membership": spec.Join}
		if p.DisplayName != "" {
			content["displayname"] = p.DisplayName
		}
		if p.AvatarURL != "" {
			content["avatar_url"] = p.AvatarURL
		}
		if _, err := s.send(ctx, roomID, userID, spec.MRoomMember, &userID, content, nil); err != nil && first == nil {
			first = err
		}
	}
	return first
}
