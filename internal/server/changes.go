package server

import (
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/syncnotify"
)

// changes passes on the committed changes of the domains that write the
// stream (rooms, to-device messages, account data, dehydrated devices):
// the waiting /sync requests they concern wake, and the background
// workers look at their queues again. It is built before the domains, of
// parts that need none of them.
type changes struct {
	notifier *syncnotify.Notifier
	outbound interface{ Poke() } // nil: nothing is sent to other servers
	stale    interface{ Wake() } // nil: no background resyncs
}

// StreamAdvanced wakes the waiting /sync requests a change concerns (Pos
// 0: nothing changed). Other daemons sharing the database hear of it from
// the database.
func (c changes) StreamAdvanced(ch storage.Change) {
	if ch.Pos > 0 {
		c.notifier.StreamAdvanced(ch.Users)
	}
}

// OutboundQueued says EDUs were queued for other servers (to-device
// messages): the outbound queue reads its queue again soon.
func (c changes) OutboundQueued() {
	if c.outbound != nil {
		c.outbound.Poke()
	}
}

// DeviceListChanged follows a local device-list change committed outside
// the keys domain (dehydrated devices): the waiting /sync requests it
// concerns are told, and the updates queued for other servers are sent.
func (c changes) DeviceListChanged(ch storage.Change) {
	c.StreamAdvanced(ch)
	if ch.Pos > 0 {
		c.OutboundQueued()
	}
}

// MembershipChanged follows a committed change of memberships (a
// deactivated user leaving their rooms): the waiting /sync requests of
// the local users concerned wake, and remote lists cached while untracked
// are fetched again.
func (c changes) MembershipChanged(ch storage.Change, newlyStale []storage.StaleUser) {
	c.StreamAdvanced(ch)
	if len(newlyStale) > 0 && c.stale != nil {
		c.stale.Wake()
	}
}

// RoomWritten follows a committed write of room events: membership events
// in it changed who shares a room with whom in the same transaction. The
// waiting /sync requests of the local users concerned wake, remote lists
// cached while untracked are fetched again, and the events and device-list
// updates (a local user's join announced) queued for other servers are
// sent.
func (c changes) RoomWritten(res storage.RoomWriteResult) {
	c.MembershipChanged(res.Change, res.NewlyStale)
	if res.PDUsQueued || res.DeviceUpdatesQueued {
		c.OutboundQueued()
	}
}
