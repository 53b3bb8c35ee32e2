package keyserver

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/streamtoken"
	"github.com/keyserver/keyserver/storage"
)

// To-device messages in /sync.
//
// A message waiting for a device (package todevice stores them) sits in
// the device's inbox at a position of the stream counter. A /sync answer
// carries the oldest messages, at most maxToDevicePerSync, and its token
// says up to where the device got them: "s<pos>_d<acked>", every message
// at or before acked was in this answer or an earlier one. The next /sync
// with that token deletes them; a repeat of an older token (its answer
// was lost) gets them again. The part is separate from pos because an
// answer that hit the limit has given only part of the messages up to
// pos. Tokens without it (older ones, /keys/changes') acknowledge nothing.

// maxToDevicePerSync bounds the to-device messages of one /sync answer.
const maxToDevicePerSync = 100

// ToDeviceInbox gives /sync the devices' to-device messages (the store).
type ToDeviceInbox interface {
	// ToDeviceMessages returns up to limit messages of the device with a
	// position in (after, upTo], in order.
	ToDeviceMessages(ctx context.Context, userID, deviceID string, after, upTo storage.StreamPos, limit int) ([]storage.ToDeviceMessage, error)
	// AckToDevice deletes the device's messages at or before upTo.
	AckToDevice(ctx context.Context, userID, deviceID string, upTo storage.StreamPos) error
}

// ToDeviceSection is the to_device part of a /sync answer.
type ToDeviceSection struct {
	Events []ToDeviceEvent `json:"events"`
}

// ToDeviceEvent is one to-device message as a client receives it.
type ToDeviceEvent struct {
	Sender  string          `json:"sender"`
	Type    string          `json:"type"`
	Content json.RawMessage `json:"content"`
}

// syncToken is a /sync token: the stream position and, when the service
// keeps to-device messages, the position up to which the device received
// them.
func (s *Service) syncToken(pos, acked storage.StreamPos) string {
	tok := streamtoken.Format(pos)
	if s.opts.ToDevice != nil {
		tok += "_d" + strconv.FormatInt(int64(acked), 10)
	}
	return tok
}

// parseToDeviceAck reads the to-device part of a token; 0 when absent.
func parseToDeviceAck(tok string) (storage.StreamPos, error) {
	_, rest, _ := strings.Cut(tok, "_")
	for _, part := range strings.Split(rest, "_") {
		if num, ok := strings.CutPrefix(part, "d"); ok {
			n, err := strconv.ParseInt(num, 10, 64)
			if err != nil || n < 0 {
				return 0, mxerr.InvalidParam("since is not a valid stream token")
			}
			return storage.StreamPos(n), nil
		}
	}
	return 0, nil
}

// toDeviceSection returns the to_device part of an answer at pos made of
// msgs (the device's oldest messages after its acknowledged position),
// and the position up to which the answer delivers them.
func (s *Service) toDeviceSection(pos storage.StreamPos, msgs []storage.ToDeviceMessage) (*ToDeviceSection, storage.StreamPos) {
	if s.opts.ToDevice == nil {
		return nil, 0
	}
	section := &ToDeviceSection{Events: make([]ToDeviceEvent, 0, len(msgs))}
	for _, m := range msgs {
		section.Events = append(section.Events, ToDeviceEvent{Sender: m.Sender, Type: m.Type, Content: m.Content})
	}
	delivered := pos
	if len(msgs) == maxToDevicePerSync {
		// More may wait: the next answer starts after the last one here.
		delivered = msgs[len(msgs)-1].Pos
	}
	return section, delivered
}
