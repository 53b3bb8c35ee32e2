package roomversion

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"
)

var (
	testSeed = sha256.Sum256([]byte("roomversion test key"))
	testKey  = ed25519.NewKeyFromSeed(testSeed[:])
)

const testKeyID gomatrixserverlib.KeyID = "ed25519:t"

func buildEvent(t *testing.T, p gomatrixserverlib.ProtoEvent) gomatrixserverlib.PDU {
	t.Helper()
	ev, err := Build(V12, &p, time.UnixMilli(1700000000000), "a.test", testKeyID, testKey)
	if err != nil {
		t.Fatalf("build %s: %v", p.Type, err)
	}
	return ev
}

func empty() *string { s := ""; return &s }

func TestRegistered(t *testing.T) {
	impl, err := gomatrixserverlib.GetRoomVersion("12")
	if err != nil {
		t.Fatal(err)
	}
	if impl.Version() != V12 || !impl.Stable() || impl.StateResAlgorithm() != StateResV21 {
		t.Fatalf("version 12 registered as %s stable=%v stateres=%d", impl.Version(), impl.Stable(), impl.StateResAlgorithm())
	}
	if _, ok := gomatrixserverlib.StableRoomVersions()[V12]; !ok {
		t.Fatal("version 12 is not among the stable versions")
	}
}

func TestCreateEventGivesTheRoomID(t *testing.T) {
	create := buildEvent(t, gomatrixserverlib.ProtoEvent{SenderID: "@alice:a.test", Type: spec.MRoomCreate, StateKey: empty(),
		Content: []byte(`{"room_version":"12"}`), Depth: 1})
	if gjson.GetBytes(create.JSON(), "room_id").Exists() {
		t.Fatalf("a version 12 create event has a room_id: %s", create.JSON())
	}
	// The event ID is the reference hash: computed here from the redacted
	// event without signatures, independently of the package.
	redacted, _ := gomatrixserverlib.MustGetRoomVersion("11").RedactEventJSON(create.JSON())
	redacted, _ = sjson.DeleteBytes(redacted, "signatures")
	sum := sha256.Sum256(gomatrixserverlib.CanonicalJSONAssumeValid(redacted))
	want := "$" + base64.RawURLEncoding.EncodeToString(sum[:])
	if create.EventID() != want {
		t.Fatalf("event ID %s, want %s", create.EventID(), want)
	}
	roomID := create.RoomID()
	if roomID.String() != "!"+want[1:] || roomID.OpaqueID() != want[1:] || roomID.Domain() != "" {
		t.Fatalf("room ID %q opaque %q domain %q", roomID.String(), roomID.OpaqueID(), roomID.Domain())
	}
	if RoomIDOfCreate(create.EventID()) != roomID.String() || CreateEventID(roomID.String()) != create.EventID() {
		t.Fatal("room ID and create event ID do not map to each other")
	}

	// Another event of the room carries the room ID.
	msg := buildEvent(t, gomatrixserverlib.ProtoEvent{SenderID: "@alice:a.test", RoomID: roomID.String(), Type: "m.room.message",
		Content: []byte(`{"body":"hi","msgtype":"m.text"}`), PrevEvents: []string{create.EventID()}, AuthEvents: []string{}, Depth: 2})
	if msg.RoomID().String() != roomID.String() {
		t.Fatalf("message in room %q", msg.RoomID().String())
	}
	if _, err := Build(V12, &gomatrixserverlib.ProtoEvent{SenderID: "@alice:a.test", Type: "m.room.message", Content: []byte(`{}`)},
		time.Now(), "a.test", testKeyID, testKey); err == nil {
		t.Fatal("an event other than the create event was built without a room ID")
	}
}

func TestEventsReadBackFromAnotherServer(t *testing.T) {
	create := buildEvent(t, gomatrixserverlib.ProtoEvent{SenderID: "@alice:a.test", Type: spec.MRoomCreate, StateKey: empty(),
		Content: []byte(`{"room_version":"12","additional_creators":["@bob:b.test"]}`), Depth: 1})
	impl := gomatrixserverlib.MustGetRoomVersion(V12)
	// As received: with unsigned and age, which are removed.
	withUnsigned, _ := sjson.SetBytes(create.JSON(), "unsigned.age", 12)
	got, err := impl.NewEventFromUntrustedJSON(withUnsigned)
	if err != nil {
		t.Fatal(err)
	}
	if got.EventID() != create.EventID() || got.Redacted() || got.Version() != V12 {
		t.Fatalf("read back %s redacted=%v", got.EventID(), got.Redacted())
	}
	// The signature verifies over the redacted event.
	redacted, _ := impl.RedactEventJSON(got.JSON())
	if err := gomatrixserverlib.VerifyJSON("a.test", testKeyID, testKey.Public().(ed25519.PublicKey), redacted); err != nil {
		t.Fatalf("signature: %v", err)
	}
	// Content altered after signing: the event is redacted, keeping its ID
	// (the create event keeps its whole content in version 11's algorithm).
	topic := buildEvent(t, gomatrixserverlib.ProtoEvent{SenderID: "@alice:a.test", RoomID: create.RoomID().String(), Type: "m.room.topic",
		StateKey: empty(), Content: []byte(`{"topic":"t"}`), PrevEvents: []string{}, AuthEvents: []string{}, Depth: 2})
	altered, _ := sjson.SetBytes(topic.JSON(), "content.topic", "changed")
	got, err = impl.NewEventFromUntrustedJSON(altered)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Redacted() || gjson.GetBytes(got.Content(), "topic").Exists() || got.EventID() != topic.EventID() {
		t.Fatalf("altered event: redacted=%v content=%s id=%s want %s", got.Redacted(), got.Content(), got.EventID(), topic.EventID())
	}
	for name, bad := range map[string]string{
		"headered":       `{"_room_version":"12","type":"m.room.message","sender":"@a:a.test","room_id":"!x","content":{},"prev_events":[],"auth_events":[],"depth":1}`,
		"not an object":  `[1]`,
		"no room ID":     `{"type":"m.room.message","sender":"@a:a.test","content":{},"prev_events":[],"auth_events":[],"depth":1,"origin_server_ts":1}`,
		"float":          `{"type":"m.room.message","sender":"@a:a.test","room_id":"!x","content":{"n":1.5},"prev_events":[],"auth_events":[],"depth":1}`,
		"no prev events": `{"type":"m.room.message","sender":"@a:a.test","room_id":"!x","content":{},"auth_events":[],"depth":1}`,
		"bad sender":     `{"type":"m.room.message","sender":"alice","room_id":"!x","content":{},"prev_events":[],"auth_events":[],"depth":1}`,
	} {
		if _, err := impl.NewEventFromUntrustedJSON([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestEventAccessors(t *testing.T) {
	create := buildEvent(t, gomatrixserverlib.ProtoEvent{SenderID: "@alice:a.test", Type: spec.MRoomCreate, StateKey: empty(),
		Content: []byte(`{"room_version":"12"}`), Depth: 1})
	room := create.RoomID().String()
	member := buildEvent(t, gomatrixserverlib.ProtoEvent{SenderID: "@alice:a.test", RoomID: room, Type: spec.MRoomMember,
		StateKey: func() *string { s := "@alice:a.test"; return &s }(), Content: []byte(`{"membership":"join","displayname":"A"}`),
		PrevEvents: []string{create.EventID()}, AuthEvents: []string{}, Depth: 2})
	if m, err := member.Membership(); err != nil || m != "join" {
		t.Fatalf("membership %q %v", m, err)
	}
	pl := buildEvent(t, gomatrixserverlib.ProtoEvent{SenderID: "@alice:a.test", RoomID: room, Type: spec.MRoomPowerLevels,
		StateKey: empty(), Content: []byte(`{"users":{"@bob:b.test":50},"kick":60}`), PrevEvents: []string{member.EventID()}, AuthEvents: []string{member.EventID()}, Depth: 3})
	plc, err := pl.PowerLevels()
	if err != nil || plc.Kick != 60 || plc.UserLevel("@bob:b.test") != 50 {
		t.Fatalf("power levels %+v %v", plc, err)
	}
	red := buildEvent(t, gomatrixserverlib.ProtoEvent{SenderID: "@alice:a.test", RoomID: room, Type: spec.MRoomRedaction,
		Redacts: member.EventID(), Content: []byte(`{"reason":"x"}`), PrevEvents: []string{pl.EventID()}, AuthEvents: []string{}, Depth: 4})
	if red.Redacts() != member.EventID() || gjson.GetBytes(red.JSON(), "redacts").Exists() {
		t.Fatalf("redaction: %s", red.JSON())
	}
	withAge, err := member.SetUnsigned(map[string]any{"age": 5})
	if err != nil || gjson.GetBytes(withAge.JSON(), "unsigned.age").Int() != 5 || withAge.EventID() != member.EventID() {
		t.Fatalf("set unsigned: %s %v", withAge.JSON(), err)
	}
	if err := withAge.SetUnsignedField("prev_content", map[string]any{"membership": "invite"}); err != nil ||
		gjson.GetBytes(withAge.JSON(), "unsigned.prev_content.membership").Str != "invite" {
		t.Fatalf("set unsigned field: %s %v", withAge.JSON(), err)
	}
	member.Redact()
	if !member.Redacted() || gjson.GetBytes(member.Content(), "displayname").Exists() || gjson.GetBytes(member.Content(), "membership").Str != "join" {
		t.Fatalf("redacted member: %s", member.JSON())
	}
	// A second server's signature.
	seed := sha256.Sum256([]byte("other"))
	other := ed25519.NewKeyFromSeed(seed[:])
	signed := pl.Sign("b.test", "ed25519:b", other)
	redacted, _ := gomatrixserverlib.MustGetRoomVersion(V12).RedactEventJSON(signed.JSON())
	for srv, key := range map[string]ed25519.PrivateKey{"a.test": testKey, "b.test": other} {
		id := testKeyID
		if srv == "b.test" {
			id = "ed25519:b"
		}
		if err := gomatrixserverlib.VerifyJSON(srv, id, key.Public().(ed25519.PublicKey), redacted); err != nil {
			t.Fatalf("signature of %s: %v", srv, err)
		}
	}
	h, err := signed.ToHeaderedJSON()
	if err != nil || gjson.GetBytes(h, "_room_version").Str != "12" || gjson.GetBytes(h, "_event_id").Str != pl.EventID() {
		t.Fatalf("headered: %s", h)
	}
}

func TestParseRoomID(t *testing.T) {
	for _, ok := range []string{"!abc:a.test", "!" + strings.Repeat("A", 42) + "_"} {
		if _, err := ParseRoomID(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "!", "#a:b", "!short", "!" + strings.Repeat("A", 42) + "="} {
		if _, err := ParseRoomID(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
