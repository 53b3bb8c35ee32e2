package todevice

import (
	"context"
	"encoding/json"

	"github.com/keyserver/keyserver/storage"
)

// To-device messages in /sync.
//
// A message waiting for a device sits in the device's inbox at a position
// of the stream counter. A /sync answer carries the oldest messages, at
// most MaxPerSync, and its token says up to where the device got them
// (package syncapi writes and reads it): every message at or before that
// position was in this answer or an earlier one. The next /sync with that
// token deletes them (AckDelivered); a repeat of an older token (its
// answer was lost) gets them again. The part is separate from the
// answer's position because an answer that hit the limit has given only
// part of the messages up to it.

// MaxPerSync bounds the to-device messages of one /sync answer.
const MaxPerSync = 100

// SyncSection is the to_device part of a /sync answer.
type SyncSection struct {
	Events []SyncEvent `json:"events"`
}

// SyncEvent is one to-device message as a client receives it.
type SyncEvent struct {
	Sender  string          `json:"sender"`
	Type    string          `json:"type"`
	Content json.RawMessage `json:"content"`
}

// SyncLimit is the most messages one /sync answer carries (MaxPerSync).
func (s *Service) SyncLimit() int { return MaxPerSync }

// SyncSection returns the to_device part of an answer at pos made of msgs
// (the device's oldest messages after its acknowledged position, at most
// SyncLimit), and the position up to which the answer delivers them.
func (s *Service) SyncSection(pos storage.StreamPos, msgs []storage.ToDeviceMessage) (any, storage.StreamPos) {
	section := &SyncSection{Events: make([]SyncEvent, 0, len(msgs))}
	for _, m := range msgs {
		section.Events = append(section.Events, SyncEvent{Sender: m.Sender, Type: m.Type, Content: m.Content})
	}
	delivered := pos
	if len(msgs) == MaxPerSync {
		// More may wait: the next answer starts after the last one here.
		delivered = msgs[len(msgs)-1].Pos
	}
	return section, delivered
}

// AckDelivered deletes the device's messages at or before upTo: its /sync
// token says it received them.
func (s *Service) AckDelivered(ctx context.Context, userID, deviceID string, upTo storage.StreamPos) error {
	return s.db.AckToDevice(ctx, userID, deviceID, upTo)
}
