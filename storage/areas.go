package storage

import (
	"context"
)

// The storage areas: what the database keeps, grouped by what it is for.
// Database embeds them all. Every method that writes more than one row
// does so in one transaction.

// Database is everything the keyserver stores.
type Database interface {
	Accounts
	UIASessions
	Devices
	DehydratedDevices
	Keys
	CrossSigningKeys
	Stream
	Memberships
	ServerKeys
	RemoteDeviceLists
	StaleQueue
	OutboundUpdates
	OutboundToDevice
	OutboundPDUs
	OutboundLeases
	DestinationRetries
	QueueDepths
	InboundTransactions
	ToDeviceInbox
	AccountDataStore
	KeyBackups
	Profiles
	UserDirectory
	Rooms
	Relations
	RoomAliases
	RoomDirectory
	SearchIndex
	SyncFilters
	Health
	PresenceStore
	Receipts
	Typing
}

// Accounts are the local users' accounts and passwords.
type Accounts interface {
	CreateAccount(ctx context.Context, userID, passwordHash string, login *NewLogin) (LoginResult, error)
	AccountExists(ctx context.Context, userID string) (bool, error)
	// PasswordHash returns the user's password hash, ErrNotFound without an
	// account, ErrDeactivated when it was deactivated.
	PasswordHash(ctx context.Context, userID string) (string, error)
	// ChangePassword sets the user's password hash and, with logoutOthers,
	// deletes every device but keepDevice (as DeleteDevices does), in one
	// transaction. It returns the device-list change.
	ChangePassword(ctx context.Context, userID, passwordHash, keepDevice string, logoutOthers bool) (Change, error)
	// DeactivateAccount deletes everything of the user (devices, tokens,
	// keys, sessions) and marks the account deactivated, with an empty
	// password hash so that its ID stays taken, in one transaction. It
	// returns the device-list change.
	DeactivateAccount(ctx context.Context, userID string, now int64) (Change, error)
}

// UIASessions are the user-interactive auth sessions, shared by the
// daemons using the database.
type UIASessions interface {
	// CreateUIASession also deletes the sessions expired at now.
	CreateUIASession(ctx context.Context, session UIASession, now int64) error
	// UIASession returns a session, ErrNotFound when it is unknown or
	// expired at now.
	UIASession(ctx context.Context, sessionID string, now int64) (UIASession, error)
	// ConsumeUIASession deletes a completed session; false when it was
	// gone already (another request completed it).
	ConsumeUIASession(ctx context.Context, sessionID string) (bool, error)
}

// Devices are the local users' devices and access tokens.
type Devices interface {
	// Login logs a device in; ErrDeactivated when the account was
	// deactivated meanwhile.
	Login(ctx context.Context, login NewLogin) (LoginResult, error)
	TokenOwner(ctx context.Context, tokenHash string) (userID, deviceID string, err error)
	Devices(ctx context.Context, userID string) ([]Device, error)
	Device(ctx context.Context, userID, deviceID string) (Device, error)
	SetDeviceDisplayName(ctx context.Context, userID, deviceID, name string) (Change, error)
	// DeleteDevices deletes the named devices (all of the user's when
	// deviceIDs is nil) with their tokens and keys, and returns the IDs that
	// existed and the change (Pos 0 when none existed).
	DeleteDevices(ctx context.Context, userID string, deviceIDs []string) ([]string, Change, error)
	// UserDeviceList returns what /user/devices reports for a local user:
	// the position of their newest device-list change, then their devices
	// with keys, both read from the database and never from a cache.
	UserDeviceList(ctx context.Context, userID string) (int64, []Device, error)
}

// DehydratedDevices are the users' dehydrated devices (one each at most).
type DehydratedDevices interface {
	CreateDehydratedDevice(ctx context.Context, userID, deviceID, displayName string, now int64) (Change, error)
	SetDehydratedDevice(ctx context.Context, userID, deviceID string, data []byte) (Change, error)
	// DehydratedDevice returns the user's dehydrated device's ID and data.
	DehydratedDevice(ctx context.Context, userID string) (string, []byte, error)
	DeleteDehydratedDevice(ctx context.Context, userID string) (string, Change, error)
}

// Keys are the devices' identity, one-time and fallback keys.
type Keys interface {
	UploadKeys(ctx context.Context, userID, deviceID string, oneTimeKeyIDs []string,
		decide func(KeyState) (KeyWrite, error)) (UploadResult, error)
	// DevicesWithKeys returns the devices of the given users that have
	// uploaded identity keys, in at most one round trip. The devices may be
	// shared with a cache: callers must not modify them.
	DevicesWithKeys(ctx context.Context, userIDs []string) ([]Device, error)
	ClaimKeys(ctx context.Context, reqs []ClaimRequest) ([]ClaimedKey, error)
}

// CrossSigningKeys are the local users' cross-signing keys and the
// signatures uploaded apart from the objects they sign.
type CrossSigningKeys interface {
	// UserKeys returns, for each of the given local users that has
	// anything, the devices with identity keys, the cross-signing keys and
	// the signatures on them, in at most one round trip. The values may be
	// shared with a cache: callers must not modify them.
	UserKeys(ctx context.Context, userIDs []string) (map[string]*UserKeys, error)
	// UserCrossSigning returns a user's cross-signing keys and the
	// signatures on them, read from the database and never from a cache.
	UserCrossSigning(ctx context.Context, userID string) (CrossSigning, error)
	// UploadCrossSigningKeys stores a user's cross-signing keys as decide
	// says, given the stored ones (usage -> canonical JSON), in one
	// transaction. A key that differs from the stored one is a change:
	// a master or self-signing key one for everyone sharing a room with
	// the user, a user-signing key one for the user alone. It returns the
	// position of the last change, 0 when nothing changed.
	UploadCrossSigningKeys(ctx context.Context, userID string,
		decide func(stored map[string][]byte) (CrossSigningWrite, error)) (Change, error)
	// StoreSignatures stores signatures on local users' keys in one
	// transaction. A new signature on a device is a change of that device;
	// on a master key, a change of its owner's cross-signing keys (for
	// everyone sharing a room with them when the owner signed, for the
	// signer alone otherwise). Signatures already stored change nothing.
	// It returns the position of the last change, 0 when none.
	StoreSignatures(ctx context.Context, sigs []CrossSigningSignature) (Change, error)
}

// Stream is the server-wide stream of changes /sync and /keys/changes
// read.
type Stream interface {
	CurrentPos(ctx context.Context) (StreamPos, error)
	DeviceListChanges(ctx context.Context, userID string, from, to StreamPos) (DeviceListChanges, error)
	// SyncData reads what the stream holds for a /sync answer in one
	// statement, so that every part comes from the same snapshot.
	SyncData(ctx context.Context, q SyncQuery) (SyncData, error)
	// WatchStream calls advanced whenever the stream advances, also by
	// other daemons sharing the database, until ctx ends. While it runs it
	// also hears the other daemons' token revocations and device changes,
	// which is what lets a shared database's token lookups and device
	// lists be cached.
	//
	// advanced receives the local users the advance concerns, as the write
	// returned them, or nil when it may concern anyone (a notification
	// was lost, it named too many users, or the watch has just begun and
	// what came before it went unheard).
	WatchStream(ctx context.Context, advanced func(users []string)) error
}

// Memberships are who is in which room, as device lists and room lists
// see it.
type Memberships interface {
	// SetMembership records a membership; it also starts tracking remote
	// users who now share a room with a local user (marked stale, returned
	// in NewlyStale) and forgets those who no longer share any.
	SetMembership(ctx context.Context, roomID, userID, membership string, now int64) (MembershipResult, error)
	// JoinedRooms lists the rooms the user is joined to.
	JoinedRooms(ctx context.Context, userID string) ([]string, error)
	// RoomMembership returns a user's membership of a room ("" when none).
	RoomMembership(ctx context.Context, roomID, userID string) (string, error)
	// UserRoomMemberships returns a user's memberships of every room.
	UserRoomMemberships(ctx context.Context, userID string) ([]RoomMember, error)
	// SharesRoomWithLocal reports whether a local user shares a room with userID.
	SharesRoomWithLocal(ctx context.Context, userID string) (bool, error)
}

// ServerKeys are other servers' signing keys, as fetched.
type ServerKeys interface {
	ServerKeys(ctx context.Context, serverName string, keyIDs []string) ([]ServerKey, error)
	StoreServerKeys(ctx context.Context, keys []ServerKey) error
}

// RemoteDeviceLists is the cache of remote users' device lists.
type RemoteDeviceLists interface {
	// RemoteDeviceLists returns the cached lists of the users that have
	// one, in a constant number of round trips.
	RemoteDeviceLists(ctx context.Context, userIDs []string) (map[string]*RemoteDeviceList, error)
	// ReplaceRemoteDeviceList stores a freshly fetched list and clears the
	// user's stale mark. A list that differs from the cached one is a
	// device-list change (returned); an identical one is not.
	ReplaceRemoteDeviceList(ctx context.Context, list RemoteDeviceList, serverName string) (Change, error)
	MarkRemoteStale(ctx context.Context, userID, serverName string, now int64) error
	// ApplyRemoteDeviceUpdate applies one m.device_list_update, or says the
	// user must be resynced because its prev_id names an unseen update.
	ApplyRemoteDeviceUpdate(ctx context.Context, u RemoteDeviceUpdate) (ApplyResult, error)
	// UpdateRemoteCrossSigning replaces the cached cross-signing keys of a
	// remote user whose device list is cached (m.signing_key_update); keys
	// maps usages to canonical JSON, and usages not named are kept. A
	// difference is a change for local users sharing a room with the
	// user (returned position); an identical key, or a user without a
	// cached list, changes nothing.
	UpdateRemoteCrossSigning(ctx context.Context, userID string, keys map[string][]byte) (Change, error)
	// HoldResync takes a stale user's resync until a time, unless another
	// holds it: held when taken, stale when the user is still marked (a
	// user not marked was resynced meanwhile). Daemons sharing a database
	// wait for the holder's fetch rather than each sending their own.
	// ReleaseResync gives it up after a failed fetch (a successful one
	// removes the mark with the hold).
	HoldResync(ctx context.Context, userID string, now, until int64) (held, stale bool, err error)
	ReleaseResync(ctx context.Context, userID string) error
}

// StaleQueue is the device-list updater's queue: the stale remote users
// with their retry state.
type StaleQueue interface {
	DueStaleUsers(ctx context.Context, now int64, limit int) ([]StaleUser, error)
	StaleEntry(ctx context.Context, userID string) (StaleUser, bool, error)
	NextStaleRetry(ctx context.Context) (at int64, ok bool, err error)
	RescheduleStale(ctx context.Context, userID string, attempts int, retryAt int64) error
	// DeferServer holds back every stale user of a server until a time;
	// RetryServerNow makes them all due.
	DeferServer(ctx context.Context, serverName string, until int64) error
	RetryServerNow(ctx context.Context, serverName string) error
}

// OutboundUpdates is the queue of the local users' device-list and
// signing-key updates per destination, filled in the transaction of each
// local change.
type OutboundUpdates interface {
	PendingDestinations(ctx context.Context) ([]string, error)
	PendingUpdates(ctx context.Context, destination string, limit int) ([]OutboundUpdate, error)
	MarkUpdatesSent(ctx context.Context, destination string, sent []OutboundUpdate) error
}

// OutboundToDevice is the queue of to-device EDUs per destination, filled
// by StoreToDevice.
type OutboundToDevice interface {
	ToDeviceDestinations(ctx context.Context) ([]string, error)
	PendingToDevice(ctx context.Context, destination string, limit int) ([]OutboundEDU, error)
	MarkToDeviceSent(ctx context.Context, destination string, sent []OutboundEDU) error
}

// OutboundPDUs is the queue of our room events per destination, filled in
// the transaction that writes them, for every server in the room.
type OutboundPDUs interface {
	PDUDestinations(ctx context.Context) ([]string, error)
	PendingPDUs(ctx context.Context, destination string, limit int) ([]OutboundPDU, error)
	MarkPDUsSent(ctx context.Context, destination string, sent []OutboundPDU) error
}

// OutboundLeases are the destinations' leases: which daemon sends to
// each.
type OutboundLeases interface {
	// AcquireDestination takes (or renews) the right to send to a
	// destination until expires: held false when another daemon holds it,
	// kept when the owner held it already and nobody took it meanwhile.
	AcquireDestination(ctx context.Context, destination, owner string, now, expires int64) (held, kept bool, err error)
	ReleaseDestination(ctx context.Context, destination, owner string) error
	// PauseDestination lets anyone take owner's lease while it waits to
	// retry; if nobody does, owner takes it back kept.
	PauseDestination(ctx context.Context, destination, owner string) error
	// HandOverDestination gives up a lease with work left (the daemon
	// stops): every daemon is told, to take it up.
	HandOverDestination(ctx context.Context, destination, owner string) error
	// OutboundOwners identifies the live holders of leases (nil on
	// SQLite), so that a daemon sees when another is gone.
	OutboundOwners(ctx context.Context) ([]int64, error)
	// HoldOutboundOwner makes owner a live holder of leases until ctx ends
	// (or until lost is closed, when its hold broke); leases of owners that
	// are gone are void (on SQLite, which one daemon uses, every lease left
	// is one's that is gone, and is dropped).
	HoldOutboundOwner(ctx context.Context, owner string) (lost <-chan struct{}, err error)
	// ReclaimDeadLeases drops the leases of owners that are gone and
	// returns their destinations.
	ReclaimDeadLeases(ctx context.Context) ([]string, error)
}

// DestinationRetries are the failing destinations' retry state, shared by
// the daemons.
type DestinationRetries interface {
	DestinationRetries(ctx context.Context) ([]DestinationRetry, error)
	DestinationRetryOf(ctx context.Context, destination string) (DestinationRetry, bool, error)
	RecordDestinationFailure(ctx context.Context, r DestinationRetry) error
	// ResetDestination forgets a destination's failures stored at or
	// before heardAt (ms; it got a delivery or was heard from then): true
	// when it had some, and then every daemon is told (WatchOutbound).
	ResetDestination(ctx context.Context, destination string, heardAt int64) (bool, error)
	// WatchOutbound calls fn with the other daemons' news about
	// destinations (a lease released, failures forgotten) until ctx ends.
	WatchOutbound(ctx context.Context, fn func(OutboundEvent)) error
	// OutboundDestinations lists the destinations with pending work or
	// failures, with their queues, retry state and lease.
	OutboundDestinations(ctx context.Context) ([]OutboundDestination, error)
}

// QueueDepths are the sizes of the background queues, for metrics and
// the admin commands.
type QueueDepths interface {
	// OutboundQueue counts the pending device-list and signing-key
	// updates per destination.
	OutboundQueue(ctx context.Context) (map[string]int, error)
	// PDUQueueDepth counts the PDUs waiting, once per destination.
	PDUQueueDepth(ctx context.Context) (int, error)
	// StaleCount counts the remote users waiting for a resync.
	StaleCount(ctx context.Context) (int, error)
}

// InboundTransactions are the other servers' /send transactions already
// answered, with their answers.
type InboundTransactions interface {
	InboundTransaction(ctx context.Context, origin, txnID string) ([]byte, bool, error)
	StoreInboundTransaction(ctx context.Context, origin, txnID string, response []byte, now int64) error
}

// ToDeviceInbox are the local devices' to-device messages.
type ToDeviceInbox interface {
	// StoreToDevice stores a send in one transaction: the local devices'
	// messages, and the EDUs queued for other servers (OutboundToDevice).
	// A send whose transaction ID was stored already stores nothing and
	// reports duplicate.
	StoreToDevice(ctx context.Context, send ToDeviceSend) (_ Change, duplicate bool, _ error)
	// ToDeviceMessages returns up to limit messages of a device's inbox
	// with a position in (after, upTo], in order.
	ToDeviceMessages(ctx context.Context, userID, deviceID string, after, upTo StreamPos, limit int) ([]ToDeviceMessage, error)
	// AckToDevice deletes a device's messages at or before a position.
	AckToDevice(ctx context.Context, userID, deviceID string, upTo StreamPos) error
}

// AccountDataStore are the users' account data, global and per room.
type AccountDataStore interface {
	SetAccountData(ctx context.Context, userID, roomID, dataType string, content []byte) (Change, error)
	// AccountData returns a user's account data of a type (global when
	// roomID is empty), or ErrNotFound.
	AccountData(ctx context.Context, userID, roomID, dataType string) ([]byte, error)
	// UpdateAccountData replaces content by what update makes of it, in
	// one transaction.
	UpdateAccountData(ctx context.Context, userID, roomID, dataType string, update func(old []byte) ([]byte, error)) (Change, error)
	// AccountDataChanges returns a user's account data whose last change
	// is in (from, to], in the order of the changes.
	AccountDataChanges(ctx context.Context, userID string, from, to StreamPos) ([]AccountData, error)
}

// KeyBackups are the users' server-side key backups.
type KeyBackups interface {
	CreateBackupVersion(ctx context.Context, userID, algorithm string, authData []byte) (int64, error)
	BackupVersion(ctx context.Context, userID string, version int64) (BackupVersion, error)
	UpdateBackupVersion(ctx context.Context, userID string, version int64, authData []byte) error
	DeleteBackupVersion(ctx context.Context, userID string, version int64) (existed bool, err error)
	PutBackupKeys(ctx context.Context, userID string, version int64, keys []BackupKey,
		replaces func(stored, uploaded BackupKey) bool) (BackupKeysResult, error)
	BackupKeys(ctx context.Context, userID string, version int64, roomID, sessionID string) ([]BackupKey, error)
	DeleteBackupKeys(ctx context.Context, userID string, version int64, roomID, sessionID string) (BackupKeysResult, error)
	DeleteUserBackups(ctx context.Context, userID string) error
}

// Profiles are the local users' profiles.
type Profiles interface {
	Profile(ctx context.Context, userID string) (Profile, error)
	// SetProfileField sets one field ("displayname" or "avatar_url";
	// value "": none) and returns the profile.
	SetProfileField(ctx context.Context, userID, field, value string) (Profile, error)
}

// UserDirectory finds users for a searcher.
type UserDirectory interface {
	UserDirectoryCandidates(ctx context.Context, searcher, term string, allLocal bool) ([]DirectoryUser, error)
}

// Rooms are the rooms' events and state.
type Rooms interface {
	// WriteRoomEvents writes a local chain of events (RoomWrite);
	// StartRoomWrite starts one in the room's order and returns the wait
	// for its result.
	WriteRoomEvents(ctx context.Context, w RoomWrite) (RoomWriteResult, error)
	StartRoomWrite(ctx context.Context, w RoomWrite) func() (RoomWriteResult, error)
	// IngestRoomEvents writes other servers' events (RoomIngest).
	IngestRoomEvents(ctx context.Context, in RoomIngest) (RoomWriteResult, error)
	Room(ctx context.Context, roomID string) (Room, error)
	RoomCurrentState(ctx context.Context, roomID string) ([]RoomEvent, error)
	RoomJoinedServers(ctx context.Context, roomID string) ([]string, error)
	RoomStateEvents(ctx context.Context, roomID string, keys []StateKey) ([]RoomEvent, error)
	RoomStateBefore(ctx context.Context, eventID string) ([]RoomEvent, error)
	RoomStateAfter(ctx context.Context, eventID string, keys []StateKey) ([]RoomEvent, error)
	RoomSnapshotEvents(ctx context.Context, snapshot int64, keys []StateKey) ([]RoomEvent, error)
	RoomEvent(ctx context.Context, eventID string) (RoomEvent, error)
	RoomEventsByID(ctx context.Context, ids []string) ([]RoomEvent, error)
	RoomMinDepth(ctx context.Context, roomID string) (int64, error)
	// RoomTimeline and RoomMessages read the events with positions in
	// (from, to]: /sync's timeline and /messages' pages.
	RoomTimeline(ctx context.Context, roomID string, from, to StreamPos, limit int) (_ []RoomEvent, limited bool, _ error)
	RoomMessages(ctx context.Context, roomID string, from, to StreamPos, limit int, forward bool) ([]RoomEvent, error)
	RoomTxnEvent(ctx context.Context, t RoomTxn) (string, error)
	ForgetRoom(ctx context.Context, userID, roomID string) error
}

// RoomAliases are the room aliases of this server.
type RoomAliases interface {
	PutRoomAlias(ctx context.Context, a RoomAlias) error
	RoomAlias(ctx context.Context, alias string) (RoomAlias, error)
	RoomAliases(ctx context.Context, roomID string) ([]string, error)
	DeleteRoomAlias(ctx context.Context, alias string) error
}

// RoomDirectory is the public room directory: the rooms listed.
type RoomDirectory interface {
	SetRoomPublished(ctx context.Context, roomID string, published bool) error
	PublishedRooms(ctx context.Context) ([]PublishedRoom, error)
}

// SyncFilters are the users' /sync filters.
type SyncFilters interface {
	PutSyncFilter(ctx context.Context, userID string, filter []byte) (int64, error)
	SyncFilter(ctx context.Context, userID string, id int64) ([]byte, error)
}

// Health is the database's own state.
type Health interface {
	// Ping checks that the database answers (readiness).
	Ping(ctx context.Context) error
	Close() error
}
