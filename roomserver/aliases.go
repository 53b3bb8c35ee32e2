package roomserver

import (
	"context"
	"errors"
	"strings"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// Room aliases of this server. Aliases of other servers are resolved over
// federation (/query/directory), to come.

// checkAlias checks an alias' syntax and returns its server.
func checkAlias(alias string) (string, error) {
	local, server, ok := strings.Cut(alias, ":")
	if !strings.HasPrefix(local, "#") || len(local) < 2 || !ok || server == "" || len(alias) > 255 {
		return "", mxerr.InvalidParam("%q is not a valid room alias", alias)
	}
	return server, nil
}

// resolveAliasServers resolves an alias to its room and the servers to
// join it through.
func (s *Service) resolveAliasServers(ctx context.Context, alias string) (string, []string, error) {
	roomID, err := s.resolveAlias(ctx, alias)
	return roomID, nil, err
}

func (s *Service) resolveAlias(ctx context.Context, alias string) (string, error) {
	server, err := checkAlias(alias)
	if err != nil {
		return "", err
	}
	if server != s.opts.ServerName {
		return "", mxerr.NotFound("aliases of other servers cannot be resolved yet")
	}
	a, err := s.db.RoomAlias(ctx, alias)
	if errors.Is(err, storage.ErrNotFound) {
		return "", mxerr.NotFound("unknown room alias %s", alias)
	}
	return a.RoomID, err
}

// AliasResponse answers GET /directory/room/{roomAlias}.
type AliasResponse struct {
	RoomID  string   `json:"room_id"`
	Servers []string `json:"servers"`
}

// ResolveAlias returns the room an alias names.
func (s *Service) ResolveAlias(ctx context.Context, alias string) (AliasResponse, error) {
	roomID, err := s.resolveAlias(ctx, alias)
	if err != nil {
		return AliasResponse{}, err
	}
	return AliasResponse{RoomID: roomID, Servers: []string{s.opts.ServerName}}, nil
}

// PutAlias creates an alias of a room on this server.
func (s *Service) PutAlias(ctx context.Context, userID, alias, roomID string) error {
	server, err := checkAlias(alias)
	if err != nil {
		return err
	}
	if server != s.opts.ServerName {
		return mxerr.InvalidParam("aliases of other servers cannot be created here")
	}
	if roomID == "" {
		return mxerr.BadJSON("room_id is required")
	}
	if _, err := s.db.Room(ctx, roomID); errors.Is(err, storage.ErrNotFound) {
		return errNoRoom(roomID)
	} else if err != nil {
		return err
	}
	err = s.db.PutRoomAlias(ctx, storage.RoomAlias{Alias: alias, RoomID: roomID, Creator: userID})
	if errors.Is(err, storage.ErrExists) {
		return mxerr.New(409, "M_UNKNOWN", "the alias %s exists", alias)
	}
	return err
}

// DeleteAlias deletes an alias; only its creator may.
func (s *Service) DeleteAlias(ctx context.Context, userID, alias string) error {
	if _, err := checkAlias(alias); err != nil {
		return err
	}
	a, err := s.db.RoomAlias(ctx, alias)
	if errors.Is(err, storage.ErrNotFound) {
		return mxerr.NotFound("unknown room alias %s", alias)
	} else if err != nil {
		return err
	}
	if a.Creator != userID {
		return mxerr.Forbidden("only the creator of an alias may delete it")
	}
	err = s.db.DeleteRoomAlias(ctx, alias)
	if errors.Is(err, storage.ErrNotFound) {
		return mxerr.NotFound("unknown room alias %s", alias)
	}
	return err
}
