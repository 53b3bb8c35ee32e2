// Package dehydrated is dehydrated devices (MSC3814, unstable prefix
// org.matrix.msc3814.v1): a user keeps one device on the server, without
// access token, whose keys are published like any device's, so that
// messages can be encrypted to it while the user has no client running.
// A new client rehydrates it: it reads the device's to-device messages
// with the keys it restores from device_data.
package dehydrated

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// Store is what dehydrated devices keep in the database (package sqlstore).
type Store interface {
	storage.DehydratedDevices
	storage.Devices
	storage.ToDeviceInbox
	storage.Stream
}

// Keys are a device's keys as /keys/upload takes them.
type Keys struct {
	DeviceKeys, OneTimeKeys, FallbackKeys json.RawMessage
}

// KeyUploader checks and stores a device's keys as /keys/upload checks
// them (the keys domain, package keyserver).
type KeyUploader interface {
	// CheckNewDeviceKeys checks an upload for a device with no stored
	// keys, writing nothing.
	CheckNewDeviceKeys(ctx context.Context, c matrixid.Caller, k Keys) error
	// UploadDeviceKeys stores the keys.
	UploadDeviceKeys(ctx context.Context, c matrixid.Caller, k Keys) error
}

// Service serves a user's dehydrated device.
type Service struct {
	db   Store
	keys KeyUploader
	// changed is told of each committed device-list change (the keys
	// domain publishes it).
	changed func(storage.Change)
	now     func() time.Time
}

// New makes a Service; changed may be nil, now is time.Now when nil.
func New(db Store, keys KeyUploader, changed func(storage.Change), now func() time.Time) *Service {
	if changed == nil {
		changed = func(storage.Change) {}
	}
	if now == nil {
		now = time.Now
	}
	return &Service{db: db, keys: keys, changed: changed, now: now}
}

// PutRequest is the body of PUT /dehydrated_device.
type PutRequest struct {
	DeviceID     string          `json:"device_id"`
	DeviceData   json.RawMessage `json:"device_data"`
	DisplayName  *string         `json:"initial_device_display_name"`
	DeviceKeys   json.RawMessage `json:"device_keys"`
	OneTimeKeys  json.RawMessage `json:"one_time_keys"`
	FallbackKeys json.RawMessage `json:"fallback_keys"`
}

// DeviceAnswer names the device PUT and DELETE dealt with.
type DeviceAnswer struct {
	DeviceID string `json:"device_id"`
}

// Put creates the user's new dehydrated device with its keys and makes it
// the dehydrated device, deleting the previous one with its keys and
// messages. The keys are checked as /keys/upload checks them for a new
// device before anything is written: refused keys change nothing (no
// device made or replaced, no device-list change).
func (s *Service) Put(ctx context.Context, userID string, r PutRequest) (DeviceAnswer, error) {
	if r.DeviceID == "" {
		return DeviceAnswer{}, mxerr.MissingParam("device_id is required")
	}
	if !matrixid.ValidOpaqueID(r.DeviceID) {
		return DeviceAnswer{}, mxerr.InvalidParam("device_id must be 1 to %d printable characters", matrixid.MaxLength)
	}
	data, err := deviceData(r.DeviceData)
	if err != nil {
		return DeviceAnswer{}, err
	}
	caller := matrixid.Caller{UserID: userID, DeviceID: r.DeviceID}
	upload := Keys{DeviceKeys: r.DeviceKeys, OneTimeKeys: r.OneTimeKeys, FallbackKeys: r.FallbackKeys}
	if err := s.keys.CheckNewDeviceKeys(ctx, caller, upload); err != nil {
		return DeviceAnswer{}, err
	}
	name := ""
	if r.DisplayName != nil {
		name = *r.DisplayName
	}
	ch, err := s.db.CreateDehydratedDevice(ctx, userID, r.DeviceID, name, s.now().UnixMilli())
	if errors.Is(err, storage.ErrDeviceExists) {
		return DeviceAnswer{}, mxerr.InvalidParam("device %s exists already", r.DeviceID)
	}
	if err != nil {
		return DeviceAnswer{}, err
	}
	s.changed(ch)
	if err := s.keys.UploadDeviceKeys(ctx, caller, upload); err != nil {
		// The keys were checked above, so this is a failure of the store:
		// the new device goes again. (A previous dehydrated device of the
		// same ID was replaced by CreateDehydratedDevice and stays gone.)
		if _, ch, derr := s.db.DeleteDevices(context.WithoutCancel(ctx), userID, []string{r.DeviceID}); derr == nil {
			s.changed(ch)
		}
		return DeviceAnswer{}, err
	}
	ch, err = s.db.SetDehydratedDevice(ctx, userID, r.DeviceID, data)
	if err != nil {
		return DeviceAnswer{}, err
	}
	s.changed(ch)
	return DeviceAnswer{DeviceID: r.DeviceID}, nil
}

// deviceData checks device_data: an object with an algorithm.
func deviceData(raw json.RawMessage) ([]byte, error) {
	if t := bytes.TrimSpace(raw); len(t) == 0 || string(t) == "null" {
		return nil, mxerr.MissingParam("device_data is required")
	}
	var d map[string]json.RawMessage
	if err := json.Unmarshal(raw, &d); err != nil || d == nil {
		return nil, mxerr.BadJSON("device_data must be a JSON object")
	}
	var alg string
	if err := json.Unmarshal(d["algorithm"], &alg); err != nil || alg == "" {
		return nil, mxerr.BadJSON("device_data.algorithm must be a non-empty string")
	}
	return json.Marshal(d)
}

// GetAnswer is the answer to GET /dehydrated_device.
type GetAnswer struct {
	DeviceID   string          `json:"device_id"`
	DeviceData json.RawMessage `json:"device_data"`
}

// Get returns the user's dehydrated device.
func (s *Service) Get(ctx context.Context, userID string) (GetAnswer, error) {
	id, data, err := s.db.DehydratedDevice(ctx, userID)
	if errors.Is(err, storage.ErrNotFound) {
		return GetAnswer{}, mxerr.NotFound("no dehydrated device")
	}
	return GetAnswer{DeviceID: id, DeviceData: data}, err
}

// Delete deletes the user's dehydrated device.
func (s *Service) Delete(ctx context.Context, userID string) (DeviceAnswer, error) {
	id, ch, err := s.db.DeleteDehydratedDevice(ctx, userID)
	if errors.Is(err, storage.ErrNotFound) {
		return DeviceAnswer{}, mxerr.NotFound("no dehydrated device")
	}
	if err != nil {
		return DeviceAnswer{}, err
	}
	s.changed(ch)
	return DeviceAnswer{DeviceID: id}, nil
}

// maxEventsPerBatch bounds the messages of one answer of Events.
const maxEventsPerBatch = 100

// EventsAnswer is the answer to the dehydrated device's /events.
type EventsAnswer struct {
	Events    []Event `json:"events"`
	NextBatch string  `json:"next_batch,omitempty"`
}

// Event is a to-device message as the device reads it.
type Event struct {
	Sender  string          `json:"sender"`
	Type    string          `json:"type"`
	Content json.RawMessage `json:"content"`
}

// Events returns the dehydrated device's to-device messages after
// nextBatch (empty: from the start), deleting those up to it: the client
// got them. next_batch is set while messages come; an answer without
// messages has none, and ends the client's paging.
func (s *Service) Events(ctx context.Context, userID, deviceID, nextBatch string) (EventsAnswer, error) {
	id, _, err := s.db.DehydratedDevice(ctx, userID)
	if err != nil && !errors.Is(err, storage.ErrNotFound) {
		return EventsAnswer{}, err
	}
	if err != nil || id != deviceID {
		return EventsAnswer{}, mxerr.Forbidden("%s is not your dehydrated device", deviceID)
	}
	var after storage.StreamPos
	if nextBatch != "" {
		n, err := strconv.ParseInt(nextBatch, 10, 64)
		if err != nil || n < 0 {
			return EventsAnswer{}, mxerr.InvalidParam("next_batch is not a token of this endpoint")
		}
		after = storage.StreamPos(n)
		if err := s.db.AckToDevice(ctx, userID, deviceID, after); err != nil {
			return EventsAnswer{}, err
		}
	}
	cur, err := s.db.CurrentPos(ctx)
	if err != nil {
		return EventsAnswer{}, err
	}
	msgs, err := s.db.ToDeviceMessages(ctx, userID, deviceID, after, cur, maxEventsPerBatch)
	if err != nil {
		return EventsAnswer{}, err
	}
	out := EventsAnswer{Events: make([]Event, 0, len(msgs))}
	for _, m := range msgs {
		out.Events = append(out.Events, Event{Sender: m.Sender, Type: m.Type, Content: m.Content})
	}
	if len(msgs) > 0 {
		out.NextBatch = strconv.FormatInt(int64(msgs[len(msgs)-1].Pos), 10)
	}
	return out, nil
}
