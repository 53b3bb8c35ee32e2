package presence

import (
	"context"

	"github.com/keyserver/keyserver/storage"
)

// SyncSection is the presence part of a /sync answer.
type SyncSection struct {
	Events []SyncEvent `json:"events"`
}

// SyncEvent is an m.presence event.
type SyncEvent struct {
	Type    string `json:"type"`
	Sender  string `json:"sender"`
	Content Status `json:"content"`
}

// SyncSection returns the presence part of a /sync answer for (from, to]:
// the presence of the user and of the users joined to a room with them
// that changed in the range; from 0 (an initial sync): every such
// presence that is not offline. news says the range holds changes.
func (s *Service) SyncSection(ctx context.Context, userID string, from, to storage.StreamPos) (_ any, news bool, _ error) {
	changes, err := s.db.PresenceChanges(ctx, userID, from, to)
	if err != nil {
		return nil, false, err
	}
	now := s.o.Now().UnixMilli()
	section := &SyncSection{Events: make([]SyncEvent, 0, len(changes))}
	for _, p := range changes {
		section.Events = append(section.Events, SyncEvent{Type: "m.presence", Sender: p.UserID, Content: format(p, now)})
	}
	return section, len(changes) > 0, nil
}
