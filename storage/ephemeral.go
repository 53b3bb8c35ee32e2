package storage

import (
	"context"
	"encoding/json"
)

// Receipts and typing: what the rooms' ephemeral events of /sync are made
// of. Both take stream positions, so that a /sync token covers them and a
// waiting request wakes for them, also on another daemon of the database.

// ReceiptPrivate is the receipt type only its owner sees.
const ReceiptPrivate = "m.read.private"

// Receipt is a user's receipt in a room: of one type, for one thread
// ("" unthreaded, "main", or a thread root's event ID).
type Receipt struct {
	RoomID, Type, UserID, ThreadID string
	EventID                        string
	// EventPos is the event's stream position (0: the event is not known
	// here, as for a remote receipt that came before its event).
	EventPos StreamPos
	TS       int64 // milliseconds
	Pos      StreamPos
}

// Receipts are the users' receipts in rooms.
type Receipts interface {
	// StoreReceipt stores a receipt at a new stream position and queues
	// edu (an m.receipt EDU's content; nil: none) for the other servers
	// with a member joined to the room, in one transaction. A receipt for an event
	// before the one of the stored receipt of the same room, type, user
	// and thread (both events known) changes nothing: stored false. The
	// change concerns the room's local members (the owner alone for a
	// private receipt).
	StoreReceipt(ctx context.Context, r Receipt, edu json.RawMessage) (_ Change, stored bool, _ error)
	// RoomReceipts returns a room's receipts, sorted by user, type and
	// thread.
	RoomReceipts(ctx context.Context, roomID string) ([]Receipt, error)
}

// TypingUser is a user typing in a room until ExpiresTS (milliseconds).
type TypingUser struct {
	RoomID, UserID string
	ExpiresTS      int64
}

// TypingUpdate starts (Typing) or stops a user's typing in a room.
type TypingUpdate struct {
	RoomID, UserID string
	Typing         bool
	// ExpiresTS is when a started typing ends (milliseconds).
	ExpiresTS int64
	// Now (milliseconds): a typing that ended before it counts as
	// stopped.
	Now int64
	// ExpiredBy, for a stop: only a typing that ends at or before it is
	// stopped (one started again meanwhile stays).
	ExpiredBy int64
	// EDU is an m.typing EDU's content queued with the change for the
	// other servers with a member joined to the room (not when nothing
	// changed); nil: none.
	EDU json.RawMessage
	// ResendAfter (ms, 0: never): a start of a typing that runs queues
	// EDU again when it was last queued at least this long before Now,
	// so that other servers, which end it a while after the last EDU,
	// keep it.
	ResendAfter int64
}

// Typing is who is typing in which room.
type Typing interface {
	// SetTyping starts or stops a typing in one transaction. Starting one
	// that runs already only moves its end; stopping one that does not
	// run does nothing. Either way only a change of who is typing takes a
	// stream position (Pos 0 otherwise), concerning the room's local
	// members, and queues the EDUs.
	// queued reports whether the EDU was queued (a resend too).
	SetTyping(ctx context.Context, u TypingUpdate) (_ Change, queued bool, _ error)
	// ExpiredTyping returns the typings that ended at or before now.
	ExpiredTyping(ctx context.Context, now int64) ([]TypingUser, error)
	// TypingToResend returns the typings running at now whose EDU was
	// queued, last at or before sentBefore.
	TypingToResend(ctx context.Context, sentBefore, now int64) ([]TypingUser, error)
	// NextTypingWork returns the earliest end of a typing, or resend of
	// its EDU resendAfter ms after the last one (ok false: none).
	NextTypingWork(ctx context.Context, resendAfter int64) (at int64, ok bool, err error)
	// RoomTyping returns who is typing in a room at now, sorted.
	RoomTyping(ctx context.Context, roomID string, now int64) ([]string, error)
}
