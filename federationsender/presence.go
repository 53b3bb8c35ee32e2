package federationsender

import (
	"context"
	"encoding/json"

	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/storage"
)

// PresenceQueue is the queue of the local users' presence per destination
// in the database (package presence queues it): each entry is one user's
// item of an m.presence EDU's push list. The entries of a batch go out as
// one EDU after the device-list updates and to-device messages, sharing
// their delivery, retries and leases.
type PresenceQueue interface {
	PresenceDestinations(ctx context.Context) ([]string, error)
	PendingPresence(ctx context.Context, destination string, limit int) ([]storage.OutboundEDU, error)
	MarkPresenceSent(ctx context.Context, destination string, sent []storage.OutboundEDU) error
}

// maxPresencePerEDU bounds the push entries of one m.presence EDU.
const maxPresencePerEDU = 100

// presenceDestinations lists the destinations with presence waiting.
func (s *Sender) presenceDestinations(ctx context.Context) ([]string, error) {
	if s.o.Presence == nil {
		return nil, nil
	}
	return s.o.Presence.PresenceDestinations(ctx)
}

// pendingPresence returns the push entries waiting for dest, when the
// batch has room for their EDU (room for at least one EDU).
func (s *Sender) pendingPresence(ctx context.Context, dest string, room int) ([]storage.OutboundEDU, error) {
	if s.o.Presence == nil || room <= 0 {
		return nil, nil
	}
	return s.o.Presence.PendingPresence(ctx, dest, maxPresencePerEDU)
}

// markPresenceSent removes delivered push entries from the queue.
func (s *Sender) markPresenceSent(ctx context.Context, dest string, sent []storage.OutboundEDU) error {
	if s.o.Presence == nil || len(sent) == 0 {
		return nil
	}
	return s.o.Presence.MarkPresenceSent(ctx, dest, sent)
}

// presenceEDU is the m.presence EDU of push entries.
func presenceEDU(entries []storage.OutboundEDU) fedclient.EDU {
	push := make([]json.RawMessage, len(entries))
	for i, e := range entries {
		push[i] = e.Content
	}
	content, _ := json.Marshal(map[string]any{"push": push}) // raw JSON entries always marshal
	return fedclient.EDU{Type: "m.presence", Content: content}
}
