package storage

import (
	"context"
	"encoding/json"
)

// Presence is a user's presence as the server keeps it, local or remote
// (times in Unix milliseconds, 0 when never).
type Presence struct {
	UserID string
	// State is "online", "unavailable" or "offline".
	State string
	// StatusMsg is the user's status message; "" for none.
	StatusMsg string
	// LastActiveTS is when the user was last active; LastUserSyncTS when
	// their last /sync ends at the latest (local users); and
	// LastFederationUpdateTS when the state was last sent to other
	// servers (local users) or received from the user's server (remote
	// users).
	LastActiveTS, LastUserSyncTS, LastFederationUpdateTS int64
	CurrentlyActive                                      bool
	// Pos is the stream position of the last change clients were told of.
	Pos StreamPos
}

// PresenceWrite is what a decision about a user's presence writes.
type PresenceWrite struct {
	// Presence is the new state, written when Write is set.
	Presence Presence
	Write    bool
	// Notify makes it a change clients see: it takes a new stream
	// position, and the /sync requests of the local users sharing a room
	// with the user (and the user's own) wake.
	Notify bool
	// Federate, when not nil, is the user's entry of an m.presence EDU's
	// push list, queued for every other server with a user joined to a
	// room the user is joined to.
	Federate json.RawMessage
}

// PresenceDue bounds the presence rows that may have timed out (each a
// Unix ms time; a row is due when one of its times is before its bound).
type PresenceDue struct {
	// Local users': a /sync that ended, an activity that makes them idle
	// or no longer currently active, the state last sent to other servers.
	SyncBefore, IdleBefore, ActiveBefore, PingBefore int64
	// Remote users': the last update their server sent.
	RemoteBefore int64
}

// PresenceStore keeps the users' presence and the m.presence EDUs queued
// for other servers.
type PresenceStore interface {
	// Presence returns the stored presence of the given users that have
	// one.
	Presence(ctx context.Context, userIDs []string) (map[string]Presence, error)
	// UpdatePresence writes what decide makes of the user's stored
	// presence (stored false: none yet, prev is offline), in one
	// transaction that holds the user's row, so that daemons sharing the
	// database decide one after the other. It returns the change (Pos 0
	// when clients are told nothing) and whether EDUs were queued.
	UpdatePresence(ctx context.Context, userID string, decide func(prev Presence, stored bool) PresenceWrite) (Change, bool, error)
	// PresenceChanges returns the presence of userID and of the users
	// joined to a room userID is joined to whose last change is in
	// (from, to], and of those (not offline) who began to share a room
	// with userID in the range; from 0 returns every such presence up to
	// to that is not offline.
	PresenceChanges(ctx context.Context, userID string, from, to StreamPos) ([]Presence, error)
	// DuePresence lists up to limit users whose presence may have timed
	// out (see PresenceDue); offline ones never are.
	DuePresence(ctx context.Context, due PresenceDue, limit int) ([]string, error)
	// ShareJoinedRoom reports whether two users are joined to a common
	// room.
	ShareJoinedRoom(ctx context.Context, a, b string) (bool, error)

	// JoinsIn returns the joins written in (from, to] (the memberships
	// whose last change is there).
	JoinsIn(ctx context.Context, from, to StreamPos) ([]RoomMember, error)
	// RoomLocalPresence returns the stored presence of the local users
	// joined to a room.
	RoomLocalPresence(ctx context.Context, roomID string) ([]Presence, error)
	// QueuePresence queues push entries (by user) for destinations, each
	// replacing an unsent older one of its user.
	QueuePresence(ctx context.Context, destinations []string, entries map[string]json.RawMessage) error

	// PresenceDestinations, PendingPresence and MarkPresenceSent are the
	// queue of presence for other servers: one entry of an m.presence
	// push list per destination and user, the newest replacing an unsent
	// older one.
	PresenceDestinations(ctx context.Context) ([]string, error)
	PendingPresence(ctx context.Context, destination string, limit int) ([]OutboundEDU, error)
	MarkPresenceSent(ctx context.Context, destination string, sent []OutboundEDU) error
}
