package fedclient

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/fclient"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// Room events over federation: fetching events and state, and the join
// and invite handshakes.

// GetEvent fetches one event (GET /event/{eventId}).
func (c *Client) GetEvent(ctx context.Context, dest, eventID string) (json.RawMessage, error) {
	var out struct {
		PDUs []json.RawMessage `json:"pdus"`
	}
	if err := c.Do(ctx, "GET", dest, "/_matrix/federation/v1/event/"+url.PathEscape(eventID), nil, &out); err != nil {
		return nil, err
	}
	if len(out.PDUs) != 1 {
		return nil, &HTTPError{Destination: dest, Status: 502, Message: "the answer does not hold one event"}
	}
	return out.PDUs[0], nil
}

// MissingEvents asks for the events of a room between earliest and
// latest (POST /get_missing_events/{roomId}).
func (c *Client) MissingEvents(ctx context.Context, dest, roomID string, earliest, latest []string, limit int, minDepth int64) ([]json.RawMessage, error) {
	var out struct {
		Events []json.RawMessage `json:"events"`
	}
	body := map[string]any{"earliest_events": nonNil(earliest), "latest_events": nonNil(latest), "limit": limit, "min_depth": minDepth}
	err := c.Do(ctx, "POST", dest, "/_matrix/federation/v1/get_missing_events/"+url.PathEscape(roomID), body, &out)
	return out.Events, err
}

// StateIDs asks for the state of a room before an event (GET /state_ids).
func (c *Client) StateIDs(ctx context.Context, dest, roomID, eventID string) (stateIDs, authChainIDs []string, err error) {
	var out fclient.RespStateIDs
	err = c.Do(ctx, "GET", dest, "/_matrix/federation/v1/state_ids/"+url.PathEscape(roomID)+"?event_id="+url.QueryEscape(eventID), nil, &out)
	return out.StateEventIDs, out.AuthEventIDs, err
}

// State asks for the state of a room before an event and its auth chain
// (GET /state).
func (c *Client) State(ctx context.Context, dest, roomID, eventID string) (state, authChain []json.RawMessage, err error) {
	var out struct {
		PDUs      []json.RawMessage `json:"pdus"`
		AuthChain []json.RawMessage `json:"auth_chain"`
	}
	err = c.Do(ctx, "GET", dest, "/_matrix/federation/v1/state/"+url.PathEscape(roomID)+"?event_id="+url.QueryEscape(eventID), nil, &out)
	return out.PDUs, out.AuthChain, err
}

// userAsked marks the membership handshakes (joins, leaves, knocks),
// which a user asks for through a server they name: sent even while that
// server backs off after failures (their failures still count), as
// Synapse does for joins. A server that failed some background request a
// moment ago is often up, and the user is waiting for this answer.
func userAsked(ctx context.Context, dest string) context.Context {
	return WithLive(ctx, dest)
}

// MakeJoin asks a resident server for a join event template, offering
// the room versions versions (GET /make_join).
func (c *Client) MakeJoin(ctx context.Context, dest, roomID, userID string, versions []string) (gomatrixserverlib.MakeJoinResponse, error) {
	ctx = userAsked(ctx, dest)
	q := url.Values{}
	for _, v := range versions {
		q.Add("ver", v)
	}
	var out fclient.RespMakeJoin
	err := c.Do(ctx, "GET", dest, "/_matrix/federation/v1/make_join/"+url.PathEscape(roomID)+"/"+url.PathEscape(userID)+"?"+q.Encode(), nil, &out)
	if err == nil && out.RoomVersion == "" {
		out.RoomVersion = gomatrixserverlib.RoomVersionV1 // servers that predate versions
	}
	return &out, err
}

// SendJoin sends a signed join to the resident server (PUT
// /v2/send_join), and through /v1/send_join to a server that does not
// serve v2 (older servers; its answer is [200, answer]).
func (c *Client) SendJoin(ctx context.Context, _, dest spec.ServerName, event gomatrixserverlib.PDU) (gomatrixserverlib.SendJoinResponse, error) {
	ctx = userAsked(ctx, string(dest))
	var out fclient.RespSendJoin
	path := "/send_join/" + url.PathEscape(event.RoomID().String()) + "/" + url.PathEscape(event.EventID())
	err := c.Do(ctx, "PUT", string(dest), "/_matrix/federation/v2"+path, json.RawMessage(event.JSON()), &out)
	if unknownEndpoint(err) {
		err = c.doV1(ctx, string(dest), "/_matrix/federation/v1"+path, json.RawMessage(event.JSON()), &out)
	}
	return &out, err
}

// SendInvite asks the invitee's server to sign an invite (PUT
// /v2/invite) and returns the event as it came back.
func (c *Client) SendInvite(ctx context.Context, dest string, event gomatrixserverlib.PDU, strippedState []json.RawMessage) (json.RawMessage, error) {
	var out fclient.RespInviteV2
	body := map[string]any{"room_version": event.Version(), "event": json.RawMessage(event.JSON()), "invite_room_state": nonNilRaw(strippedState)}
	path := "/_matrix/federation/v2/invite/" + url.PathEscape(event.RoomID().String()) + "/" + url.PathEscape(event.EventID())
	err := c.Do(ctx, "PUT", dest, path, body, &out)
	return json.RawMessage(out.Event), err
}

// MakeLeave asks a resident server for a leave event template (GET
// /make_leave).
func (c *Client) MakeLeave(ctx context.Context, dest, roomID, userID string) (gomatrixserverlib.ProtoEvent, gomatrixserverlib.RoomVersion, error) {
	ctx = userAsked(ctx, dest)
	var out struct {
		Event       gomatrixserverlib.ProtoEvent  `json:"event"`
		RoomVersion gomatrixserverlib.RoomVersion `json:"room_version"`
	}
	err := c.Do(ctx, "GET", dest, "/_matrix/federation/v1/make_leave/"+url.PathEscape(roomID)+"/"+url.PathEscape(userID), nil, &out)
	if err == nil && out.RoomVersion == "" {
		out.RoomVersion = gomatrixserverlib.RoomVersionV1
	}
	return out.Event, out.RoomVersion, err
}

// SendLeave sends a signed leave to a resident server (PUT
// /v2/send_leave, or /v1/send_leave where v2 is not served).
func (c *Client) SendLeave(ctx context.Context, dest string, event gomatrixserverlib.PDU) error {
	ctx = userAsked(ctx, dest)
	path := "/send_leave/" + url.PathEscape(event.RoomID().String()) + "/" + url.PathEscape(event.EventID())
	err := c.Do(ctx, "PUT", dest, "/_matrix/federation/v2"+path, json.RawMessage(event.JSON()), nil)
	if unknownEndpoint(err) {
		var ignored struct{}
		err = c.doV1(ctx, dest, "/_matrix/federation/v1"+path, json.RawMessage(event.JSON()), &ignored)
	}
	return err
}

// doV1 sends a v1 membership handshake, whose answer is the array
// [200, answer], and reads the answer into out.
func (c *Client) doV1(ctx context.Context, dest, path string, body any, out any) error {
	var pair []json.RawMessage
	if err := c.Do(ctx, "PUT", dest, path, body, &pair); err != nil {
		return err
	}
	if len(pair) != 2 {
		return &HTTPError{Destination: dest, Status: http.StatusBadGateway, Message: "the v1 answer is not [status, answer]"}
	}
	if err := json.Unmarshal(pair[1], out); err != nil {
		return &HTTPError{Destination: dest, Status: http.StatusBadGateway, Message: "the v1 answer cannot be read"}
	}
	return nil
}

// unknownEndpoint reports an answer that says the server does not serve
// the path at all, as servers say it: 404 or 405 without an errcode or
// with M_UNRECOGNIZED, or 400 M_UNRECOGNIZED. A 404 M_NOT_FOUND (an
// unknown room) is an answer of the endpoint, not one of these.
func unknownEndpoint(err error) bool {
	var he *HTTPError
	if !errors.As(err, &he) {
		return false
	}
	switch he.Status {
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		return he.Errcode == "" || he.Errcode == "M_UNRECOGNIZED"
	case http.StatusBadRequest:
		return he.Errcode == "M_UNRECOGNIZED"
	}
	return false
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func nonNilRaw(s []json.RawMessage) []json.RawMessage {
	if s == nil {
		return []json.RawMessage{}
	}
	return s
}

// PublicRooms asks a server for a page of its public room directory:
// POST /publicRooms with body when it is not nil (a filter), else GET
// with query. The answer is returned as the server sent it.
func (c *Client) PublicRooms(ctx context.Context, dest string, body any, query url.Values) (json.RawMessage, error) {
	var out json.RawMessage
	path := "/_matrix/federation/v1/publicRooms"
	if body != nil {
		err := c.Do(ctx, "POST", dest, path, body, &out)
		return out, err
	}
	if len(query) > 0 {
		path += "?" + query.Encode()
	}
	err := c.Do(ctx, "GET", dest, path, nil, &out)
	return out, err
}

// Backfill asks for a room's events from the events from and before
// them, up to limit (GET /backfill/{roomId}).
func (c *Client) Backfill(ctx context.Context, dest, roomID string, from []string, limit int) ([]json.RawMessage, error) {
	q := url.Values{"v": from, "limit": {strconv.Itoa(limit)}}
	var out struct {
		PDUs []json.RawMessage `json:"pdus"`
	}
	err := c.Do(ctx, "GET", dest, "/_matrix/federation/v1/backfill/"+url.PathEscape(roomID)+"?"+q.Encode(), nil, &out)
	return out.PDUs, err
}
