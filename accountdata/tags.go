package accountdata

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// Room tags (/user/{userId}/rooms/{roomId}/tags): a user's labels for a
// room (m.favourite, m.lowpriority, their own u.* ones), kept as the
// room's m.tag account data, {"tags": {tag: {"order": n}}}, so /sync hands
// out a change with the room's account data. A tag is set or removed in
// one transaction with the rest of the room's tags read in it, so two
// changes at once both stay.

const tagType = "m.tag"

// Tags returns the tags the caller gave a room ({"tags": {}} for none).
func (s *Service) Tags(ctx context.Context, callerID, userID, roomID string) (json.RawMessage, error) {
	if err := check(callerID, userID, roomID, tagType, true); err != nil {
		return nil, err
	}
	content, err := s.db.AccountData(ctx, userID, roomID, tagType)
	if errors.Is(err, storage.ErrNotFound) {
		return json.RawMessage(`{"tags":{}}`), nil
	} else if err != nil {
		return nil, err
	}
	tags, err := readTags(content)
	if err != nil {
		return nil, err
	}
	return json.Marshal(map[string]any{"tags": tags})
}

// SetTag gives a room a tag; body is the tag's content, a JSON object
// whose order, when present, is a number.
func (s *Service) SetTag(ctx context.Context, callerID, userID, roomID, tag string, body json.RawMessage) error {
	if err := checkTag(callerID, userID, roomID, tag); err != nil {
		return err
	}
	var content map[string]json.RawMessage
	if err := json.Unmarshal(bytes.TrimSpace(body), &content); err != nil || content == nil {
		return mxerr.BadJSON("the tag's content must be a JSON object")
	}
	if order, ok := content["order"]; ok {
		var n float64
		if json.Unmarshal(order, &n) != nil {
			return mxerr.BadJSON("order must be a number")
		}
	}
	return s.updateTags(ctx, userID, roomID, func(tags map[string]json.RawMessage) {
		raw, _ := json.Marshal(content) // compact, keys sorted
		tags[tag] = raw
	})
}

// DeleteTag removes a tag from a room (a tag it does not have: nothing
// changes, and no error).
func (s *Service) DeleteTag(ctx context.Context, callerID, userID, roomID, tag string) error {
	if err := checkTag(callerID, userID, roomID, tag); err != nil {
		return err
	}
	return s.updateTags(ctx, userID, roomID, func(tags map[string]json.RawMessage) { delete(tags, tag) })
}

func checkTag(callerID, userID, roomID, tag string) error {
	if err := check(callerID, userID, roomID, tagType, true); err != nil {
		return err
	}
	if !matrixid.ValidOpaqueID(tag) {
		return mxerr.InvalidParam("a tag must be 1 to %d printable characters", matrixid.MaxLength)
	}
	return nil
}

func (s *Service) updateTags(ctx context.Context, userID, roomID string, change func(map[string]json.RawMessage)) error {
	ch, err := s.db.UpdateAccountData(ctx, userID, roomID, tagType, func(old []byte) ([]byte, error) {
		tags := map[string]json.RawMessage{}
		if old != nil {
			var err error
			if tags, err = readTags(old); err != nil {
				return nil, err
			}
		}
		change(tags)
		return json.Marshal(map[string]any{"tags": tags})
	})
	if err != nil {
		return err
	}
	s.changed(ch)
	return nil
}

// readTags reads the tags of m.tag content; content a client wrote
// through the account data endpoints without a tags object has none.
func readTags(content []byte) (map[string]json.RawMessage, error) {
	var c struct {
		Tags map[string]json.RawMessage `json:"tags"`
	}
	if json.Unmarshal(content, &c) != nil || c.Tags == nil {
		return map[string]json.RawMessage{}, nil
	}
	return c.Tags, nil
}
