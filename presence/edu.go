package presence

import (
	"context"
	"encoding/json"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/storage"
)

// pushItem is one entry of an m.presence EDU's push list.
type pushItem struct {
	UserID          string  `json:"user_id"`
	Presence        string  `json:"presence"`
	LastActiveAgo   *int64  `json:"last_active_ago"`
	StatusMsg       *string `json:"status_msg"`
	CurrentlyActive bool    `json:"currently_active"`
}

// ReceivePresence takes an m.presence EDU from origin: each entry about
// one of origin's users updates that user's presence (as Synapse's
// incoming_presence does). It is kept whether or not the user shares a
// room with a local user yet: a server sends its users' presence when one
// of ours joins a room with them, which may come before the join's state
// is written here; only users sharing a room see it. Entries about other
// servers' users, unknown states and malformed entries are dropped; an
// error (of the database) fails the transaction, which origin then sends
// again. With presence off the EDU is ignored.
func (s *Service) ReceivePresence(ctx context.Context, origin string, content json.RawMessage) error {
	if !s.o.Enabled {
		return nil
	}
	var edu struct {
		Push []json.RawMessage `json:"push"`
	}
	if err := json.Unmarshal(content, &edu); err != nil {
		s.o.Logger.WithField("origin", origin).WithError(err).Info("dropped an m.presence EDU of the wrong shape")
		return nil
	}
	for _, raw := range edu.Push {
		var item pushItem
		if err := json.Unmarshal(raw, &item); err != nil {
			s.o.Logger.WithField("origin", origin).WithError(err).Info("dropped an m.presence entry of the wrong shape")
			continue
		}
		if server, ok := matrixid.ParseUserID(item.UserID); !ok || server != origin || server == s.o.ServerName {
			s.o.Logger.WithFields(map[string]any{"origin": origin, "user_id": item.UserID}).Info("dropped an m.presence entry about a user of another server")
			continue
		}
		if !ValidState(item.Presence) {
			s.o.Logger.WithFields(map[string]any{"origin": origin, "user_id": item.UserID, "presence": item.Presence}).Info("dropped an m.presence entry with an unknown state")
			continue
		}
		now := s.o.Now().UnixMilli()
		err := s.write(ctx, item.UserID, func(prev storage.Presence, _ bool) storage.PresenceWrite {
			next := prev
			next.State, next.LastFederationUpdateTS = item.Presence, now
			if item.LastActiveAgo != nil && *item.LastActiveAgo >= 0 {
				next.LastActiveTS = now - *item.LastActiveAgo
			}
			next.StatusMsg = ""
			if item.StatusMsg != nil {
				next.StatusMsg = *item.StatusMsg
			}
			next.CurrentlyActive = item.CurrentlyActive
			next, notify, _ := handleUpdate(prev, next, false, now)
			return storage.PresenceWrite{Presence: next, Write: true, Notify: notify}
		})
		if err != nil {
			return err
		}
	}
	return nil
}
