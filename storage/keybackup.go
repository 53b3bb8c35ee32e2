package storage

// BackupVersion is a version of a user's server-side key backup (the
// /room_keys/version endpoints). Versions are numbered 1, 2, 3... per user,
// never reused; the highest one not deleted is the current version, the
// only one that accepts keys.
type BackupVersion struct {
	Version   int64
	Algorithm string
	AuthData  []byte // a JSON object, stored as the client sent it (compacted)
	// ETag is bumped by every change of the version's keys; Count is the
	// number of keys the version holds.
	ETag  int64
	Count int64
}

// BackupKey is one room key (megolm session) in a backup version.
type BackupKey struct {
	RoomID            string
	SessionID         string
	FirstMessageIndex int64
	ForwardedCount    int64
	IsVerified        bool
	SessionData       []byte // a JSON object, opaque to the server
}

// BackupKeysResult is what a write of a version's keys left: the version
// that is current (which, when it is not the version written to, means
// nothing was written), and the etag and count of the version written to.
type BackupKeysResult struct {
	Current int64
	ETag    int64
	Count   int64
}
