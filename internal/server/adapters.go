package server

import (
	"context"
	"encoding/json"
	"strconv"

	"github.com/keyserver/keyserver/dehydrated"
	"github.com/keyserver/keyserver/initialsync"
	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/keyserver"
	"github.com/keyserver/keyserver/pusher"
	"github.com/keyserver/keyserver/pushrules"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/search"
	"github.com/keyserver/keyserver/syncapi"
)

// dehydratedKeys lets dehydrated devices upload their keys through the
// keys domain, in the terms package dehydrated declares.
type dehydratedKeys struct{ ks *keyserver.Service }

func (k dehydratedKeys) CheckNewDeviceKeys(ctx context.Context, c matrixid.Caller, keys dehydrated.Keys) error {
	return k.ks.CheckNewDeviceUpload(ctx, c, uploadRequest(keys))
}

func (k dehydratedKeys) UploadDeviceKeys(ctx context.Context, c matrixid.Caller, keys dehydrated.Keys) error {
	_, err := k.ks.UploadKeys(ctx, c, uploadRequest(keys))
	return err
}

func uploadRequest(k dehydrated.Keys) keyserver.UploadRequest {
	return keyserver.UploadRequest{DeviceKeys: k.DeviceKeys, OneTimeKeys: k.OneTimeKeys, FallbackKeys: k.FallbackKeys}
}

// pushRules gives the pushers users' push rules in the terms package
// pusher declares.
type pushRules struct{ rules *pushrules.Service }

func (p pushRules) Rules(ctx context.Context, userID string) (pusher.RuleSet, error) {
	rs, err := p.rules.Ruleset(ctx, userID)
	return userRules(rs), err
}

type userRules pushrules.Ruleset

func (r userRules) Evaluate(ev pusher.Event) pusher.Outcome {
	out := pushrules.Evaluate(pushrules.Ruleset(r), pushrules.Event{JSON: ev.JSON, UserDisplayName: ev.UserDisplayName,
		MemberCount: ev.MemberCount, SenderPowerLevel: ev.SenderPowerLevel, NotificationLevels: ev.NotificationLevels})
	return pusher.Outcome{Notify: out.Notify, Highlight: out.Highlight(), Tweaks: out.Tweaks}
}

// searchRooms gives search the rooms' reads in the terms package search
// declares.
type searchRooms struct{ rooms *roomserver.Service }

func (r searchRooms) JoinedRooms(ctx context.Context, userID string) ([]string, error) {
	return r.rooms.JoinedRooms(ctx, userID)
}

func (r searchRooms) VisibleEvent(ctx context.Context, userID, roomID, eventID string) (json.RawMessage, error) {
	ev, err := r.rooms.Event(ctx, userID, roomID, eventID)
	if err != nil {
		return nil, err
	}
	return json.Marshal(ev)
}

func (r searchRooms) EventContext(ctx context.Context, userID, roomID, eventID string, before, after int) (search.EventContext, error) {
	c, err := r.rooms.Context(ctx, roomserver.ContextRequest{UserID: userID, RoomID: roomID, EventID: eventID, Before: &before, After: &after})
	if err != nil {
		return search.EventContext{}, err
	}
	out := search.EventContext{Start: c.Start, End: c.End, Members: map[string]json.RawMessage{}}
	if out.EventsBefore, err = rawEvents(c.EventsBefore); err != nil {
		return search.EventContext{}, err
	}
	if out.EventsAfter, err = rawEvents(c.EventsAfter); err != nil {
		return search.EventContext{}, err
	}
	for _, e := range c.State {
		if e.Type == "m.room.member" && e.StateKey != nil {
			js, err := json.Marshal(e)
			if err != nil {
				return search.EventContext{}, err
			}
			out.Members[*e.StateKey] = js
		}
	}
	return out, nil
}

// syncRooms gives /sync the rooms part in the terms package syncapi
// declares.
type syncRooms struct{ rooms *roomserver.Service }

func (r syncRooms) ResolveFilter(ctx context.Context, userID, param string) (syncapi.RoomFilter, error) {
	f, err := r.rooms.ResolveFilter(ctx, userID, param)
	if err != nil {
		return nil, err
	}
	return f, nil
}

func (r syncRooms) Sync(ctx context.Context, req syncapi.RoomsRequest) (syncapi.RoomsSection, error) {
	f, _ := req.Filter.(roomserver.Filter) // the filter ResolveFilter gave; none: the zero filter
	rooms, err := r.rooms.Sync(ctx, roomserver.SyncRequest{UserID: req.UserID, DeviceID: req.DeviceID, From: req.From, To: req.To,
		FullState: req.FullState, Filter: f, AccountData: req.AccountData, Token: req.Token,
		Memberships: req.Memberships, RoomsWithEvents: req.RoomsWithEvents, HaveMemberships: true})
	if err != nil || rooms == nil {
		return nil, err
	}
	return rooms, nil
}

// InitialSyncRooms gives the initial syncs the rooms' reads in the terms
// package initialsync declares.
func InitialSyncRooms(rooms *roomserver.Service) initialsync.Rooms { return initialSyncRooms{rooms} }

type initialSyncRooms struct{ rooms *roomserver.Service }

func (r initialSyncRooms) State(ctx context.Context, userID, roomID string) ([]json.RawMessage, error) {
	evs, err := r.rooms.State(ctx, userID, roomID)
	if err != nil {
		return nil, err
	}
	return rawEvents(evs)
}

func (r initialSyncRooms) LatestMessages(ctx context.Context, userID, roomID string, limit int) (initialsync.Page, error) {
	msgs, err := r.rooms.Messages(ctx, roomserver.MessagesRequest{UserID: userID, RoomID: roomID, Dir: "b", Limit: strconv.Itoa(limit)})
	if err != nil {
		return initialsync.Page{}, err
	}
	chunk, err := rawEvents(msgs.Chunk)
	return initialsync.Page{Chunk: chunk, Start: msgs.Start, End: msgs.End}, err
}

// rawEvents encodes client events one by one (nil for none).
func rawEvents(evs []roomserver.ClientEvent) ([]json.RawMessage, error) {
	if evs == nil {
		return nil, nil
	}
	out := make([]json.RawMessage, len(evs))
	for i, e := range evs {
		js, err := json.Marshal(e)
		if err != nil {
			return nil, err
		}
		out[i] = js
	}
	return out, nil
}
