package authrules

import (
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// basePL is the power levels content the rule 10 cases start from; mona (50)
// may send power levels events.
func basePL() map[string]any {
	return map[string]any{
		"users":         map[string]any{admin: 100, mod: 50, user: 10},
		"events":        map[string]any{"m.room.tombstone": 150, spec.MRoomPowerLevels: 50},
		"notifications": map[string]any{"room": 50},
		"ban":           50,
		"kick":          75,
	}
}

// withPL returns basePL changed by change.
func withPL(change func(c map[string]any)) map[string]any {
	c := basePL()
	if change != nil {
		change(c)
	}
	return c
}

func sub(c map[string]any, key string) map[string]any { return c[key].(map[string]any) }

// Rule 10: power levels.
func TestPowerLevels(t *testing.T) {
	pl := func(sender string, change func(c map[string]any)) func(r *room) gomatrixserverlib.PDU {
		return func(r *room) gomatrixserverlib.PDU {
			return r.state_(sender, spec.MRoomPowerLevels, "", withPL(change))
		}
	}
	// raw is a power levels event with a content as other servers may send it.
	raw := func(sender, content string) func(r *room) gomatrixserverlib.PDU {
		return func(r *room) gomatrixserverlib.PDU {
			return withContent(r.state_(sender, spec.MRoomPowerLevels, "", basePL()), content)
		}
	}
	setup := setPL(basePL())
	cases := []memberCase{
		{name: "unchanged", event: pl(mod, nil)},
		// Rule 10.1.
		{name: "ban a string", event: pl(mod, func(c map[string]any) { c["ban"] = "50" }), rule: "10.1"},
		{name: "kick a float", event: raw(mod, `{"users": {}, "kick": 50.5}`), rule: "10.1"},
		{name: "kick a float of integer value", event: raw(mod, `{"users": {}, "kick": 50.0}`), rule: "10.1"},
		{name: "kick with an exponent", event: raw(mod, `{"users": {}, "kick": 5e1}`), rule: "10.1"},
		{name: "invite null", event: pl(mod, func(c map[string]any) { c["invite"] = nil }), rule: "10.1"},
		{name: "state_default a boolean", event: pl(mod, func(c map[string]any) { c["state_default"] = true }), rule: "10.1"},
		{name: "users_default an object", event: pl(mod, func(c map[string]any) { c["users_default"] = map[string]any{} }), rule: "10.1"},
		// Rule 10.2.
		{name: "events value a string", event: pl(mod, func(c map[string]any) { sub(c, "events")["m.room.topic"] = "50" }), rule: "10.2"},
		{name: "events an array", event: pl(mod, func(c map[string]any) { c["events"] = []int{50} }), rule: "10.2"},
		{name: "notifications value a float", event: raw(mod, `{"users": {}, "notifications": {"room": 1.5}}`), rule: "10.2"},
		{name: "notifications null", event: pl(mod, func(c map[string]any) { c["notifications"] = nil }), rule: "10.2"},
		// Rule 10.3.
		{name: "users key not a user ID", event: pl(mod, func(c map[string]any) { sub(c, "users")["bob"] = 0 }), rule: "10.3"},
		{name: "users key without a server", event: pl(mod, func(c map[string]any) { sub(c, "users")["@bob:"] = 0 }), rule: "10.3"},
		{name: "users value a string", event: pl(mod, func(c map[string]any) { sub(c, "users")[user] = "10" }), rule: "10.3"},
		{name: "users a list", event: pl(mod, func(c map[string]any) { c["users"] = []string{user} }), rule: "10.3"},
		// Rule 10.4: creators are never listed, even by themselves.
		{name: "lists the creator", event: pl(creator, func(c map[string]any) { sub(c, "users")[creator] = 100 }), rule: "10.4"},
		{name: "lists an additional creator", event: pl(creator, func(c map[string]any) { sub(c, "users")[coCreate] = 9007199254740991 }), rule: "10.4"},
		{name: "lists the creator at 0", event: pl(coCreate, func(c map[string]any) { sub(c, "users")[creator] = 0 }), rule: "10.4"},
		// Rule 10.6: the single levels.
		{name: "lowers ban from its level", event: pl(mod, func(c map[string]any) { c["ban"] = 40 })},
		{name: "raises ban above its level", event: pl(mod, func(c map[string]any) { c["ban"] = 60 }), rule: "10.6"},
		{name: "changes kick from above its level", event: pl(mod, func(c map[string]any) { c["kick"] = 10 }), rule: "10.6"},
		{name: "removes kick, which was above its level", event: pl(mod, func(c map[string]any) { delete(c, "kick") }), rule: "10.6"},
		{name: "removes ban, which was at its level", event: pl(mod, func(c map[string]any) { delete(c, "ban") })},
		{name: "adds state_default at its level", event: pl(mod, func(c map[string]any) { c["state_default"] = 50 })},
		{name: "adds redact above its level", event: pl(mod, func(c map[string]any) { c["redact"] = 51 }), rule: "10.6"},
		{name: "adds users_default above its level", event: pl(mod, func(c map[string]any) { c["users_default"] = 60 }), rule: "10.6"},
		{name: "the creator raises invite to the maximum", event: pl(creator, func(c map[string]any) { c["invite"] = 9007199254740991 })},
		// Rules 10.7 and 10.8: events and notifications.
		{name: "changes an event level above its own", event: pl(admin, func(c map[string]any) { sub(c, "events")["m.room.tombstone"] = 100 }), rule: "10.7"},
		{name: "removes an event level above its own", event: pl(admin, func(c map[string]any) { delete(sub(c, "events"), "m.room.tombstone") }), rule: "10.7"},
		{name: "the creator changes the tombstone level", event: pl(coCreate, func(c map[string]any) { sub(c, "events")["m.room.tombstone"] = 100 })},
		{name: "adds an event level at its own", event: pl(mod, func(c map[string]any) { sub(c, "events")["m.room.topic"] = 50 })},
		{name: "adds an event level above its own", event: pl(mod, func(c map[string]any) { sub(c, "events")["m.room.topic"] = 75 }), rule: "10.8"},
		{name: "raises a notification level above its own", event: pl(mod, func(c map[string]any) { sub(c, "notifications")["room"] = 75 }), rule: "10.8"},
		{name: "lowers a notification level", event: pl(mod, func(c map[string]any) { sub(c, "notifications")["room"] = 0 })},
		{name: "changes a notification level above its own", setup: setPL(withPL(func(c map[string]any) { sub(c, "notifications")["room"] = 100 })),
			event: pl(mod, func(c map[string]any) { sub(c, "notifications")["room"] = 0 }), rule: "10.7"},
		// Rules 10.9 and 10.10: users.
		{name: "demotes a user below it", event: pl(mod, func(c map[string]any) { sub(c, "users")[user] = 0 })},
		{name: "removes a user below it", event: pl(mod, func(c map[string]any) { delete(sub(c, "users"), user) })},
		{name: "demotes itself", event: pl(mod, func(c map[string]any) { sub(c, "users")[mod] = 0 })},
		{name: "demotes a superior", event: pl(mod, func(c map[string]any) { sub(c, "users")[admin] = 0 }), rule: "10.9"},
		{name: "demotes an equal", setup: setPL(withPL(func(c map[string]any) { sub(c, "users")[user] = 50 })),
			event: pl(mod, func(c map[string]any) { sub(c, "users")[user] = 0 }), rule: "10.9"},
		{name: "removes an equal", setup: setPL(withPL(func(c map[string]any) { sub(c, "users")[user] = 50 })),
			event: pl(mod, func(c map[string]any) { delete(sub(c, "users"), user) }), rule: "10.9"},
		{name: "promotes to its own level", event: pl(mod, func(c map[string]any) { sub(c, "users")[user] = 50 })},
		{name: "promotes above its own level", event: pl(mod, func(c map[string]any) { sub(c, "users")[user] = 51 }), rule: "10.10"},
		{name: "raises itself", event: pl(mod, func(c map[string]any) { sub(c, "users")[mod] = 51 }), rule: "10.10"},
		{name: "admin demotes an equal admin", setup: setPL(withPL(func(c map[string]any) { sub(c, "users")[user] = 100 })),
			event: pl(admin, func(c map[string]any) { sub(c, "users")[user] = 0 }), rule: "10.9"},
		// v12: creators demote and promote anyone to any level.
		{name: "the creator demotes an admin", event: pl(creator, func(c map[string]any) { sub(c, "users")[admin] = 0 })},
		{name: "an additional creator removes an admin", event: pl(coCreate, func(c map[string]any) { delete(sub(c, "users"), admin) })},
		{name: "the creator promotes to the maximum", event: pl(creator, func(c map[string]any) { sub(c, "users")[user] = 9007199254740991 })},
		{name: "a user at the maximum demotes another", setup: setPL(withPL(func(c map[string]any) {
			sub(c, "users")[admin] = 9007199254740991
			sub(c, "users")[user] = 9007199254740991
		})), event: pl(admin, func(c map[string]any) {
			sub(c, "users")[admin] = 9007199254740991
			sub(c, "users")[user] = 0
		}), rule: "10.9"},
	}
	for i := range cases {
		if cases[i].setup == nil {
			cases[i].setup = setup
		}
	}
	runMemberCases(t, cases)
}

// Rule 10.5: the first power levels event, after rules 10.1 to 10.4.
func TestFirstPowerLevels(t *testing.T) {
	for _, tc := range []struct {
		name    string
		content map[string]any
		rule    string
	}{
		{"anything", map[string]any{"users": map[string]int{admin: 9007199254740991}, "ban": 9007199254740991}, ""},
		{"listing the creator", map[string]any{"users": map[string]int{creator: 100}}, "10.4"},
		{"listing an additional creator", map[string]any{"users": map[string]int{coCreate: 100}}, "10.4"},
		{"a level not an integer", map[string]any{"ban": "50"}, "10.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRoom(t, map[string]any{"room_version": "12", "additional_creators": []string{coCreate}})
			expectRule(t, r.allowed(r.state_(creator, spec.MRoomPowerLevels, "", tc.content)), tc.rule)
		})
	}
}

// A power levels event in the room's state that is not valid (one that the
// rules would have rejected) refuses what relies on it rather than be read
// leniently.
func TestInvalidPowerLevelsInState(t *testing.T) {
	r := standardRoom(t, spec.Public)
	r.apply(r.state_(creator, spec.MRoomPowerLevels, "", map[string]any{"users": map[string]any{admin: "100"}}))
	expectRule(t, r.allowed(r.message(admin)), "3")
}
