package federationsender

import (
	"context"

	"github.com/keyserver/keyserver/internal/slots"
	"github.com/keyserver/keyserver/storage"
)

// DefaultDatabaseSlots is Options.DatabaseSlots when it is not set.
const DefaultDatabaseSlots = 8

// The workers share the daemon's database pool with the requests it
// answers. Sending to a thousand servers at once, each worker goes to the
// database between its requests, and with as many workers as the pool has
// connections the requests of clients and servers queued behind them for
// a connection (on PostgreSQL, hundreds of milliseconds while a fan-out
// ran). So the workers take at most DatabaseSlots connections at a time:
// they wait for one among themselves, and the rest of the pool stays free
// for requests. A worker spends most of its time on the network, so a
// few slots serve many workers.

// slotStore is a Store whose calls take a slot.
type slotStore struct {
	db    Store
	slots *slots.Slots
}

func (s slotStore) PendingDestinations(ctx context.Context) (d []string, err error) {
	err = s.slots.Do(ctx, func() error { d, err = s.db.PendingDestinations(ctx); return err })
	return d, err
}

func (s slotStore) PendingUpdates(ctx context.Context, destination string, limit int) (u []storage.OutboundUpdate, err error) {
	err = s.slots.Do(ctx, func() error { u, err = s.db.PendingUpdates(ctx, destination, limit); return err })
	return u, err
}

func (s slotStore) MarkUpdatesSent(ctx context.Context, destination string, sent []storage.OutboundUpdate) error {
	return s.slots.Do(ctx, func() error { return s.db.MarkUpdatesSent(ctx, destination, sent) })
}

func (s slotStore) AcquireDestination(ctx context.Context, destination, owner string, now, expires int64) (held, kept bool, err error) {
	err = s.slots.Do(ctx, func() error {
		held, kept, err = s.db.AcquireDestination(ctx, destination, owner, now, expires)
		return err
	})
	return held, kept, err
}

func (s slotStore) ReleaseDestination(ctx context.Context, destination, owner string) error {
	return s.slots.Do(ctx, func() error { return s.db.ReleaseDestination(ctx, destination, owner) })
}

func (s slotStore) PauseDestination(ctx context.Context, destination, owner string) error {
	return s.slots.Do(ctx, func() error { return s.db.PauseDestination(ctx, destination, owner) })
}

func (s slotStore) HandOverDestination(ctx context.Context, destination, owner string) error {
	return s.slots.Do(ctx, func() error { return s.db.HandOverDestination(ctx, destination, owner) })
}

func (s slotStore) OutboundOwners(ctx context.Context) (o []int64, err error) {
	err = s.slots.Do(ctx, func() error { o, err = s.db.OutboundOwners(ctx); return err })
	return o, err
}

// HoldOutboundOwner keeps a connection of its own: it takes no slot.
func (s slotStore) HoldOutboundOwner(ctx context.Context, owner string) (<-chan struct{}, error) {
	return s.db.HoldOutboundOwner(ctx, owner)
}

func (s slotStore) ReclaimDeadLeases(ctx context.Context) (d []string, err error) {
	err = s.slots.Do(ctx, func() error { d, err = s.db.ReclaimDeadLeases(ctx); return err })
	return d, err
}

func (s slotStore) DestinationRetries(ctx context.Context) (r []storage.DestinationRetry, err error) {
	err = s.slots.Do(ctx, func() error { r, err = s.db.DestinationRetries(ctx); return err })
	return r, err
}

func (s slotStore) DestinationRetryOf(ctx context.Context, destination string) (r storage.DestinationRetry, ok bool, err error) {
	err = s.slots.Do(ctx, func() error { r, ok, err = s.db.DestinationRetryOf(ctx, destination); return err })
	return r, ok, err
}

func (s slotStore) RecordDestinationFailure(ctx context.Context, r storage.DestinationRetry) error {
	return s.slots.Do(ctx, func() error { return s.db.RecordDestinationFailure(ctx, r) })
}

func (s slotStore) ResetDestination(ctx context.Context, destination string, heardAt int64) (had bool, err error) {
	err = s.slots.Do(ctx, func() error { had, err = s.db.ResetDestination(ctx, destination, heardAt); return err })
	return had, err
}

// WatchOutbound listens on a connection of its own: it takes no slot.
func (s slotStore) WatchOutbound(ctx context.Context, fn func(storage.OutboundEvent)) error {
	return s.db.WatchOutbound(ctx, fn)
}

func (s slotStore) OutboundDestinations(ctx context.Context) (d []storage.OutboundDestination, err error) {
	err = s.slots.Do(ctx, func() error { d, err = s.db.OutboundDestinations(ctx); return err })
	return d, err
}

// slotEDUs is an EDUQueue whose calls take a slot.
type slotEDUs struct {
	q     EDUQueue
	slots *slots.Slots
}

func (s slotEDUs) ToDeviceDestinations(ctx context.Context) (d []string, err error) {
	err = s.slots.Do(ctx, func() error { d, err = s.q.ToDeviceDestinations(ctx); return err })
	return d, err
}

func (s slotEDUs) PendingToDevice(ctx context.Context, destination string, limit int) (e []storage.OutboundEDU, err error) {
	err = s.slots.Do(ctx, func() error { e, err = s.q.PendingToDevice(ctx, destination, limit); return err })
	return e, err
}

func (s slotEDUs) MarkToDeviceSent(ctx context.Context, destination string, sent []storage.OutboundEDU) error {
	return s.slots.Do(ctx, func() error { return s.q.MarkToDeviceSent(ctx, destination, sent) })
}

// slotPDUs is a PDUQueue whose calls take a slot.
type slotPDUs struct {
	q     PDUQueue
	slots *slots.Slots
}

func (s slotPDUs) PDUDestinations(ctx context.Context) (d []string, err error) {
	err = s.slots.Do(ctx, func() error { d, err = s.q.PDUDestinations(ctx); return err })
	return d, err
}

func (s slotPDUs) PendingPDUs(ctx context.Context, destination string, limit int) (p []storage.OutboundPDU, err error) {
	err = s.slots.Do(ctx, func() error { p, err = s.q.PendingPDUs(ctx, destination, limit); return err })
	return p, err
}

func (s slotPDUs) MarkPDUsSent(ctx context.Context, destination string, sent []storage.OutboundPDU) error {
	return s.slots.Do(ctx, func() error { return s.q.MarkPDUsSent(ctx, destination, sent) })
}
