package fedclient

import (
	"context"
	"net/url"

	"github.com/keyserver/keyserver/storage"
)

// The room and profile requests of other servers.

// LookupRoomAlias asks an alias' server which room it names and which
// servers are in that room (/query/directory).
func (c *Client) LookupRoomAlias(ctx context.Context, dest, alias string) (roomID string, servers []string, err error) {
	var out struct {
		RoomID  string   `json:"room_id"`
		Servers []string `json:"servers"`
	}
	err = c.Do(ctx, "GET", dest, "/_matrix/federation/v1/query/directory?room_alias="+url.QueryEscape(alias), nil, &out)
	return out.RoomID, out.Servers, err
}

// QueryProfile asks a user's server for their profile (/query/profile).
func (c *Client) QueryProfile(ctx context.Context, dest, userID string) (storage.Profile, error) {
	var out storage.Profile
	err := c.Do(ctx, "GET", dest, "/_matrix/federation/v1/query/profile?user_id="+url.QueryEscape(userID), nil, &out)
	return out, err
}
