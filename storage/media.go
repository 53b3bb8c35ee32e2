package storage

import "errors"

// ErrMediaExists is the error of a media record that cannot be stored
// because one with the same origin and ID is there.
var ErrMediaExists = errors.New("media ID already in use")

// ErrMediaNotPending is the error of filling a reserved media ID that
// already holds content.
var ErrMediaNotPending = errors.New("media already uploaded")

// MediaRecord is what the database keeps of one piece of media: a local
// upload (Origin is this server) or a remote file cached here. The bytes
// are kept apart, in files named by SHA256.
type MediaRecord struct {
	Origin  string
	MediaID string
	// UserID is the local user who uploaded or reserved it ("" for
	// remote media).
	UserID      string
	ContentType string
	UploadName  string
	// SHA256 is the hex digest of the bytes; "" while an ID reserved
	// by an asynchronous upload waits for its content.
	SHA256    string
	Size      int64
	CreatedTS int64
	// ExpiresTS is when a reserved ID that was never filled stops being
	// usable (milliseconds); 0 once it holds content.
	ExpiresTS int64
	// Authenticated media is served only by the authenticated download
	// endpoints; the others serve only media that is not.
	Authenticated bool
}

// Pending tells whether the record is a reserved ID still waiting for
// its content.
func (m MediaRecord) Pending() bool { return m.SHA256 == "" }

// MediaThumbnail is one thumbnail made of a piece of media.
type MediaThumbnail struct {
	Origin, MediaID string
	Width, Height   int
	Method          string // "crop" or "scale"
	ContentType     string
	SHA256          string
	Size            int64
}
