package authrules

import (
	"math"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// Rule 1: the create event.
func TestCreateEvent(t *testing.T) {
	cases := []struct {
		name string
		opts createOpts
		rule string // "" = allowed
	}{
		{"plain", createOpts{}, ""},
		{"no room_version", createOpts{content: map[string]any{}}, ""},
		{"additional creators of any server", createOpts{content: map[string]any{"room_version": "12", "additional_creators": []string{"@carol:other.example", "@dave:third.example"}}}, ""},
		{"historical user ID as additional creator", createOpts{content: map[string]any{"room_version": "12", "additional_creators": []string{"@Carol:other.example"}}}, ""},
		{"empty additional creators", createOpts{content: map[string]any{"room_version": "12", "additional_creators": []string{}}}, ""},
		// v12: no check of the room ID's domain against the sender's.
		{"sender of any server", createOpts{sender: "@zed:elsewhere.example"}, ""},
		{"prev_events", createOpts{prev: []string{"$earlier"}}, "1.1"},
		{"room_id present", createOpts{keepRoomID: true}, "1.2"},
		{"unknown room version", createOpts{content: map[string]any{"room_version": "99"}}, "1.3"},
		{"room version not a string", createOpts{content: map[string]any{"room_version": 12}}, "1.3"},
		{"additional_creators a string", createOpts{content: map[string]any{"room_version": "12", "additional_creators": "@carol:other.example"}}, "1.4"},
		{"additional_creators an object", createOpts{content: map[string]any{"room_version": "12", "additional_creators": map[string]any{"@carol:other.example": true}}}, "1.4"},
		{"additional_creators null", createOpts{content: map[string]any{"room_version": "12", "additional_creators": nil}}, "1.4"},
		{"additional creator without sigil", createOpts{content: map[string]any{"room_version": "12", "additional_creators": []string{"carol:other.example"}}}, "1.4"},
		{"additional creator without server", createOpts{content: map[string]any{"room_version": "12", "additional_creators": []string{"@carol"}}}, "1.4"},
		{"additional creator with a bad server name", createOpts{content: map[string]any{"room_version": "12", "additional_creators": []string{"@carol:bad server"}}}, "1.4"},
		{"unknown room version and a bad additional creator", createOpts{content: map[string]any{"room_version": "99", "additional_creators": []string{"x"}}}, "1.3"},
		{"additional creator not a string", createOpts{content: map[string]any{"room_version": "12", "additional_creators": []any{"@carol:other.example", 5}}}, "1.4"},
		{"state key not empty", createOpts{stateKey: ptr("x")}, "1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ev, _ := newCreate(t, tc.opts)
			expectRule(t, Allowed(ev, &gomatrixserverlib.AuthEvents{}, userIDForSender), tc.rule)
		})
	}
}

func TestCreators(t *testing.T) {
	ev, _ := newCreate(t, createOpts{content: map[string]any{"additional_creators": []string{coCreate, creator, coCreate, admin}}})
	got, err := Creators(ev)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{creator, coCreate, admin}
	if len(got) != len(want) {
		t.Fatalf("creators %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("creators %v, want %v", got, want)
		}
	}

	plain, _ := newCreate(t, createOpts{})
	if got, err := Creators(plain); err != nil || len(got) != 1 || got[0] != creator {
		t.Fatalf("creators of a plain create event: %v %v", got, err)
	}

	bad, _ := newCreate(t, createOpts{content: map[string]any{"additional_creators": []string{"nobody"}}})
	if _, err := Creators(bad); err == nil {
		t.Fatal("creators of a create event with an invalid additional creator: no error")
	}
	if _, err := Creators(nil); err == nil {
		t.Fatal("creators of no create event: no error")
	}
}

func TestUserLevel(t *testing.T) {
	r := standardRoom(t, spec.Public)
	create, pl := r.state[tuple(spec.MRoomCreate, "")], r.state[tuple(spec.MRoomPowerLevels, "")]
	cases := []struct {
		user string
		pl   gomatrixserverlib.PDU
		want int64
		desc string
	}{
		{creator, pl, math.MaxInt64, "the create event's sender"},
		{coCreate, pl, math.MaxInt64, "an additional creator"},
		{creator, nil, math.MaxInt64, "the sender, no power levels"},
		{admin, pl, 100, "a user listed"},
		{mod, pl, 50, "a user listed"},
		{user, pl, 0, "users_default"},
		{admin, nil, 0, "no power levels event"},
	}
	for _, tc := range cases {
		if got := UserLevel(create, tc.pl, tc.user); got != tc.want {
			t.Errorf("%s (%s): level %d, want %d", tc.user, tc.desc, got, tc.want)
		}
	}
	withDefault := r.state_(creator, spec.MRoomPowerLevels, "", map[string]any{"users_default": 7})
	if got := UserLevel(create, withDefault, stranger); got != 7 {
		t.Errorf("users_default 7: level %d", got)
	}
}

func tuple(typ, sk string) gomatrixserverlib.StateKeyTuple {
	return gomatrixserverlib.StateKeyTuple{EventType: typ, StateKey: sk}
}
