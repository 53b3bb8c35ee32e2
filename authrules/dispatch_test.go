package authrules

import (
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// newV11Room makes a room version 11 room of real version 11 events: join
// rules public, creator and the given users joined, then the power levels
// content given.
func newV11Room(t *testing.T, plContent map[string]any, users ...string) *room {
	t.Helper()
	roomID, err := spec.NewRoomID("!v11room:creator.example")
	if err != nil {
		t.Fatal(err)
	}
	create := build(t, gomatrixserverlib.RoomVersionV11, &gomatrixserverlib.ProtoEvent{
		SenderID: creator, RoomID: roomID.String(), Type: spec.MRoomCreate, StateKey: ptr(""),
		PrevEvents: []string{}, AuthEvents: []string{}, Depth: 1, Content: mustJSON(t, map[string]any{"room_version": "11"}),
	})
	r := &room{t: t, version: gomatrixserverlib.RoomVersionV11, roomID: *roomID, create: create,
		state: map[gomatrixserverlib.StateKeyTuple]gomatrixserverlib.PDU{}}
	expectRule(t, Allowed(create, &gomatrixserverlib.AuthEvents{}, userIDForSender), "")
	r.apply(create)
	r.mustApply(r.member(creator, creator, spec.Join, nil))
	r.mustApply(r.state_(creator, spec.MRoomJoinRules, "", map[string]any{"join_rule": spec.Public}))
	for _, u := range users {
		r.mustApply(r.member(u, u, spec.Join, nil))
	}
	r.mustApply(r.state_(creator, spec.MRoomPowerLevels, "", plContent))
	return r
}

// Versions 1 to 11 keep gomatrixserverlib's rules: where they differ from
// version 12, each version gets its own answer.
func TestDispatchByVersion(t *testing.T) {
	pl := map[string]any{"users": map[string]int{admin: 100}}

	// The creator, listed nowhere in the power levels, kicks a user: in
	// version 11 the creator has users_default, 0; in version 12, infinite.
	v11 := newV11Room(t, pl, admin, user)
	if v11.version != gomatrixserverlib.RoomVersionV11 || v11.message(user).Version() != gomatrixserverlib.RoomVersionV11 {
		t.Fatal("the version 11 room does not make version 11 events")
	}
	if err := v11.allowed(v11.member(creator, user, spec.Leave, nil)); err == nil {
		t.Fatal("version 11: a creator at level 0 kicked a user")
	}
	v12 := newRoom(t, nil)
	v12.mustApply(v12.state_(creator, spec.MRoomJoinRules, "", map[string]any{"join_rule": spec.Public}))
	v12.mustApply(v12.member(admin, admin, spec.Join, nil))
	v12.mustApply(v12.member(user, user, spec.Join, nil))
	v12.mustApply(v12.state_(creator, spec.MRoomPowerLevels, "", pl))
	expectRule(t, v12.allowed(v12.member(creator, user, spec.Leave, nil)), "")

	// And the admin kicks the creator: allowed in version 11, never in 12.
	if err := v11.allowed(v11.member(admin, creator, spec.Leave, nil)); err != nil {
		t.Fatalf("version 11: an admin could not kick the creator at level 0: %v", err)
	}
	expectRule(t, v12.allowed(v12.member(admin, creator, spec.Leave, nil)), "5.5.5")

	// Version 11 lists the creator in power levels; version 12 refuses it.
	if err := v11.allowed(v11.state_(admin, spec.MRoomPowerLevels, "", map[string]any{"users": map[string]int{admin: 100, creator: 50}})); err != nil {
		t.Fatalf("version 11: power levels listing the creator refused: %v", err)
	}

	// A version 11 create event whose room ID is of another server than its
	// sender's is refused (by gomatrixserverlib's rule 1.2); version 12 has
	// no such rule.
	foreign := build(t, gomatrixserverlib.RoomVersionV11, &gomatrixserverlib.ProtoEvent{
		SenderID: "@zed:elsewhere.example", RoomID: "!x:creator.example", Type: spec.MRoomCreate, StateKey: ptr(""),
		PrevEvents: []string{}, AuthEvents: []string{}, Depth: 1, Content: []byte(`{"room_version":"11"}`),
	})
	if err := Allowed(foreign, &gomatrixserverlib.AuthEvents{}, userIDForSender); err == nil {
		t.Fatal("version 11: a create event of a room ID of another server allowed")
	}
	create12, _ := newCreate(t, createOpts{sender: "@zed:elsewhere.example"})
	expectRule(t, Allowed(create12, &gomatrixserverlib.AuthEvents{}, userIDForSender), "")
}
