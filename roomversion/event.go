package roomversion

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

// Event is a PDU of room version 12. It differs from version 11 in its
// room ID: the create event has no room_id field (its room ID is derived
// from its event ID), and no room ID has a server name.
type Event struct {
	raw      []byte // canonical JSON as held, unsigned included
	id       string
	roomID   spec.RoomID // read once: RoomID is asked often
	redacted bool
	f        fields
}

type fields struct {
	RoomID         string          `json:"room_id"`
	Sender         string          `json:"sender"`
	Type           string          `json:"type"`
	StateKey       *string         `json:"state_key"`
	Content        json.RawMessage `json:"content"`
	PrevEvents     []string        `json:"prev_events"`
	AuthEvents     []string        `json:"auth_events"`
	Depth          int64           `json:"depth"`
	OriginServerTS spec.Timestamp  `json:"origin_server_ts"`
	Unsigned       json.RawMessage `json:"unsigned"`
}

var _ gomatrixserverlib.PDU = (*Event)(nil)

var (
	errNotObject = errors.New("roomversion: an event is a JSON object")
	base         = func() gomatrixserverlib.IRoomVersion {
		return gomatrixserverlib.MustGetRoomVersion(gomatrixserverlib.RoomVersionV11)
	}
)

// trustedEvent reads an event this server stored or built; eventID, when
// given, saves computing the reference hash.
func trustedEvent(eventJSON []byte, eventID string, redacted bool) (*Event, error) {
	e := &Event{raw: eventJSON, id: eventID, redacted: redacted}
	if err := json.Unmarshal(eventJSON, &e.f); err != nil {
		return nil, err
	}
	if err := e.checkShape(); err != nil {
		return nil, err
	}
	if e.id == "" {
		id, err := referenceHash(eventJSON)
		if err != nil {
			return nil, err
		}
		e.id = id
	}
	if e.isCreate() {
		e.roomID = domainlessRoomID(RoomIDOfCreate(e.id))
	} else if r, err := ParseRoomID(e.f.RoomID); err == nil {
		e.roomID = r
	} else {
		e.roomID = domainlessRoomID(e.f.RoomID) // checked to start with "!"
	}
	return e, nil
}

// untrustedEvent reads an event received from another server: canonical
// JSON enforced, the fields a server must not send removed, the shape
// checked, and the event redacted when its content hash does not match (it
// was altered after signing; its signature still covers the redacted form).
func untrustedEvent(v gomatrixserverlib.IRoomVersion, eventJSON []byte) (gomatrixserverlib.PDU, error) {
	if !gjson.ValidBytes(eventJSON) || !gjson.ParseBytes(eventJSON).IsObject() {
		return nil, errNotObject
	}
	if gjson.GetBytes(eventJSON, "_*").Exists() {
		return nil, errors.New("roomversion: an event with a top-level key starting with '_' (headered) is not a PDU")
	}
	if err := v.CheckCanonicalJSON(eventJSON); err != nil {
		return nil, fmt.Errorf("roomversion: %w", err)
	}
	var err error
	for _, key := range []string{"outlier", "destinations", "age_ts", "unsigned", "event_id"} {
		if eventJSON, err = sjson.DeleteBytes(eventJSON, key); err != nil {
			return nil, err
		}
	}
	eventJSON = gomatrixserverlib.CanonicalJSONAssumeValid(eventJSON)
	redacted := false
	if !contentHashMatches(eventJSON) {
		if eventJSON, err = v.RedactEventJSON(eventJSON); err != nil {
			return nil, err
		}
		eventJSON = gomatrixserverlib.CanonicalJSONAssumeValid(eventJSON)
		redacted = true
	}
	e, err := trustedEvent(eventJSON, "", redacted)
	if err != nil {
		return nil, err
	}
	if err := gomatrixserverlib.CheckFields(e); err != nil {
		return nil, err
	}
	return e, nil
}

// checkShape checks what the accessors rely on: a type, a sender, a
// content object, prev and auth event lists, and a room ID on every event
// but the create event.
func (e *Event) checkShape() error {
	switch {
	case e.f.Type == "":
		return errors.New("roomversion: event has no type")
	case e.f.Sender == "":
		return errors.New("roomversion: event has no sender")
	case e.f.PrevEvents == nil || e.f.AuthEvents == nil:
		return errors.New("roomversion: auth events and prev events must not be nil")
	case len(e.f.Content) == 0 || e.f.Content[0] != '{':
		return errors.New("roomversion: event content is not an object")
	}
	if e.isCreate() {
		return nil // a room_id on a create event is refused by the auth rules
	}
	if len(e.f.RoomID) < 2 || e.f.RoomID[0] != '!' {
		return fmt.Errorf("roomversion: %q is not a room ID", e.f.RoomID)
	}
	return nil
}

func (e *Event) isCreate() bool {
	return e.f.Type == spec.MRoomCreate && e.f.StateKey != nil && *e.f.StateKey == ""
}

// referenceHash is a version 12 event ID: the SHA-256 of the redacted
// event without signatures and unsigned, in URL-safe unpadded base64.
func referenceHash(eventJSON []byte) (string, error) {
	redacted, err := base().RedactEventJSON(eventJSON)
	if err != nil {
		return "", err
	}
	for _, key := range []string{"signatures", "unsigned"} {
		if redacted, err = sjson.DeleteBytes(redacted, key); err != nil {
			return "", err
		}
	}
	sum := sha256.Sum256(gomatrixserverlib.CanonicalJSONAssumeValid(redacted))
	return "$" + base64.RawURLEncoding.EncodeToString(sum[:]), nil
}

// contentHash is the SHA-256 of the event without unsigned, signatures and
// hashes, in unpadded standard base64.
func contentHash(eventJSON []byte) (string, error) {
	var err error
	for _, key := range []string{"unsigned", "signatures", "hashes"} {
		if eventJSON, err = sjson.DeleteBytes(eventJSON, key); err != nil {
			return "", err
		}
	}
	sum := sha256.Sum256(gomatrixserverlib.CanonicalJSONAssumeValid(eventJSON))
	return base64.RawStdEncoding.EncodeToString(sum[:]), nil
}

func contentHashMatches(eventJSON []byte) bool {
	want := gjson.GetBytes(eventJSON, "hashes.sha256")
	if want.Type != gjson.String {
		return false
	}
	got, err := contentHash(eventJSON)
	if err != nil {
		return false
	}
	w, err := base64.RawStdEncoding.DecodeString(want.Str)
	if err != nil {
		return false
	}
	g, _ := base64.RawStdEncoding.DecodeString(got)
	return bytes.Equal(w, g)
}

func (e *Event) EventID() string                        { return e.id }
func (e *Event) StateKey() *string                      { return e.f.StateKey }
func (e *Event) Type() string                           { return e.f.Type }
func (e *Event) Content() []byte                        { return e.f.Content }
func (e *Event) Redacted() bool                         { return e.redacted }
func (e *Event) PrevEventIDs() []string                 { return e.f.PrevEvents }
func (e *Event) AuthEventIDs() []string                 { return e.f.AuthEvents }
func (e *Event) Depth() int64                           { return e.f.Depth }
func (e *Event) JSON() []byte                           { return e.raw }
func (e *Event) Unsigned() []byte                       { return e.f.Unsigned }
func (e *Event) Version() gomatrixserverlib.RoomVersion { return V12 }
func (e *Event) SenderID() spec.SenderID                { return spec.SenderID(e.f.Sender) }
func (e *Event) OriginServerTS() spec.Timestamp         { return e.f.OriginServerTS }

func (e *Event) StateKeyEquals(s string) bool {
	return e.f.StateKey != nil && *e.f.StateKey == s
}

// RoomID is the room_id field, or for the create event the room ID its
// hash gives.
func (e *Event) RoomID() spec.RoomID { return e.roomID }

// Redacts is the event a redaction redacts: in its content from version 11.
func (e *Event) Redacts() string {
	if e.f.Type != spec.MRoomRedaction {
		return ""
	}
	return gjson.GetBytes(e.f.Content, "redacts").Str
}

func (e *Event) JoinRule() (string, error) {
	if !e.StateKeyEquals("") {
		return "", errors.New("roomversion: not a m.room.join_rules event")
	}
	var c gomatrixserverlib.JoinRuleContent
	if err := json.Unmarshal(e.f.Content, &c); err != nil {
		return "", err
	}
	return c.JoinRule, nil
}

func (e *Event) HistoryVisibility() (gomatrixserverlib.HistoryVisibility, error) {
	if !e.StateKeyEquals("") {
		return "", errors.New("roomversion: not a m.room.history_visibility event")
	}
	var c gomatrixserverlib.HistoryVisibilityContent
	if err := json.Unmarshal(e.f.Content, &c); err != nil {
		return "", err
	}
	return c.HistoryVisibility, nil
}

func (e *Event) Membership() (string, error) {
	if e.f.StateKey == nil {
		return "", errors.New("roomversion: not a m.room.member event")
	}
	var c struct {
		Membership string `json:"membership"`
	}
	if err := json.Unmarshal(e.f.Content, &c); err != nil {
		return "", err
	}
	return c.Membership, nil
}

func (e *Event) PowerLevels() (*gomatrixserverlib.PowerLevelContent, error) {
	if !e.StateKeyEquals("") {
		return nil, errors.New("roomversion: not a m.room.power_levels event")
	}
	c, err := gomatrixserverlib.NewPowerLevelContentFromEvent(e)
	if err != nil {
		return nil, err
	}
	return &c, nil
}

// Redact replaces the event by its redacted form (version 11's algorithm).
func (e *Event) Redact() {
	if e.redacted {
		return
	}
	redacted, err := base().RedactEventJSON(e.raw)
	if err != nil {
		return // unreachable for an event that was parsed: its JSON is an object
	}
	redacted = gomatrixserverlib.CanonicalJSONAssumeValid(redacted)
	r, err := trustedEvent(redacted, e.id, true)
	if err != nil {
		return
	}
	*e = *r
}

// SetUnsigned returns a copy of the event with unsigned replaced.
func (e *Event) SetUnsigned(unsigned interface{}) (gomatrixserverlib.PDU, error) {
	u, err := json.Marshal(unsigned)
	if err != nil {
		return nil, err
	}
	raw, err := sjson.SetRawBytes(bytes.Clone(e.raw), "unsigned", u)
	if err != nil {
		return nil, err
	}
	c := *e
	c.raw = gomatrixserverlib.CanonicalJSONAssumeValid(raw)
	c.f.Unsigned = u
	return &c, nil
}

// SetUnsignedField sets one field (a gjson path) under unsigned.
func (e *Event) SetUnsignedField(path string, value interface{}) error {
	raw, err := sjson.SetBytes(bytes.Clone(e.raw), "unsigned."+path, value)
	if err != nil {
		return err
	}
	e.raw = gomatrixserverlib.CanonicalJSONAssumeValid(raw)
	e.f.Unsigned = json.RawMessage(gjson.GetBytes(e.raw, "unsigned").Raw)
	return nil
}

// Sign returns a copy of the event with a signature of signingName added,
// made over the redacted event as every signature of an event is.
func (e *Event) Sign(signingName string, keyID gomatrixserverlib.KeyID, key ed25519.PrivateKey) gomatrixserverlib.PDU {
	raw, err := sign(e.raw, signingName, keyID, key)
	if err != nil {
		return e // unreachable for an event that was parsed
	}
	c := *e
	c.raw = raw
	return &c
}

// ToHeaderedJSON is the event with its room version and ID, as
// gomatrixserverlib's headered events are written.
func (e *Event) ToHeaderedJSON() ([]byte, error) {
	raw, err := sjson.SetBytes(bytes.Clone(e.raw), "_room_version", e.Version())
	if err != nil {
		return nil, err
	}
	return sjson.SetBytes(raw, "_event_id", e.id)
}

// MarshalJSON writes the event as held.
func (e *Event) MarshalJSON() ([]byte, error) { return e.raw, nil }

// sign adds a signature made over the redacted event to eventJSON.
func sign(eventJSON []byte, signingName string, keyID gomatrixserverlib.KeyID, key ed25519.PrivateKey) ([]byte, error) {
	redacted, err := base().RedactEventJSON(eventJSON)
	if err != nil {
		return nil, err
	}
	signed, err := gomatrixserverlib.SignJSON(signingName, keyID, key, redacted)
	if err != nil {
		return nil, err
	}
	sig := gjson.GetBytes(signed, "signatures."+gjson.Escape(signingName)+"."+gjson.Escape(string(keyID)))
	out, err := sjson.SetBytes(bytes.Clone(eventJSON), "signatures."+sjsonEscape(signingName)+"."+sjsonEscape(string(keyID)), sig.Str)
	if err != nil {
		return nil, err
	}
	return gomatrixserverlib.CanonicalJSONAssumeValid(out), nil
}

// sjsonEscape escapes the characters sjson paths give a meaning to.
func sjsonEscape(s string) string {
	var b []byte
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '.', '*', '?', '|', '#', '@', '\\', ':':
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return string(b)
}
