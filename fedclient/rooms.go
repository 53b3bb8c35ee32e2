package fedclient

import (
	"context"
	"net/url"
)

// The room requests of other servers.

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
