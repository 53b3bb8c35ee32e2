package roomserver

import (
	"context"
	"errors"
	"math"
	"net/http"
	"slices"
	"strings"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// Room aliases: those of this server are in the database, those of
// other servers are asked of them (/query/directory).

// checkAlias checks an alias' syntax and returns its server.
func checkAlias(alias string) (string, error) {
	local, server, ok := strings.Cut(alias, ":")
	if !strings.HasPrefix(local, "#") || len(local) < 2 || !ok || server == "" || len(alias) > 255 {
		return "", mxerr.InvalidParam("%q is not a valid room alias", alias)
	}
	return server, nil
}

// resolveAlias returns the room an alias names and servers to reach it
// through (to join it): for our aliases, this server first, then the
// other servers with joined members; for other servers' aliases, their
// answer, asked at once.
func (s *Service) resolveAlias(ctx context.Context, alias string) (roomID string, servers []string, err error) {
	server, err := checkAlias(alias)
	if err != nil {
		return "", nil, err
	}
	if server != s.opts.ServerName {
		return s.resolveRemoteAlias(ctx, server, alias)
	}
	a, err := s.db.RoomAlias(ctx, alias)
	if errors.Is(err, storage.ErrNotFound) {
		return "", nil, mxerr.NotFound("unknown room alias %s", alias)
	} else if err != nil {
		return "", nil, err
	}
	servers, err = s.roomServers(ctx, a.RoomID)
	if err != nil {
		return "", nil, err
	}
	return a.RoomID, servers, nil
}

// roomServers lists this server, then the other servers with joined
// members in a room's current state, sorted.
func (s *Service) roomServers(ctx context.Context, roomID string) ([]string, error) {
	joined, err := s.db.RoomJoinedServers(ctx, roomID)
	if err != nil {
		return nil, err
	}
	joined = slices.DeleteFunc(joined, func(srv string) bool { return srv == s.opts.ServerName }) // sorted already
	return append([]string{s.opts.ServerName}, joined...), nil
}

// resolveRemoteAlias asks the alias' server.
func (s *Service) resolveRemoteAlias(ctx context.Context, server, alias string) (string, []string, error) {
	if s.opts.Directory == nil {
		return "", nil, mxerr.NotFound("aliases of other servers cannot be resolved: federation is off")
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.RemoteTimeout)
	defer cancel()
	roomID, servers, err := s.opts.Directory.LookupRoomAlias(ctx, server, alias)
	if err != nil {
		return "", nil, s.remoteFailure(server, err, "unknown room alias "+alias)
	}
	if !matrixid.ValidRoomID(roomID) {
		return "", nil, mxerr.New(http.StatusBadGateway, "M_UNKNOWN", "%s answered an invalid room ID", server)
	}
	// The alias' server is in its room: it is the one to try when the
	// answer lists none.
	if len(servers) == 0 {
		servers = []string{server}
	}
	return roomID, servers, nil
}

// AliasResponse answers GET /directory/room/{roomAlias}.
type AliasResponse struct {
	RoomID  string   `json:"room_id"`
	Servers []string `json:"servers"`
}

// ResolveAlias returns the room an alias names (asking its server when it
// is another's).
func (s *Service) ResolveAlias(ctx context.Context, alias string) (AliasResponse, error) {
	roomID, servers, err := s.resolveAlias(ctx, alias)
	if err != nil {
		return AliasResponse{}, err
	}
	return AliasResponse{RoomID: roomID, Servers: servers}, nil
}

// FederationQueryAlias answers another server's /query/directory: only
// for aliases of this server (404 M_NOT_FOUND for any other).
func (s *Service) FederationQueryAlias(ctx context.Context, alias string) (AliasResponse, error) {
	server, err := checkAlias(alias)
	if err != nil {
		return AliasResponse{}, err
	}
	if server != s.opts.ServerName {
		return AliasResponse{}, mxerr.NotFound("%s is not an alias of this server", alias)
	}
	return s.ResolveAlias(ctx, alias)
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

// Aliases lists this server's aliases of a room (GET
// /rooms/{roomId}/aliases), for a member or, in a world-readable room,
// anyone.
func (s *Service) Aliases(ctx context.Context, userID, roomID string) ([]string, error) {
	r, err := s.historyReader(ctx, userID, roomID)
	if err != nil {
		return nil, err
	}
	if !r.joinedNow && r.upTo != math.MaxInt64 {
		return nil, mxerr.Forbidden("you are not in room %s", roomID) // one who left
	}
	return s.db.RoomAliases(ctx, roomID)
}
