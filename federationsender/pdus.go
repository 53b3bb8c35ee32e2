package federationsender

import (
	"context"
	"encoding/json"

	"github.com/keyserver/keyserver/storage"
)

// PDUQueue is the queue of our room events per destination in the
// database (package sqlstore queues them in the transaction that writes
// them, for every server in the room). Up to 50 of them, oldest first,
// ride in each transaction beside its EDUs, sharing their delivery,
// transaction ID, retries and leases; a destination with only PDUs
// waiting is sent to alike.
type PDUQueue interface {
	storage.OutboundPDUs
}

// pduDestinations lists the destinations with PDUs waiting.
func (s *Sender) pduDestinations(ctx context.Context) ([]string, error) {
	if s.o.PDUs == nil {
		return nil, nil
	}
	return s.o.PDUs.PDUDestinations(ctx)
}

// pendingPDUs returns up to limit PDUs waiting for dest, oldest first.
func (s *Sender) pendingPDUs(ctx context.Context, dest string, limit int) ([]storage.OutboundPDU, error) {
	if s.o.PDUs == nil || limit <= 0 {
		return nil, nil
	}
	return s.o.PDUs.PendingPDUs(ctx, dest, limit)
}

// markPDUsSent removes delivered PDUs from the queue.
func (s *Sender) markPDUsSent(ctx context.Context, dest string, sent []storage.OutboundPDU) error {
	if s.o.PDUs == nil || len(sent) == 0 {
		return nil
	}
	return s.o.PDUs.MarkPDUsSent(ctx, dest, sent)
}

// pduJSON is the list of a batch's PDUs as the transaction carries them.
func pduJSON(pdus []storage.OutboundPDU) []json.RawMessage {
	out := make([]json.RawMessage, len(pdus))
	for i, p := range pdus {
		out[i] = p.JSON
	}
	return out
}
