package storage

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
)

// ErrRoomMoved is returned by a room write built on forward extremities
// the room no longer has (another write came first): the caller builds
// its events again on the new ones.
var ErrRoomMoved = errors.New("storage: the room changed under the write")

// ErrTxnDone is returned by a room write whose client transaction
// (RoomWrite.Txn) has its event already: RoomTxnEvent names it, and the
// write changed nothing.
var ErrTxnDone = errors.New("storage: the client transaction has its event already")

// ErrExists is returned when a unique name (a room alias) is taken.
var ErrExists = errors.New("storage: already exists")

// Room is what the store keeps about a room besides its events.
type Room struct {
	RoomID      string
	RoomVersion string
	Creator     string
	Published   bool
	// Depth is the greatest depth of the room's events.
	Depth int64
	// Extremities are the room's forward extremities: the prev_events of
	// its next event.
	Extremities []string
	// StateSnapshot names the snapshot of the room's current state (the
	// state after Extremities). Snapshots never change: what is read of
	// one may be kept.
	StateSnapshot int64
	// Head changes with every write to the room (a random number): a write
	// built on this read names it (RoomWrite.Head).
	Head int64
}

// RoomEvent is a stored event of a room.
type RoomEvent struct {
	EventID  string
	RoomID   string
	Type     string
	StateKey *string // nil for a message (non-state) event
	Sender   string
	Depth    int64
	// RoomVersion decides how JSON is read (event ID format, redaction).
	RoomVersion string
	JSON        []byte // the PDU as signed, in federation format
	// Membership is the content's membership of an m.room.member event.
	Membership string
	// Pos is the event's stream position (0 for an outlier).
	Pos StreamPos
	// StateBefore is the snapshot of the room's state before the event
	// (0 for an outlier): what history visibility is judged by.
	StateBefore int64
	// Outlier: stored without the state before it; Rejected: failed the
	// auth rules (kept so it is not fetched again, never served to
	// clients); SoftFailed: allowed by the state before it but not by the
	// room's current state (in the graph, hidden from clients).
	Outlier, Rejected, SoftFailed bool
}

// RoomWrite is a linear chain of new events of one room, each authorised
// against the state before it, written in one transaction with what they
// change: the room's state and extremities, memberships for device lists,
// and the /sync stream.
type RoomWrite struct {
	// Create is set for a new room; it is inserted with the events.
	Create *Room
	RoomID string
	// Extremities are those the first event was built on; the write fails
	// with ErrRoomMoved when the room's differ.
	Extremities []string
	// Head, when not zero, is the room's head the events were built on
	// (Room.Head, or the NewHead of a write started before this one): the
	// write fails with ErrRoomMoved when the room's differs, and then
	// Extremities and StateSnapshot are taken as what goes with it rather
	// than read back. Zero: the write reads the room and compares
	// Extremities.
	Head          int64
	StateSnapshot int64
	// NewHead is the room's head after the write; zero: a new one
	// (NewRoomHead).
	NewHead int64
	Events  []RoomEvent
	// Alias, when set, is created with the room (ErrExists when taken).
	Alias string
	// Txn, when set, records the last event as the result of a client's
	// transaction; the write fails with ErrTxnDone when it has one.
	Txn *RoomTxn
	// Redactions replace events' JSON by their redacted form.
	Redactions []RoomRedaction
	// Federate queues the events for the other servers in the room (our
	// own events: every local write sets it), in the same transaction.
	Federate bool
	Now      int64 // milliseconds
}

// RoomRedaction is an event of a room redacted: its JSON from now on.
type RoomRedaction struct {
	EventID, RoomID string
	JSON            []byte
}

// RoomTxn names a client's request: one device, one path.
type RoomTxn struct {
	UserID, DeviceID, Path string
}

// RoomWriteResult is what a room write did.
type RoomWriteResult struct {
	Change
	// NewlyStale are remote users now tracked whose lists, cached while
	// they were not, must be fetched again.
	NewlyStale []StaleUser
	// PDUsQueued says events were queued for other servers: the sender
	// has work.
	PDUsQueued bool
	// DeviceUpdatesQueued says a local user's devices were queued for
	// servers that newly share a room with them (a join).
	DeviceUpdatesQueued bool
	// Head and StateSnapshot are the room's after the write (Room's).
	Head, StateSnapshot int64
}

// OutboundPDU is one of our events queued for another server; ID orders
// the destination's queue.
type OutboundPDU struct {
	ID          int64
	Destination string
	EventID     string
	JSON        json.RawMessage // the PDU as stored
}

// RoomMember is a user's current membership of a room, with the event
// that set it and that event's stream position.
type RoomMember struct {
	RoomID, UserID, Membership string
	EventID                    string
	Pos                        StreamPos
}

// RoomAlias is an alias and the room it names.
type RoomAlias struct {
	Alias, RoomID, Creator string
}

// StateKey names a piece of a room's state.
type StateKey struct {
	Type, StateKey string
}

// RoomIngest is a write of events that are not a local chain built on
// the room's current state: other servers' events, the state and auth
// chain of a join over federation, an invite to a room this server is not
// in. It is one transaction, like RoomWrite.
type RoomIngest struct {
	RoomID string
	// Create inserts the room's record when the room is unknown; a known
	// room keeps its own.
	Create *Room
	// Outliers are stored first, without state; events already stored
	// stay as they are.
	Outliers []RoomEvent
	// Event, when set, is placed in the room: with the state before it
	// (the state after the event StateAfter, or exactly the events
	// StateBefore, one per key) and a stream position. Its Rejected flag
	// stores it without either; a SoftFailed one gets both but is hidden
	// from clients. An event stored before as an outlier is placed now.
	Event       *RoomEvent
	StateAfter  string
	StateBefore []string
	// NewExtremities, when not nil, replace the room's extremities; the
	// write then fails with ErrRoomMoved unless the room's extremities are
	// still Extremities (those the write was decided on).
	Extremities, NewExtremities []string
	// The room's current state becomes the state after Event when
	// CurrentAfterEvent, exactly the events CurrentState when not nil, or
	// takes the events PutState in place of those with their keys.
	CurrentAfterEvent bool
	CurrentState      []string
	PutState          []string
	// Federate sends Event on to the room's other servers but SkipServers
	// (a join or leave this server was the resident for), as a local
	// write's Federate does; not when it is rejected or soft-failed.
	Federate    bool
	SkipServers []string
	// Redactions replace events' JSON by their redacted form.
	Redactions []RoomRedaction
	Now        int64 // milliseconds
	// HistoryPos, when not zero (negative), places Event as history
	// fetched from other servers (backfill): at that stream position,
	// below the room's timeline, where /sync never reads and /messages
	// paging back does. The room's current state, extremities and head
	// stay as they are, and nothing is sent on.
	HistoryPos StreamPos
}

// NewRoomHead is a new head for a room (Room.Head): random, so that no two
// writes of a room, on any daemon, make the same; never zero.
func NewRoomHead() int64 {
	for {
		if h := rand.Int64(); h != 0 {
			return h
		}
	}
}

// PublishedRoom is a room of the public room directory with its number of
// joined members.
type PublishedRoom struct {
	RoomID        string
	JoinedMembers int
}
