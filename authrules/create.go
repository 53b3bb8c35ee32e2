package authrules

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/tidwall/gjson"
)

// createContent is what the rules read from a create event's content.
type createContent struct {
	roomVersion        *string
	additionalCreators []string
	// federate is false only when content["m.federate"] is the JSON false.
	federate bool
}

// contentError says which rule a create event's content fails.
type contentError struct {
	rule string
	msg  string
}

func (e *contentError) Error() string { return e.msg }

// parseCreateContent reads and validates a create event's content: a
// room_version that is present must be a string, and additional_creators
// must be an array of valid user IDs (rule 1.4).
func parseCreateContent(content []byte) (createContent, error) {
	c := createContent{federate: true}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(content, &fields); err != nil || fields == nil {
		return c, &contentError{"1", "content is not a JSON object"}
	}
	if raw, ok := fields["room_version"]; ok {
		var v string
		if err := json.Unmarshal(raw, &v); err != nil || string(raw) == "null" {
			return c, &contentError{"1.3", "room_version is not a string"}
		}
		c.roomVersion = &v
	}
	if raw, ok := fields["additional_creators"]; ok {
		var list []json.RawMessage
		if err := json.Unmarshal(raw, &list); err != nil || string(raw) == "null" {
			return c, &contentError{"1.4", "additional_creators is not an array"}
		}
		for _, item := range list {
			var userID string
			if err := json.Unmarshal(item, &userID); err != nil || string(item) == "null" {
				return c, &contentError{"1.4", fmt.Sprintf("additional_creators holds %s, which is not a string", item)}
			}
			if !validUserID(userID) {
				return c, &contentError{"1.4", fmt.Sprintf("additional_creators holds %q, which is not a valid user ID", userID)}
			}
			c.additionalCreators = append(c.additionalCreators, userID)
		}
	}
	if raw, ok := fields["m.federate"]; ok && strings.TrimSpace(string(raw)) == "false" {
		c.federate = false
	}
	return c, nil
}

// validUserID applies to a user ID the validation applied to an event's
// sender: the grammar of user IDs, historical localparts allowed.
func validUserID(userID string) bool {
	_, err := spec.NewUserID(userID, true)
	return err == nil
}

// knownRoomVersion reports whether v is a room version this server knows.
func knownRoomVersion(v string) bool {
	return v == string(RoomVersion12) || gomatrixserverlib.KnownRoomVersion(gomatrixserverlib.RoomVersion(v))
}

// createAllowed applies rule 1 to a create event.
func createAllowed(ev gomatrixserverlib.PDU) error {
	// Only one create event exists in a room: the one with the empty state key.
	if !ev.StateKeyEquals("") {
		return notAllowed("1", "the create event must have an empty state key")
	}
	// Rule 1.1: the create event starts the room.
	if n := len(ev.PrevEventIDs()); n > 0 {
		return notAllowed("1.1", "the create event has %d prev_events", n)
	}
	// Rule 1.2: the room ID is derived from the create event, which has none.
	if gjson.GetBytes(ev.JSON(), "room_id").Exists() {
		return notAllowed("1.2", "the create event has a room_id")
	}
	// Rules 1.3 (room_version) and 1.4 (additional_creators) read the content.
	c, err := parseCreateContent(ev.Content())
	rule := "1"
	var bad *contentError
	if errors.As(err, &bad) {
		rule = bad.rule
	}
	if err != nil && rule != "1.4" {
		return notAllowed(rule, "the create event's %v", err)
	}
	// Rule 1.3: a room version must be one we know.
	if c.roomVersion != nil && !knownRoomVersion(*c.roomVersion) {
		return notAllowed("1.3", "the create event has the unknown room version %q", *c.roomVersion)
	}
	// Rule 1.4: additional_creators, an array of user IDs.
	if err != nil {
		return notAllowed(rule, "the create event's %v", err)
	}
	// Rule 1.5: otherwise, allow.
	return nil
}

// Creators returns the room's creators for a v12 create event: its sender and content.additional_creators.
// The sender comes first, then the additional creators in their order, without repeats. An error
// says that the content is not valid (additional_creators not an array of user IDs).
func Creators(create gomatrixserverlib.PDU) ([]string, error) {
	if create == nil {
		return nil, fmt.Errorf("no create event")
	}
	c, err := parseCreateContent(create.Content())
	if err != nil {
		return nil, fmt.Errorf("create event %s: %w", create.EventID(), err)
	}
	return creatorList(create, c), nil
}

func creatorList(create gomatrixserverlib.PDU, c createContent) []string {
	creators := []string{string(create.SenderID())}
	for _, u := range c.additionalCreators {
		dup := false
		for _, seen := range creators {
			dup = dup || seen == u
		}
		if !dup {
			creators = append(creators, u)
		}
	}
	return creators
}

// UserLevel returns the power level of userID in a v12 room (creators: math.MaxInt64, standing for infinite), given the create and (possibly nil) power levels events.
// Without a power levels event everyone else has level 0. A power levels event that cannot be
// read counts as one with the default levels.
func UserLevel(create, powerLevels gomatrixserverlib.PDU, userID string) int64 {
	if create != nil {
		if string(create.SenderID()) == userID {
			return math.MaxInt64
		}
		if c, err := parseCreateContent(create.Content()); err == nil {
			for _, u := range c.additionalCreators {
				if u == userID {
					return math.MaxInt64
				}
			}
		}
	}
	var pl *levels
	if powerLevels != nil {
		pl, _ = parseLevels(powerLevels.Content())
	}
	return pl.userLevel(userID)
}
