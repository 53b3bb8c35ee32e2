package fedclient

import (
	"context"
	"encoding/json"
	"net/url"
	"strconv"
)

// Hierarchy asks a server for a room's entry and its children's
// (GET /hierarchy/{roomId}), the answer unread.
func (c *Client) Hierarchy(ctx context.Context, dest, roomID string, suggestedOnly bool) (json.RawMessage, error) {
	var out json.RawMessage
	err := c.Do(ctx, "GET", dest, "/_matrix/federation/v1/hierarchy/"+url.PathEscape(roomID)+
		"?suggested_only="+strconv.FormatBool(suggestedOnly), nil, &out)
	return out, err
}
