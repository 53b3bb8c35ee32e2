// Package accountdata is users' account data (the /user/{userId}/account_data
// endpoints): JSON objects clients keep on the server per user, globally or
// per room, such as the secret-storage keys of end-to-end encryption. Each
// change takes a position in the stream /sync tokens are made of, and
// /sync hands out what changed (see keyserver.Service.Sync).
package accountdata

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// Store is what account data keeps in the database (package sqlstore).
type Store interface {
	storage.AccountDataStore
}

// Service serves account data to its owner.
type Service struct {
	db Store
	// changed is told the position of each change once it is committed,
	// to wake the waiting /sync requests of this daemon.
	changed func(storage.Change)
}

// New makes a Service; changed may be nil.
func New(db Store, changed func(storage.Change)) *Service {
	if changed == nil {
		changed = func(storage.Change) {}
	}
	return &Service{db: db, changed: changed}
}

// serverManaged are the types the spec reserves to other endpoints: a
// client may not set them here (push rules, the fully-read marker).
var serverManaged = map[string]bool{"m.push_rules": true, "m.fully_read": true}

// check checks the request's target: only the caller's own account data,
// a type, and (when not empty) a room ID.
func check(callerID, userID, roomID, dataType string, perRoom bool) error {
	if userID != callerID {
		return mxerr.Forbidden("cannot access the account data of another user")
	}
	if perRoom && !matrixid.ValidRoomID(roomID) {
		return mxerr.InvalidParam("%q is not a valid room ID", roomID)
	}
	if !matrixid.ValidOpaqueID(dataType) {
		return mxerr.InvalidParam("the type must be 1 to %d printable characters", matrixid.MaxLength)
	}
	return nil
}

// Set stores the content of a type of the caller's account data, global
// when roomID is empty. content is the request body, a JSON object.
func (s *Service) Set(ctx context.Context, callerID, userID, roomID, dataType string, perRoom bool, content json.RawMessage) error {
	if err := check(callerID, userID, roomID, dataType, perRoom); err != nil {
		return err
	}
	if serverManaged[dataType] {
		return mxerr.New(http.StatusMethodNotAllowed, "M_BAD_JSON", "%s cannot be set through account data", dataType)
	}
	content = bytes.TrimSpace(content)
	if len(content) == 0 || content[0] != '{' {
		return mxerr.BadJSON("the content must be a JSON object")
	}
	var b bytes.Buffer
	if err := json.Compact(&b, content); err != nil {
		return mxerr.NotJSON("the content is not valid JSON")
	}
	ch, err := s.db.SetAccountData(ctx, userID, roomID, dataType, b.Bytes())
	if err != nil {
		return err
	}
	s.changed(ch)
	return nil
}

// Get returns the content of a type of the caller's account data.
func (s *Service) Get(ctx context.Context, callerID, userID, roomID, dataType string, perRoom bool) (json.RawMessage, error) {
	if err := check(callerID, userID, roomID, dataType, perRoom); err != nil {
		return nil, err
	}
	content, err := s.db.AccountData(ctx, userID, roomID, dataType)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, mxerr.NotFound("no account data of type %q", dataType)
	}
	return content, err
}
