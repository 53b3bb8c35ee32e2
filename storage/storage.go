// Package storage defines what the keyserver keeps in its database: the
// records, the errors every backend reports in the same way, and the
// storage areas (areas.go), one interface each, that Database embeds: a
// consumer takes the areas it uses by name, or declares the few methods it
// uses itself.
//
// One implementation (package sqlstore) serves both SQLite and PostgreSQL;
// the dialect differences live in packages sqlite3 and postgres.
package storage

import (
	"encoding/json"
	"errors"
	"sync/atomic"
)

// Sentinel errors, shared by every backend so callers never inspect driver
// errors.
var (
	// ErrNotFound is returned when the named row does not exist.
	ErrNotFound = errors.New("storage: not found")
	// ErrUserExists is returned when an account with that user ID exists.
	ErrUserExists = errors.New("storage: user exists")
	// ErrDeactivated is returned for an account that was deactivated.
	ErrDeactivated = errors.New("storage: account deactivated")
	// ErrDeviceExists is returned when a device ID is taken already.
	ErrDeviceExists = errors.New("storage: device exists")
	// ErrTooNew is returned when the database schema is newer than this binary.
	ErrTooNew = errors.New("storage: database schema is newer than this program")
)

// StreamPos is a position in the server-wide stream of device-list and
// membership changes. Positions are strictly increasing and become visible
// in order, so "everything up to P" is a consistent cut. /sync tokens are
// built from them.
type StreamPos int64

// Change is what a write did to the stream: the position of its last
// change (0 when it changed nothing) and the local users it concerns,
// whose /keys/changes or /sync device_lists it may enter (a superset; no
// one else's). Waiting /sync requests of other users need not look.
// Users is sorted, and may be shared with other changes: read only.
type Change struct {
	Pos   StreamPos
	Users []string
}

// Device is one of a local user's devices.
type Device struct {
	UserID      string
	DeviceID    string
	DisplayName *string // nil when never set
	// KeyJSON is the device's identity keys (DeviceKeys) as canonical JSON
	// without "unsigned", or nil when the device has not uploaded keys.
	KeyJSON    []byte
	LastSeenIP string
	LastSeenTS int64 // milliseconds
}

// NewLogin describes a device being logged in (by /register or /login)
// together with the access token issued for it.
type NewLogin struct {
	UserID      string
	DeviceID    string
	DisplayName *string // only used when the device is created
	TokenHash   string
	IP          string
	TS          int64 // milliseconds
}

// LoginResult tells what a login did.
type LoginResult struct {
	DeviceCreated bool
	Change        // the device-list change, Pos 0 if none
}

// UIASession is a user-interactive auth session and the request it was
// started for, as a hash (see the keyserver package).
type UIASession struct {
	ID          string
	UserID      string // "" for a registration
	RequestHash string
	ExpiresTS   int64 // milliseconds
}

// Key is a one-time or fallback key of a device.
type Key struct {
	Algorithm string // e.g. "signed_curve25519"
	KeyID     string // the part after the algorithm, e.g. "AAAAHg"
	JSON      []byte // the key object (or bare string) as canonical JSON
}

// FullID returns "<algorithm>:<key id>", the name clients use.
func (k Key) FullID() string { return k.Algorithm + ":" + k.KeyID }

// FallbackKey is a device's fallback key for one algorithm.
type FallbackKey struct {
	Key
	Used bool
}

// KeyState is what the database holds for a device when an upload starts;
// the domain layer decides from it, inside the upload's transaction, what to
// write.
type KeyState struct {
	DeviceKeys []byte // canonical JSON, nil if none
	// ExistingOneTimeKeys maps FullID to stored JSON for the IDs the upload
	// names that are already stored and unclaimed.
	ExistingOneTimeKeys map[string][]byte
	// Counts of unclaimed one-time keys per algorithm.
	Counts map[string]int
	// Fallback keys per algorithm.
	Fallback map[string]FallbackKey
}

// KeyWrite is what an upload writes, decided from a KeyState.
type KeyWrite struct {
	DeviceKeys   []byte // new canonical device keys, nil to leave unchanged
	OneTimeKeys  []Key  // new one-time keys, stored in this order
	FallbackKeys []Key  // fallback keys replacing the stored ones, unused
}

// UploadResult is the state after an upload.
type UploadResult struct {
	Counts map[string]int // unclaimed one-time keys per algorithm
	Change                // the device-list change, Pos 0 if none
	Stored int            // one-time keys this upload stored
}

// ClaimRequest names one key to claim.
type ClaimRequest struct {
	UserID, DeviceID, Algorithm string
}

// ClaimedKey is a key handed out by a claim.
type ClaimedKey struct {
	UserID, DeviceID string
	Key              Key
	Fallback         bool // true when the fallback key was handed out
}

// DeviceListChanges answers "whose device lists changed" for one user
// between two stream positions.
type DeviceListChanges struct {
	Changed []string
	Left    []string
}

// SyncQuery asks for what the stream holds for one /sync answer of a
// device: the parts of (Since, Pos], Pos being the newest position when
// it is read.
type SyncQuery struct {
	UserID, DeviceID string
	// Since is the answer's token position; 0 for an initial sync, which
	// has no device-list changes and all of the user's account data.
	Since StreamPos
	// ToDeviceAfter is the position up to which the device received its
	// to-device messages; at most ToDeviceLimit are returned after it.
	ToDeviceAfter StreamPos
	ToDeviceLimit int
}

// SyncData is what the stream holds for one /sync answer, read at once
// from one snapshot of the database: every part stops at Pos.
type SyncData struct {
	Pos         StreamPos
	DeviceLists DeviceListChanges // empty lists for an initial sync
	// OneTimeKeyCounts and UnusedFallbackKeyTypes are the device's (now).
	OneTimeKeyCounts       map[string]int
	UnusedFallbackKeyTypes []string
	// AccountData are the user's account data changes in the range, in
	// the order of the changes (as AccountDataChanges returns them).
	AccountData []AccountData
	// ToDevice are the device's oldest messages in (ToDeviceAfter, Pos].
	ToDevice []ToDeviceMessage
	// RoomMemberships are the user's room memberships (as
	// UserRoomMemberships returns them); RoomsWithEvents the rooms of
	// any membership of the user's with an event in the range (Since 0:
	// any event), sorted.
	RoomMemberships []RoomMember
	RoomsWithEvents []string
	// Receipts are the receipts in the range of the rooms the user is
	// joined to (Since 0: all of them), private ones only the user's
	// own; TypingRooms the rooms the user is joined to whose typing
	// changed in the range (Since 0: any typing ever), sorted, and Typing
	// who is typing in them, ended or not.
	Receipts    []Receipt
	TypingRooms []string
	Typing      []TypingUser
}

// ServerKey is another server's signing key.
type ServerKey struct {
	ServerName   string
	KeyID        string
	PublicKey    string // unpadded base64
	ValidUntilTS int64  // milliseconds
	ExpiredTS    int64  // 0 while current
}

// RemoteDevice is a cached device of a remote user.
type RemoteDevice struct {
	DeviceID    string
	DisplayName *string
	KeyJSON     []byte // canonical DeviceKeys as the remote server gave them
}

// RemoteDeviceList is what is cached of a remote user's device list.
type RemoteDeviceList struct {
	UserID    string
	StreamID  int64
	FetchedTS int64
	// Stale is set when the list may be out of date: it must be fetched
	// again before it is trusted.
	Stale bool
	// SharesRoom is true when some local user shares a room with the user,
	// so the user's server sends us their changes.
	SharesRoom bool
	Devices    []RemoteDevice
	// CrossSigning maps UsageMaster and UsageSelfSigning to the user's
	// keys as canonical JSON, when their server gave them.
	CrossSigning map[string][]byte
	// Signatures are those local users made on the user's master key with
	// their user-signing keys (each visible to its signer only).
	Signatures []CrossSigningSignature
}

// MembershipResult tells what a membership change did.
type MembershipResult struct {
	Change
	NewlyStale []StaleUser
	// DeviceUpdatesQueued says a local user's devices were queued for
	// servers that newly share a room with them: the sender has work.
	DeviceUpdatesQueued bool
}

// RemoteDeviceUpdate is a checked m.device_list_update.
type RemoteDeviceUpdate struct {
	UserID      string
	DeviceID    string
	StreamID    int64
	PrevIDs     []int64
	Deleted     bool
	KeyJSON     []byte // canonical device keys; nil when the update has none
	DisplayName *string
	// ResyncHoldUntil: when the update leaves the user stale, the
	// receiver resyncs at once and holds the resync until then (see
	// HoldResync).
	ResyncHoldUntil int64
}

// ApplyOutcome is what became of a remote update.
type ApplyOutcome int

// The outcomes of ApplyRemoteDeviceUpdate.
const (
	Applied    ApplyOutcome = iota // the change is in the cache
	Duplicate                      // seen before: nothing to do
	NeedResync                     // a gap: the user was marked stale
	// NotCached: no list of the user is cached, so there is nothing to
	// apply the update to; it is a change for the local users sharing a
	// room with the user, whose clients fetch the list when they need it.
	NotCached
)

// ApplyResult is the outcome of an update and the position of the change
// it made for local clients (0 when none).
type ApplyResult struct {
	Outcome ApplyOutcome
	Change
}

// StaleUser is a remote user waiting for a resync.
type StaleUser struct {
	UserID     string
	ServerName string
	Attempts   int
	RetryAtTS  int64
	// ResyncUntil: a resync holds the user until then (see HoldResync).
	ResyncUntil int64
}

// OutboundUpdate is a pending device-list update for one destination, with
// the device's state now (it is sent as the newest state, so only the
// newest pending update of a device is ever sent).
type OutboundUpdate struct {
	UserID      string
	DeviceID    string
	StreamID    int64
	PrevID      int64 // 0: none
	Deleted     bool  // the device no longer exists
	KeyJSON     []byte
	DisplayName *string
	// Signatures are those the user made on their own keys (on devices and
	// on the master key), stored apart from KeyJSON and MasterKey: what
	// other servers are shown of them. The update's device or master key is
	// sent with the ones on it.
	Signatures []CrossSigningSignature

	// SigningKeys marks an update of the user's master and self-signing
	// keys (an m.signing_key_update) instead of a device's: DeviceID,
	// PrevID, Deleted, KeyJSON and DisplayName are unset, and its StreamID
	// is outside the chain of device-list stream_ids. Only the newest
	// pending one of a user is kept, and it carries the keys now.
	SigningKeys bool
	// MasterKey and SelfSigningKey are the user's keys now (nil: none).
	MasterKey, SelfSigningKey []byte
}

// The usages of a user's cross-signing keys, which are also the slots they
// are stored in: a user has at most one key of each.
const (
	UsageMaster      = "master"
	UsageSelfSigning = "self_signing"
	UsageUserSigning = "user_signing"
)

// CrossSigningSignature is a signature uploaded apart from the object it
// signs (POST /keys/signatures/upload): on a device's keys or on a master
// key, by a device or a cross-signing key.
type CrossSigningSignature struct {
	TargetUserID string
	// TargetKeyID is the device ID, or the signed master key's public key.
	TargetKeyID  string
	SignerUserID string
	SignerKeyID  string // "ed25519:<device ID or public key>"
	Signature    string // unpadded base64
}

// CrossSigning is what is stored of a local user's cross-signing keys.
type CrossSigning struct {
	// Keys maps a usage (UsageMaster...) to the key object as canonical
	// JSON, with the signatures it was uploaded with.
	Keys map[string][]byte
	// Signatures are those uploaded on the user's devices and master key,
	// by anyone; who may see which is the domain's rule.
	Signatures []CrossSigningSignature
}

// UserKeys is what a key query shows of a local user.
type UserKeys struct {
	Devices []Device // the devices with identity keys
	CrossSigning
	// Derived keeps what the domain builds from these keys for its
	// answers, so that it is built once per value: a value the store
	// caches is read by every query naming the user until their keys
	// change, and a change makes a new value.
	Derived atomic.Value
}

// CrossSigningWrite is what an upload of cross-signing keys writes,
// decided from the stored keys.
type CrossSigningWrite struct {
	// Keys maps a usage to its new key object; usages not named are kept.
	Keys map[string][]byte
}

// Membership values.
const (
	MembershipJoin  = "join"
	MembershipLeave = "leave"
	// MembershipInvite shares the room like a join for device lists.
	MembershipInvite = "invite"
)

// ToDeviceMessage is a to-device message waiting in a local device's
// inbox; Pos orders the inbox.
type ToDeviceMessage struct {
	Pos     StreamPos
	Sender  string
	Type    string
	Content json.RawMessage
}

// ToDeviceSend is one send of to-device messages, stored in one
// transaction: the messages of local devices, and EDUs for other servers.
type ToDeviceSend struct {
	// Origin and DeviceID name the sender for idempotency: a local user
	// and device, or a server (DeviceID empty); TxnID (the client's
	// transaction ID or the EDU's message_id) is stored once per origin
	// and device, and a send that repeats one stores nothing.
	Origin, DeviceID, TxnID string
	Sender, Type            string
	// Local maps local users to their devices ("*": every device) to the
	// content; unknown users and devices are skipped.
	Local map[string]map[string]json.RawMessage
	// Remote are the m.direct_to_device EDUs queued for other servers.
	Remote []OutboundEDU
	Now    int64
}

// DestinationRetry is a failing destination's retry state: the failed
// attempts since a delivery last got through or it was last heard from,
// when the first of them failed, and when the next is due (Unix ms).
type DestinationRetry struct {
	Destination  string
	Attempts     int
	FailingSince int64
	RetryAt      int64
	// RecordedAt is when the last failure was stored (ms).
	RecordedAt int64
}

// OutboundDestination is a destination with work or failures: what waits
// for it (device-list and signing-key updates, to-device EDUs, room
// events), its retry state (zero when it is not failing) and who holds its
// lease (LeaseExpires 0: the holder waits to retry and anyone may take it).
type OutboundDestination struct {
	Destination       string
	Updates, ToDevice int
	PDUs              int
	Retry             DestinationRetry
	LeaseOwner        string
	LeaseExpires      int64
}

// OutboundEvent is news about a destination from a daemon sharing the
// database (OutboundReleased or OutboundAlive).
type OutboundEvent struct {
	Kind        string
	Destination string
}

// The kinds of OutboundEvent.
const (
	// OutboundReleased: a lease on the destination was given up.
	OutboundReleased = "released"
	// OutboundHandedOver: a lease was given up with work left for others.
	OutboundHandedOver = "handover"
	// OutboundAlive: the destination's failures were forgotten (it was
	// reached or heard from, or an operator asked for a retry).
	OutboundAlive = "alive"
)

// OutboundEDU is an EDU queued for another server; ID orders the queue.
type OutboundEDU struct {
	ID          int64
	Destination string
	// Type is the EDU's type; "" for m.direct_to_device.
	Type    string
	Content json.RawMessage
}

// Profile is a user's public profile; an empty field is not set.
type Profile struct {
	DisplayName string `json:"displayname,omitempty"`
	AvatarURL   string `json:"avatar_url,omitempty"`
}

// DirectoryUser is a user the user directory can find.
type DirectoryUser struct {
	UserID, DisplayName, AvatarURL string
}
