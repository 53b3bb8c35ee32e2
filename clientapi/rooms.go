package clientapi

import (
	"context"
	"encoding/json"
	"net/http"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/roomserver"
)

// roomRoutes serves rooms: creation, events, state, membership, aliases.
// roomRoutes registers the room endpoints: those under /rooms/ on room
// (see splitRouter), the others on s.
func (a *API) roomRoutes(s, room prefixed) {
	if a.opts.Rooms == nil {
		return
	}
	s.Handle("/createRoom", a.authed(a.createRoom)).Methods(http.MethodPost)
	room.Handle("/rooms/{roomId}/send/{eventType}/{txnId}", a.authed(a.sendEvent)).Methods(http.MethodPut)
	// An empty state key may drop the trailing slash.
	room.Handle("/rooms/{roomId}/state/{eventType}", a.authed(a.sendState)).Methods(http.MethodPut)
	room.Handle("/rooms/{roomId}/state/{eventType}/", a.authed(a.sendState)).Methods(http.MethodPut)
	room.Handle("/rooms/{roomId}/state/{eventType}/{stateKey}", a.authed(a.sendState)).Methods(http.MethodPut)
	room.Handle("/rooms/{roomId}/state", a.authed(a.roomState)).Methods(http.MethodGet)
	room.Handle("/rooms/{roomId}/state/{eventType}", a.authed(a.roomStateEvent)).Methods(http.MethodGet)
	room.Handle("/rooms/{roomId}/state/{eventType}/", a.authed(a.roomStateEvent)).Methods(http.MethodGet)
	room.Handle("/rooms/{roomId}/state/{eventType}/{stateKey}", a.authed(a.roomStateEvent)).Methods(http.MethodGet)
	room.Handle("/rooms/{roomId}/members", a.authed(a.roomMembers)).Methods(http.MethodGet)
	room.Handle("/rooms/{roomId}/joined_members", a.authed(a.joinedMembers)).Methods(http.MethodGet)
	room.Handle("/rooms/{roomId}/event/{eventId}", a.authed(a.roomEvent)).Methods(http.MethodGet)
	room.Handle("/rooms/{roomId}/messages", a.authed(a.roomMessages)).Methods(http.MethodGet)
	room.Handle("/rooms/{roomId}/context/{eventId}", a.authed(a.roomContext)).Methods(http.MethodGet)
	room.Handle("/rooms/{roomId}/aliases", a.authed(a.roomAliases)).Methods(http.MethodGet)
	room.Handle("/rooms/{roomId}/redact/{eventId}/{txnId}", a.authed(a.redact)).Methods(http.MethodPut)
	s.Handle("/joined_rooms", a.authed(a.joinedRooms)).Methods(http.MethodGet)
	s.Handle("/join/{roomIdOrAlias}", a.authed(a.join("roomIdOrAlias"))).Methods(http.MethodPost)
	room.Handle("/rooms/{roomId}/join", a.authed(a.join("roomId"))).Methods(http.MethodPost)
	room.Handle("/rooms/{roomId}/invite", a.authed(a.targeted(a.opts.Rooms.Invite))).Methods(http.MethodPost)
	room.Handle("/rooms/{roomId}/kick", a.authed(a.targeted(a.opts.Rooms.Kick))).Methods(http.MethodPost)
	room.Handle("/rooms/{roomId}/ban", a.authed(a.targeted(a.opts.Rooms.Ban))).Methods(http.MethodPost)
	room.Handle("/rooms/{roomId}/unban", a.authed(a.targeted(a.opts.Rooms.Unban))).Methods(http.MethodPost)
	room.Handle("/rooms/{roomId}/leave", a.authed(a.leave)).Methods(http.MethodPost)
	room.Handle("/rooms/{roomId}/forget", a.authed(a.forget)).Methods(http.MethodPost)
	room.Handle("/rooms/{roomId}/upgrade", a.authed(a.upgradeRoom)).Methods(http.MethodPost)
	s.Handle("/directory/room/{roomAlias}", a.authed(a.putAlias)).Methods(http.MethodPut)
	s.Handle("/directory/room/{roomAlias}", a.authed(a.getAlias)).Methods(http.MethodGet)
	s.Handle("/directory/room/{roomAlias}", a.authed(a.deleteAlias)).Methods(http.MethodDelete)
	s.Handle("/user/{userId}/filter", a.authed(a.putFilter)).Methods(http.MethodPost)
	s.Handle("/user/{userId}/filter/{filterId}", a.authed(a.getFilter)).Methods(http.MethodGet)
}

func (a *API) putFilter(r *http.Request, c matrixid.Caller) (any, error) {
	userID, err := pathVar(r, "userId")
	if err != nil {
		return nil, err
	}
	var filter json.RawMessage
	if err := a.decode(r, &filter); err != nil {
		return nil, err
	}
	id, err := a.opts.Rooms.PutFilter(r.Context(), c.UserID, userID, filter)
	if err != nil {
		return nil, err
	}
	return map[string]string{"filter_id": id}, nil
}

func (a *API) getFilter(r *http.Request, c matrixid.Caller) (any, error) {
	v, err := pathVars(r, "userId", "filterId")
	if err != nil {
		return nil, err
	}
	return a.opts.Rooms.GetFilter(r.Context(), c.UserID, v[0], v[1])
}

// pathVars decodes several path parameters.
func pathVars(r *http.Request, names ...string) ([]string, error) {
	out := make([]string, len(names))
	for i, n := range names {
		v, err := pathVar(r, n)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func (a *API) createRoom(r *http.Request, c matrixid.Caller) (any, error) {
	var req roomserver.CreateRoomRequest
	if err := a.decodeOptional(r, &req); err != nil {
		return nil, err
	}
	id, err := a.opts.Rooms.CreateRoom(r.Context(), c.UserID, req)
	if err != nil {
		return nil, err
	}
	return map[string]string{"room_id": id}, nil
}

// eventBody reads an event's content: a JSON object.
func (a *API) eventBody(r *http.Request) (json.RawMessage, error) {
	var content json.RawMessage
	if err := a.decode(r, &content); err != nil {
		return nil, err
	}
	return content, nil
}

func (a *API) sendEvent(r *http.Request, c matrixid.Caller) (any, error) {
	v, err := pathVars(r, "roomId", "eventType", "txnId")
	if err != nil {
		return nil, err
	}
	content, err := a.eventBody(r)
	if err != nil {
		return nil, err
	}
	id, err := a.opts.Rooms.Send(r.Context(), c.UserID, c.DeviceID, v[0], v[1], v[2], content)
	if err != nil {
		return nil, err
	}
	return map[string]string{"event_id": id}, nil
}

func (a *API) redact(r *http.Request, c matrixid.Caller) (any, error) {
	v, err := pathVars(r, "roomId", "eventId", "txnId")
	if err != nil {
		return nil, err
	}
	var req struct {
		Reason string `json:"reason"`
	}
	if err := a.decodeOptional(r, &req); err != nil {
		return nil, err
	}
	id, err := a.opts.Rooms.Redact(r.Context(), c.UserID, c.DeviceID, v[0], v[1], v[2], req.Reason)
	if err != nil {
		return nil, err
	}
	return map[string]string{"event_id": id}, nil
}

func (a *API) sendState(r *http.Request, c matrixid.Caller) (any, error) {
	v, err := pathVars(r, "roomId", "eventType", "stateKey")
	if err != nil {
		return nil, err
	}
	content, err := a.eventBody(r)
	if err != nil {
		return nil, err
	}
	id, err := a.opts.Rooms.SendState(r.Context(), c.UserID, v[0], v[1], v[2], content)
	if err != nil {
		return nil, err
	}
	return map[string]string{"event_id": id}, nil
}

func (a *API) roomState(r *http.Request, c matrixid.Caller) (any, error) {
	roomID, err := pathVar(r, "roomId")
	if err != nil {
		return nil, err
	}
	return a.opts.Rooms.State(r.Context(), c.UserID, roomID)
}

func (a *API) roomStateEvent(r *http.Request, c matrixid.Caller) (any, error) {
	v, err := pathVars(r, "roomId", "eventType", "stateKey")
	if err != nil {
		return nil, err
	}
	ev, err := a.opts.Rooms.StateEvent(r.Context(), c.UserID, v[0], v[1], v[2])
	if err != nil {
		return nil, err
	}
	if r.URL.Query().Get("format") == "event" {
		return ev, nil
	}
	return ev.Content, nil
}

func (a *API) roomMembers(r *http.Request, c matrixid.Caller) (any, error) {
	roomID, err := pathVar(r, "roomId")
	if err != nil {
		return nil, err
	}
	q := r.URL.Query()
	members, err := a.opts.Rooms.Members(r.Context(), roomserver.MembersRequest{UserID: c.UserID, RoomID: roomID,
		At: q.Get("at"), Membership: q.Get("membership"), NotMembership: q.Get("not_membership")})
	if err != nil {
		return nil, err
	}
	return map[string]any{"chunk": members}, nil
}

func (a *API) joinedMembers(r *http.Request, c matrixid.Caller) (any, error) {
	roomID, err := pathVar(r, "roomId")
	if err != nil {
		return nil, err
	}
	joined, err := a.opts.Rooms.JoinedMembers(r.Context(), c.UserID, roomID)
	if err != nil {
		return nil, err
	}
	return map[string]any{"joined": joined}, nil
}

func (a *API) roomEvent(r *http.Request, c matrixid.Caller) (any, error) {
	v, err := pathVars(r, "roomId", "eventId")
	if err != nil {
		return nil, err
	}
	return a.opts.Rooms.Event(r.Context(), c.UserID, v[0], v[1])
}

func (a *API) roomMessages(r *http.Request, c matrixid.Caller) (any, error) {
	roomID, err := pathVar(r, "roomId")
	if err != nil {
		return nil, err
	}
	q := r.URL.Query()
	return a.opts.Rooms.Messages(r.Context(), roomserver.MessagesRequest{UserID: c.UserID, RoomID: roomID,
		From: q.Get("from"), To: q.Get("to"), Dir: q.Get("dir"), Limit: q.Get("limit"), Filter: q.Get("filter")})
}

func (a *API) roomContext(r *http.Request, c matrixid.Caller) (any, error) {
	v, err := pathVars(r, "roomId", "eventId")
	if err != nil {
		return nil, err
	}
	q := r.URL.Query()
	return a.opts.Rooms.Context(r.Context(), roomserver.ContextRequest{UserID: c.UserID, RoomID: v[0], EventID: v[1],
		Limit: q.Get("limit"), Filter: q.Get("filter")})
}

func (a *API) roomAliases(r *http.Request, c matrixid.Caller) (any, error) {
	roomID, err := pathVar(r, "roomId")
	if err != nil {
		return nil, err
	}
	aliases, err := a.opts.Rooms.Aliases(r.Context(), c.UserID, roomID)
	if err != nil {
		return nil, err
	}
	return map[string]any{"aliases": aliases}, nil
}

func (a *API) joinedRooms(r *http.Request, c matrixid.Caller) (any, error) {
	rooms, err := a.opts.Rooms.JoinedRooms(r.Context(), c.UserID)
	if err != nil {
		return nil, err
	}
	return map[string]any{"joined_rooms": rooms}, nil
}

// membershipRequest is the body of the membership endpoints.
type membershipRequest struct {
	UserID string `json:"user_id"`
	Reason string `json:"reason"`
}

func (a *API) join(param string) authedHandler {
	return func(r *http.Request, c matrixid.Caller) (any, error) {
		target, err := pathVar(r, param)
		if err != nil {
			return nil, err
		}
		var body map[string]json.RawMessage
		if err := a.decodeOptional(r, &body); err != nil {
			return nil, err
		}
		if reason, ok := body["reason"]; ok {
			var s string
			if json.Unmarshal(reason, &s) != nil {
				return nil, mxerr.BadJSON("reason must be a string")
			}
		}
		// server_name (repeatable): servers to join a remote room through;
		// via, its newer name.
		via := append(r.URL.Query()["server_name"], r.URL.Query()["via"]...)
		roomID, err := a.opts.Rooms.Join(r.Context(), c.UserID, target, body, via)
		if err != nil {
			return nil, err
		}
		return map[string]string{"room_id": roomID}, nil
	}
}

// targeted serves invite, kick, ban and unban: the caller acts on user_id.
func (a *API) targeted(act func(ctx context.Context, sender, roomID, target, reason string) error) authedHandler {
	return func(r *http.Request, c matrixid.Caller) (any, error) {
		roomID, err := pathVar(r, "roomId")
		if err != nil {
			return nil, err
		}
		var req membershipRequest
		if err := a.decode(r, &req); err != nil {
			return nil, err
		}
		if req.UserID == "" {
			return nil, mxerr.BadJSON("user_id is required")
		}
		return empty, act(r.Context(), c.UserID, roomID, req.UserID, req.Reason)
	}
}

func (a *API) leave(r *http.Request, c matrixid.Caller) (any, error) {
	roomID, err := pathVar(r, "roomId")
	if err != nil {
		return nil, err
	}
	var req membershipRequest
	if err := a.decodeOptional(r, &req); err != nil {
		return nil, err
	}
	return empty, a.opts.Rooms.Leave(r.Context(), c.UserID, roomID, req.Reason)
}

func (a *API) forget(r *http.Request, c matrixid.Caller) (any, error) {
	roomID, err := pathVar(r, "roomId")
	if err != nil {
		return nil, err
	}
	return empty, a.opts.Rooms.Forget(r.Context(), c.UserID, roomID)
}

func (a *API) putAlias(r *http.Request, c matrixid.Caller) (any, error) {
	alias, err := pathVar(r, "roomAlias")
	if err != nil {
		return nil, err
	}
	var req struct {
		RoomID string `json:"room_id"`
	}
	if err := a.decode(r, &req); err != nil {
		return nil, err
	}
	return empty, a.opts.Rooms.PutAlias(r.Context(), c.UserID, alias, req.RoomID)
}

func (a *API) getAlias(r *http.Request, c matrixid.Caller) (any, error) {
	alias, err := pathVar(r, "roomAlias")
	if err != nil {
		return nil, err
	}
	return a.opts.Rooms.ResolveAlias(r.Context(), alias)
}

func (a *API) deleteAlias(r *http.Request, c matrixid.Caller) (any, error) {
	alias, err := pathVar(r, "roomAlias")
	if err != nil {
		return nil, err
	}
	return empty, a.opts.Rooms.DeleteAlias(r.Context(), c.UserID, alias)
}
