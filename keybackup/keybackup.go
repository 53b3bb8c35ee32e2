// Package keybackup is the server-side backup of room keys (the
// /room_keys endpoints): a user's backup versions, each with its
// algorithm and auth_data, and the encrypted session keys stored in them.
// The server never reads the keys: it keeps the best copy of each session
// (see replaces) and tells clients, through etag and count, when the
// stored keys change.
package keybackup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"slices"
	"strconv"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/reqlog"
	"github.com/keyserver/keyserver/storage"
)

// Store is what the key backup keeps in the database (package sqlstore).
type Store interface {
	storage.KeyBackups
}

// Service serves the key backup endpoints of authenticated users.
type Service struct {
	db   Store
	log  logrus.FieldLogger
	opts Options
}

// Options adjust a Service.
type Options struct {
	// LaxAuthData accepts any JSON value as a version's auth_data, kept
	// and answered as sent (keys.strict_validation: false, for test
	// tools that send an opaque string); otherwise it must be an object.
	LaxAuthData bool
}

// New makes a Service.
func New(db Store, log logrus.FieldLogger, opts Options) *Service {
	if log == nil {
		log = logrus.StandardLogger()
	}
	return &Service{db: db, log: log, opts: opts}
}

// maxInt is the largest integer the spec allows in JSON (2^53 - 1).
const maxInt = 1<<53 - 1

// VersionRequest is the body of POST and PUT /room_keys/version.
type VersionRequest struct {
	Algorithm *string         `json:"algorithm"`
	AuthData  json.RawMessage `json:"auth_data"`
	Version   *string         `json:"version"` // PUT only; must name the version of the path
}

// VersionInfo describes a backup version.
type VersionInfo struct {
	Algorithm string          `json:"algorithm"`
	AuthData  json.RawMessage `json:"auth_data"`
	Count     int64           `json:"count"`
	ETag      string          `json:"etag"`
	Version   string          `json:"version"`
}

// KeysResult is the answer to every write of keys.
type KeysResult struct {
	ETag  string `json:"etag"`
	Count int64  `json:"count"`
}

// KeyBackupData is one session key as clients upload it; the pointers
// tell a missing member from a zero one.
type KeyBackupData struct {
	FirstMessageIndex *int64          `json:"first_message_index"`
	ForwardedCount    *int64          `json:"forwarded_count"`
	IsVerified        *bool           `json:"is_verified"`
	SessionData       json.RawMessage `json:"session_data"`
}

// RoomKeys are the sessions of one room, as uploaded.
type RoomKeys struct {
	Sessions map[string]*KeyBackupData `json:"sessions"`
}

// storedKey is a session key as answered.
type storedKey struct {
	FirstMessageIndex int64           `json:"first_message_index"`
	ForwardedCount    int64           `json:"forwarded_count"`
	IsVerified        bool            `json:"is_verified"`
	SessionData       json.RawMessage `json:"session_data"`
}

type roomAnswer struct {
	Sessions map[string]storedKey `json:"sessions"`
}

// replaces is the spec's rule for a session already in the backup: a
// verified key beats an unverified one; between keys equal in that, the
// lower first_message_index wins, then the lower forwarded_count.
// Otherwise (a tie included) the stored key stays, so an upload of what
// is stored changes nothing and leaves the etag as it is.
func replaces(stored, uploaded storage.BackupKey) bool {
	if stored.IsVerified != uploaded.IsVerified {
		return uploaded.IsVerified
	}
	if stored.FirstMessageIndex != uploaded.FirstMessageIndex {
		return uploaded.FirstMessageIndex < stored.FirstMessageIndex
	}
	return uploaded.ForwardedCount < stored.ForwardedCount
}

// parseVersion reads a version as clients name it. Versions are the
// decimal numbers this server hands out, written as it writes them: any
// other string names no version, so it is not found (as on Synapse)
// rather than a bad parameter.
func parseVersion(s string) (int64, error) {
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 1 || strconv.FormatInt(v, 10) != s {
		return 0, unknownVersion(s)
	}
	return v, nil
}

func unknownVersion(s string) error {
	return mxerr.NotFound("unknown backup version %q", s)
}

func formatVersion(v int64) string { return strconv.FormatInt(v, 10) }

// checkObject checks that a member is present and a JSON object, and
// returns it compacted for storage.
func checkObject(name string, raw json.RawMessage) ([]byte, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, mxerr.MissingParam("%s is required", name)
	}
	if raw[0] != '{' {
		return nil, mxerr.BadJSON("%s must be an object", name)
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return nil, mxerr.BadJSON("%s is not valid JSON", name)
	}
	return b.Bytes(), nil
}

// checkAuthData checks a version's auth_data and returns it compacted for
// storage: an object, or in lax mode any JSON value.
func (s *Service) checkAuthData(raw json.RawMessage) ([]byte, error) {
	if !s.opts.LaxAuthData {
		return checkObject("auth_data", raw)
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil || b.Len() == 0 {
		return nil, mxerr.MissingParam("auth_data is required")
	}
	return b.Bytes(), nil
}

// checkAlgorithm checks the algorithm member: any non-empty string.
func checkAlgorithm(a *string) error {
	if a == nil {
		return mxerr.MissingParam("algorithm is required")
	}
	if !matrixid.ValidOpaqueID(*a) {
		return mxerr.InvalidParam("algorithm must be 1 to %d printable characters", matrixid.MaxLength)
	}
	return nil
}

// CreateVersion creates a backup version, which becomes the current one.
func (s *Service) CreateVersion(ctx context.Context, userID string, req VersionRequest) (map[string]string, error) {
	if err := checkAlgorithm(req.Algorithm); err != nil {
		return nil, err
	}
	authData, err := s.checkAuthData(req.AuthData)
	if err != nil {
		return nil, err
	}
	v, err := s.db.CreateBackupVersion(ctx, userID, *req.Algorithm, authData)
	if err != nil {
		return nil, err
	}
	reqlog.From(ctx, s.log).WithFields(logrus.Fields{"user_id": userID, "version": v}).Info("key backup version created")
	return map[string]string{"version": formatVersion(v)}, nil
}

// Version describes a version, the current one when version is "".
func (s *Service) Version(ctx context.Context, userID, version string) (VersionInfo, error) {
	var v int64
	if version != "" {
		var err error
		if v, err = parseVersion(version); err != nil {
			return VersionInfo{}, err
		}
	}
	bv, err := s.db.BackupVersion(ctx, userID, v)
	if errors.Is(err, storage.ErrNotFound) {
		if version == "" {
			return VersionInfo{}, mxerr.NotFound("no current backup version")
		}
		return VersionInfo{}, unknownVersion(version)
	}
	if err != nil {
		return VersionInfo{}, err
	}
	return VersionInfo{Algorithm: bv.Algorithm, AuthData: bv.AuthData, Count: bv.Count,
		ETag: strconv.FormatInt(bv.ETag, 10), Version: formatVersion(bv.Version)}, nil
}

// UpdateVersion replaces a version's auth_data. The algorithm cannot
// change, and a version in the body must be the one of the path.
func (s *Service) UpdateVersion(ctx context.Context, userID, version string, req VersionRequest) error {
	v, err := parseVersion(version)
	if err != nil {
		return err
	}
	if err := checkAlgorithm(req.Algorithm); err != nil {
		return err
	}
	authData, err := s.checkAuthData(req.AuthData)
	if err != nil {
		return err
	}
	if req.Version != nil && *req.Version != version {
		return mxerr.InvalidParam("the version in the body (%q) is not the version of the path (%q)", *req.Version, version)
	}
	bv, err := s.db.BackupVersion(ctx, userID, v)
	if errors.Is(err, storage.ErrNotFound) {
		return unknownVersion(version)
	}
	if err != nil {
		return err
	}
	if bv.Algorithm != *req.Algorithm {
		return mxerr.InvalidParam("the algorithm of a backup version cannot change (it is %q)", bv.Algorithm)
	}
	err = s.db.UpdateBackupVersion(ctx, userID, v, authData)
	if errors.Is(err, storage.ErrNotFound) { // deleted meanwhile
		return unknownVersion(version)
	}
	return err
}

// DeleteVersion deletes a version and its keys. Deleting a deleted
// version again succeeds; one never created is not found.
func (s *Service) DeleteVersion(ctx context.Context, userID, version string) error {
	v, err := parseVersion(version)
	if err != nil {
		return err
	}
	existed, err := s.db.DeleteBackupVersion(ctx, userID, v)
	if err != nil {
		return err
	}
	if !existed {
		return unknownVersion(version)
	}
	reqlog.From(ctx, s.log).WithFields(logrus.Fields{"user_id": userID, "version": v}).Info("key backup version deleted")
	return nil
}

// keyVersion reads the required version query parameter of the key
// endpoints.
func keyVersion(version string) (int64, error) {
	if version == "" {
		return 0, mxerr.MissingParam("the version query parameter is required")
	}
	return parseVersion(version)
}

// checkIDs checks a room ID and, when not empty, a session ID.
func checkIDs(roomID, sessionID string) error {
	if !matrixid.ValidRoomID(roomID) {
		return mxerr.InvalidParam("%q is not a valid room ID", roomID)
	}
	if sessionID != "" && !matrixid.ValidOpaqueID(sessionID) {
		return mxerr.InvalidParam("session IDs must be 1 to %d printable characters", matrixid.MaxLength)
	}
	return nil
}

// checkKey checks an uploaded session key and returns it for storage.
func checkKey(roomID, sessionID string, d *KeyBackupData) (storage.BackupKey, error) {
	if err := checkIDs(roomID, sessionID); err != nil {
		return storage.BackupKey{}, err
	}
	if sessionID == "" {
		return storage.BackupKey{}, mxerr.InvalidParam("session IDs must be 1 to %d printable characters", matrixid.MaxLength)
	}
	where := func(msg string) string {
		return msg + " (room " + strconv.Quote(roomID) + ", session " + strconv.Quote(sessionID) + ")"
	}
	if d == nil {
		return storage.BackupKey{}, mxerr.MissingParam("%s", where("the key data is required"))
	}
	for _, f := range []struct {
		name string
		v    *int64
	}{{"first_message_index", d.FirstMessageIndex}, {"forwarded_count", d.ForwardedCount}} {
		if f.v == nil {
			return storage.BackupKey{}, mxerr.MissingParam("%s", where(f.name+" is required"))
		}
		if *f.v < 0 || *f.v > maxInt {
			return storage.BackupKey{}, mxerr.InvalidParam("%s", where(f.name+" must be an integer from 0 to 2^53-1"))
		}
	}
	if d.IsVerified == nil {
		return storage.BackupKey{}, mxerr.MissingParam("%s", where("is_verified is required"))
	}
	data, err := checkObject("session_data", d.SessionData)
	if err != nil {
		var me *mxerr.Error
		if errors.As(err, &me) {
			me.Message = where(me.Message)
		}
		return storage.BackupKey{}, err
	}
	return storage.BackupKey{RoomID: roomID, SessionID: sessionID, FirstMessageIndex: *d.FirstMessageIndex,
		ForwardedCount: *d.ForwardedCount, IsVerified: *d.IsVerified, SessionData: data}, nil
}

// PutKeys stores uploaded keys in the current version. Every key is
// checked before anything is written. A version that exists but is not
// the current one is refused with M_WRONG_ROOM_KEYS_VERSION and the
// current version; one that does not exist is not found.
func (s *Service) PutKeys(ctx context.Context, userID, version string, rooms map[string]RoomKeys) (KeysResult, error) {
	v, err := keyVersion(version)
	if err != nil {
		return KeysResult{}, err
	}
	// In order, so that of several mistakes the same one is reported.
	var keys []storage.BackupKey
	for _, roomID := range slices.Sorted(maps.Keys(rooms)) {
		room := rooms[roomID]
		if room.Sessions == nil {
			if err := checkIDs(roomID, ""); err != nil {
				return KeysResult{}, err
			}
			return KeysResult{}, mxerr.MissingParam("sessions is required (room %q)", roomID)
		}
		for _, sessionID := range slices.Sorted(maps.Keys(room.Sessions)) {
			k, err := checkKey(roomID, sessionID, room.Sessions[sessionID])
			if err != nil {
				return KeysResult{}, err
			}
			keys = append(keys, k)
		}
	}
	res, err := s.db.PutBackupKeys(ctx, userID, v, keys, replaces)
	if errors.Is(err, storage.ErrNotFound) {
		return KeysResult{}, unknownVersion(version)
	}
	if err != nil {
		return KeysResult{}, err
	}
	if res.Current != v {
		e := mxerr.New(http.StatusForbidden, "M_WRONG_ROOM_KEYS_VERSION", "version %s is not the current backup version", version)
		e.Extra = map[string]any{"current_version": formatVersion(res.Current)}
		return KeysResult{}, e
	}
	return KeysResult{ETag: strconv.FormatInt(res.ETag, 10), Count: res.Count}, nil
}

// Keys returns the keys of a version (roomID empty: {"rooms": ...}), of
// one of its rooms ({"sessions": ...}) or one key, which must exist.
func (s *Service) Keys(ctx context.Context, userID, version, roomID, sessionID string) (any, error) {
	v, err := keyVersion(version)
	if err != nil {
		return nil, err
	}
	if roomID != "" {
		if err := checkIDs(roomID, sessionID); err != nil {
			return nil, err
		}
	}
	keys, err := s.db.BackupKeys(ctx, userID, v, roomID, sessionID)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, unknownVersion(version)
	}
	if err != nil {
		return nil, err
	}
	switch {
	case sessionID != "":
		if len(keys) == 0 {
			return nil, mxerr.NotFound("no key for that session in the backup")
		}
		return answerKey(keys[0]), nil
	case roomID != "":
		room := roomAnswer{Sessions: map[string]storedKey{}}
		for _, k := range keys {
			room.Sessions[k.SessionID] = answerKey(k)
		}
		return room, nil
	}
	rooms := map[string]roomAnswer{}
	for _, k := range keys {
		room, ok := rooms[k.RoomID]
		if !ok {
			room = roomAnswer{Sessions: map[string]storedKey{}}
			rooms[k.RoomID] = room
		}
		room.Sessions[k.SessionID] = answerKey(k)
	}
	return map[string]any{"rooms": rooms}, nil
}

func answerKey(k storage.BackupKey) storedKey {
	return storedKey{FirstMessageIndex: k.FirstMessageIndex, ForwardedCount: k.ForwardedCount,
		IsVerified: k.IsVerified, SessionData: k.SessionData}
}

// DeleteKeys deletes the keys of a version, of one of its rooms or one
// key; any existing version may lose keys, current or not.
func (s *Service) DeleteKeys(ctx context.Context, userID, version, roomID, sessionID string) (KeysResult, error) {
	v, err := keyVersion(version)
	if err != nil {
		return KeysResult{}, err
	}
	if roomID != "" {
		if err := checkIDs(roomID, sessionID); err != nil {
			return KeysResult{}, err
		}
	}
	res, err := s.db.DeleteBackupKeys(ctx, userID, v, roomID, sessionID)
	if errors.Is(err, storage.ErrNotFound) {
		return KeysResult{}, unknownVersion(version)
	}
	if err != nil {
		return KeysResult{}, err
	}
	return KeysResult{ETag: strconv.FormatInt(res.ETag, 10), Count: res.Count}, nil
}

// DeleteAll deletes every backup version of the user with its keys: a
// deactivated account keeps none.
func (s *Service) DeleteAll(ctx context.Context, userID string) error {
	return s.db.DeleteUserBackups(ctx, userID)
}
