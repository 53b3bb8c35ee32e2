package presence

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/storage"
)

// Presence for servers that begin to share a room (Synapse's
// _handle_state_delta): when a local user joins a room, their presence is
// sent to the other servers in it; when another server's user joins, the
// presence of the room's local members is sent to that server. Other
// servers would otherwise hear of it only at the next change or ping.
// Each daemon looks, in the background, at the joins in the stream from
// the position it last looked at up to that of each of its own room
// writes (a write's memberships take positions up to the write's): the
// write's request does not wait, and a backlog beyond joinsBacklog writes
// is dropped (the next write's range covers it). Joins written by other
// daemons of the database in the same ranges are looked at too, so their
// presence may go out twice, which changes nothing for the receiver.

// joinsBacklog bounds the room writes waiting to be looked at.
const joinsBacklog = 1024

// staleOffline is how long ago an offline user must have been active for
// their presence not to be worth sending to a server that newly shares a
// room (Synapse's week), unless they have a status message.
const staleOffline = 7 * 24 * time.Hour

// RoomWritten hears of a committed room write (roomserver.MembershipSink)
// and, when presence is sent to other servers, queues it to be looked at
// for joins.
func (s *Service) RoomWritten(res storage.RoomWriteResult) {
	if !s.o.Enabled || s.o.Queued == nil || res.Pos == 0 {
		return
	}
	select {
	case s.joins <- res.Pos:
	default:
		s.o.Logger.WithField("pos", res.Pos).Debug("presence: too many room writes waiting; the joins of one are not looked at")
	}
}

// announceJoins queues presence for the servers that the joins written
// in (from, to] make share a room.
func (s *Service) announceJoins(ctx context.Context, from, to storage.StreamPos) error {
	joins, err := s.db.JoinsIn(ctx, from, to)
	if err != nil || len(joins) == 0 {
		return err
	}
	byRoom := map[string][]string{}
	for _, j := range joins {
		byRoom[j.RoomID] = append(byRoom[j.RoomID], j.UserID)
	}
	now := s.o.Now().UnixMilli()
	queued := false
	var errs []error
	for roomID, joiners := range byRoom {
		servers, err := s.db.RoomJoinedServers(ctx, roomID)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		others := slices.DeleteFunc(servers, func(srv string) bool { return srv == s.o.ServerName })
		var local, newServers []string
		for _, u := range joiners {
			if srv := matrixid.Server(u); srv == s.o.ServerName {
				local = append(local, u)
			} else if !slices.Contains(newServers, srv) {
				newServers = append(newServers, srv)
			}
		}
		// The local joiners' presence to every other server in the room.
		if len(local) > 0 && len(others) > 0 {
			stored, err := s.db.Presence(ctx, local)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			entries := map[string]json.RawMessage{}
			for u, p := range stored {
				entries[u] = pushEntry(p, now)
			}
			if len(entries) > 0 {
				if err := s.db.QueuePresence(ctx, others, entries); err != nil {
					errs = append(errs, err)
					continue
				}
				queued = true
			}
		}
		// The room's local members' presence to the joiners' servers.
		if len(newServers) > 0 {
			members, err := s.db.RoomLocalPresence(ctx, roomID)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			entries := map[string]json.RawMessage{}
			for _, p := range members {
				if p.State != Offline || now-p.LastActiveTS < staleOffline.Milliseconds() || p.StatusMsg != "" {
					entries[p.UserID] = pushEntry(p, now)
				}
			}
			if len(entries) > 0 {
				if err := s.db.QueuePresence(ctx, newServers, entries); err != nil {
					errs = append(errs, err)
					continue
				}
				queued = true
			}
		}
	}
	if queued {
		s.o.Queued()
	}
	return errors.Join(errs...)
}
