package fedclient

import (
	"context"
	"encoding/json"
	"net/url"

	"github.com/matrix-org/gomatrixserverlib"
)

// MakeKnock asks a resident server for a knock event template, offering
// the room versions versions (GET /make_knock).
func (c *Client) MakeKnock(ctx context.Context, dest, roomID, userID string, versions []string) (gomatrixserverlib.ProtoEvent, gomatrixserverlib.RoomVersion, error) {
	ctx = userAsked(ctx, dest)
	q := url.Values{}
	for _, v := range versions {
		q.Add("ver", v)
	}
	var out struct {
		Event       gomatrixserverlib.ProtoEvent  `json:"event"`
		RoomVersion gomatrixserverlib.RoomVersion `json:"room_version"`
	}
	err := c.Do(ctx, "GET", dest, "/_matrix/federation/v1/make_knock/"+url.PathEscape(roomID)+"/"+url.PathEscape(userID)+"?"+q.Encode(), nil, &out)
	return out.Event, out.RoomVersion, err
}

// SendKnock sends a signed knock to a resident server (PUT /send_knock)
// and returns the room's stripped state it answers with
// (knock_room_state).
func (c *Client) SendKnock(ctx context.Context, dest string, event gomatrixserverlib.PDU) ([]json.RawMessage, error) {
	ctx = userAsked(ctx, dest)
	var out struct {
		KnockRoomState []json.RawMessage `json:"knock_room_state"`
	}
	path := "/_matrix/federation/v1/send_knock/" + url.PathEscape(event.RoomID().String()) + "/" + url.PathEscape(event.EventID())
	err := c.Do(ctx, "PUT", dest, path, json.RawMessage(event.JSON()), &out)
	return out.KnockRoomState, err
}
