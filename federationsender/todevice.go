package federationsender

import (
	"context"

	"github.com/keyserver/keyserver/storage"
)

// EDUQueue is a second queue of EDUs per destination in the database:
// to-device messages (package todevice queues them), and the typing
// notifications and receipts of rooms (packages typing and receipts),
// each EDU with its type. Its EDUs fill the
// transactions after the device-list updates, sharing their delivery,
// retries and leases.
type EDUQueue interface {
	storage.OutboundToDevice
}

// directToDevice is the type of the EDUs of the to-device queue.
const directToDevice = "m.direct_to_device"

// toDeviceDestinations lists the destinations with to-device EDUs waiting.
func (s *Sender) toDeviceDestinations(ctx context.Context) ([]string, error) {
	if s.o.ToDevice == nil {
		return nil, nil
	}
	return s.o.ToDevice.ToDeviceDestinations(ctx)
}

// pendingToDevice returns up to limit to-device EDUs waiting for dest.
func (s *Sender) pendingToDevice(ctx context.Context, dest string, limit int) ([]storage.OutboundEDU, error) {
	if s.o.ToDevice == nil || limit <= 0 {
		return nil, nil
	}
	return s.o.ToDevice.PendingToDevice(ctx, dest, limit)
}

// markToDeviceSent removes delivered to-device EDUs from the queue.
func (s *Sender) markToDeviceSent(ctx context.Context, dest string, sent []storage.OutboundEDU) error {
	if s.o.ToDevice == nil || len(sent) == 0 {
		return nil
	}
	return s.o.ToDevice.MarkToDeviceSent(ctx, dest, sent)
}
