package authrules

import (
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// memberCase is a membership event checked against a standard room (see
// standardRoom) with a join rule, after some setup.
type memberCase struct {
	name     string
	joinRule string // default public
	setup    func(r *room)
	event    func(r *room) gomatrixserverlib.PDU
	rule     string // "" = allowed
}

func runMemberCases(t *testing.T, cases []memberCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			jr := tc.joinRule
			if jr == "" {
				jr = spec.Public
			}
			r := standardRoom(t, jr)
			if tc.setup != nil {
				tc.setup(r)
			}
			expectRule(t, r.allowed(tc.event(r)), tc.rule)
		})
	}
}

// member returns an event func for a membership event.
func member(sender, target, membership string) func(r *room) gomatrixserverlib.PDU {
	return func(r *room) gomatrixserverlib.PDU { return r.member(sender, target, membership, nil) }
}

// seq applies membership events in order (each must be allowed).
func seq(events ...[3]string) func(r *room) {
	return func(r *room) {
		for _, e := range events {
			r.mustApply(r.member(e[0], e[1], e[2], nil))
		}
	}
}

func setPL(content map[string]any) func(r *room) {
	return func(r *room) { r.mustApply(r.state_(creator, spec.MRoomPowerLevels, "", content)) }
}

func TestMemberBasics(t *testing.T) {
	runMemberCases(t, []memberCase{
		{name: "no membership", event: func(r *room) gomatrixserverlib.PDU {
			return r.event(stranger, spec.MRoomMember, ptr(stranger), map[string]any{"displayname": "Sam"})
		}, rule: "5.1"},
		{name: "membership not a string", event: func(r *room) gomatrixserverlib.PDU {
			return r.event(stranger, spec.MRoomMember, ptr(stranger), map[string]any{"membership": 1})
		}, rule: "5.1"},
		{name: "unknown membership", event: member(stranger, stranger, "wander"), rule: "5.8"},
		{name: "no state key", event: func(r *room) gomatrixserverlib.PDU {
			return r.event(stranger, spec.MRoomMember, nil, map[string]any{"membership": spec.Join})
		}, rule: "5.1"},
	})
}

// Rule 5.3: joins.
func TestJoin(t *testing.T) {
	runMemberCases(t, []memberCase{
		{name: "public room", event: member(stranger, stranger, spec.Join)},
		{name: "joined user updates their join", event: member(user, user, spec.Join)},
		{name: "joining someone else", event: member(admin, stranger, spec.Join), rule: "5.3.2"},
		{name: "banned", setup: seq([3]string{mod, stranger, spec.Ban}), event: member(stranger, stranger, spec.Join), rule: "5.3.3"},
		{name: "invite room, not invited", joinRule: spec.Invite, event: member(stranger, stranger, spec.Join), rule: "5.3.4"},
		{name: "invite room, invited", joinRule: spec.Invite, setup: seq([3]string{user, stranger, spec.Invite}), event: member(stranger, stranger, spec.Join)},
		{name: "invite room, left", joinRule: spec.Invite, setup: seq([3]string{user, user, spec.Leave}), event: member(user, user, spec.Join), rule: "5.3.4"},
		{name: "knock room, not invited", joinRule: spec.Knock, event: member(stranger, stranger, spec.Join), rule: "5.3.4"},
		{name: "knock room, knocked", joinRule: spec.Knock, setup: seq([3]string{stranger, stranger, spec.Knock}), event: member(stranger, stranger, spec.Join), rule: "5.3.4"},
		{name: "knock room, invited", joinRule: spec.Knock, setup: seq([3]string{stranger, stranger, spec.Knock}, [3]string{user, stranger, spec.Invite}), event: member(stranger, stranger, spec.Join)},
		{name: "private join rule", joinRule: "private", event: member(stranger, stranger, spec.Join), rule: "5.3.7"},
		{name: "join rules event without join_rule, invited", setup: func(r *room) {
			r.mustApply(r.state_(creator, spec.MRoomJoinRules, "", map[string]any{"allow": []any{}}))
			r.mustApply(r.member(user, stranger, spec.Invite, nil))
		}, event: member(stranger, stranger, spec.Join)},
		{name: "join rules event without join_rule, not invited", setup: func(r *room) {
			r.mustApply(r.state_(creator, spec.MRoomJoinRules, "", map[string]any{"allow": []any{}}))
		}, event: member(stranger, stranger, spec.Join), rule: "5.3.4"},
		{name: "leave with an odd join_authorised_via_users_server", event: func(r *room) gomatrixserverlib.PDU {
			return r.member(user, user, spec.Leave, map[string]any{"join_authorised_via_users_server": 5})
		}},
		{name: "no join rules event", setup: func(r *room) { delete(r.state, tuple(spec.MRoomJoinRules, "")) }, event: member(stranger, stranger, spec.Join), rule: "5.3.4"},
	})
}

// Rule 5.3.1: the creator's join right after the create event.
func TestCreatorFirstJoin(t *testing.T) {
	for _, tc := range []struct {
		name   string
		sender string
		target string
		rule   string
	}{
		{"the create event's sender", creator, creator, ""},
		// The rule names the create event's sender; an additional creator joins
		// as anyone does (no join rules yet: invite only).
		{"an additional creator", coCreate, coCreate, "5.3.4"},
		{"someone else", stranger, stranger, "5.3.4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			create, roomID := newCreate(t, createOpts{content: map[string]any{"room_version": "12", "additional_creators": []string{coCreate}}})
			r := &room{t: t, version: RoomVersion12, roomID: roomID, create: create, state: map[gomatrixserverlib.StateKeyTuple]gomatrixserverlib.PDU{}}
			r.apply(create)
			expectRule(t, r.allowed(r.member(tc.sender, tc.target, spec.Join, nil)), tc.rule)
		})
	}
	// The creator's join after anything else than the create event alone.
	create, roomID := newCreate(t, createOpts{})
	r := &room{t: t, version: RoomVersion12, roomID: roomID, create: create, state: map[gomatrixserverlib.StateKeyTuple]gomatrixserverlib.PDU{}}
	r.apply(create)
	join := r.eventWith(creator, spec.MRoomMember, ptr(creator), map[string]any{"membership": spec.Join}, func(p *gomatrixserverlib.ProtoEvent) {
		p.PrevEvents = []string{create.EventID(), "$other"}
	})
	expectRule(t, r.allowed(join), "5.3.4")
}

// Rule 5.3.5: restricted joins.
func TestRestrictedJoin(t *testing.T) {
	via := func(u string) func(r *room) gomatrixserverlib.PDU {
		return func(r *room) gomatrixserverlib.PDU {
			return r.member(stranger, stranger, spec.Join, map[string]any{"join_authorised_via_users_server": u})
		}
	}
	inviteAt := func(n int) func(r *room) {
		return setPL(map[string]any{"users": map[string]int{admin: 100, mod: 50}, "invite": n})
	}
	for _, jr := range []string{spec.Restricted, spec.KnockRestricted} {
		t.Run(jr, func(t *testing.T) {
			runMemberCases(t, []memberCase{
				{name: "authorised by a member who may invite", joinRule: jr, setup: inviteAt(50), event: via(mod)},
				{name: "authorised by a member below the invite level", joinRule: jr, setup: inviteAt(50), event: via(user), rule: "5.3.5.2"},
				// A creator listed nowhere in the power levels may invite at any level.
				{name: "authorised by an additional creator", joinRule: jr, setup: inviteAt(100000), event: via(coCreate)},
				{name: "authorised by someone not joined", joinRule: jr, setup: func(r *room) {
					inviteAt(0)(r)
					r.mustApply(r.member(user, user, spec.Leave, nil))
				}, event: via(user), rule: "5.3.5.2"},
				{name: "authorised by a number", joinRule: jr, event: func(r *room) gomatrixserverlib.PDU {
					return r.member(stranger, stranger, spec.Join, map[string]any{"join_authorised_via_users_server": 5})
				}, rule: "5.3.5.2"},
				{name: "authorised by null", joinRule: jr, event: func(r *room) gomatrixserverlib.PDU {
					return r.member(stranger, stranger, spec.Join, map[string]any{"join_authorised_via_users_server": nil})
				}, rule: "5.3.5.2"},
				{name: "authorised by nobody", joinRule: jr, event: member(stranger, stranger, spec.Join), rule: "5.3.5.2"},
				{name: "invited, no authorising user", joinRule: jr, setup: seq([3]string{user, stranger, spec.Invite}), event: member(stranger, stranger, spec.Join)},
				{name: "banned, authorised", joinRule: jr, setup: seq([3]string{mod, stranger, spec.Ban}), event: via(mod), rule: "5.3.3"},
			})
		})
	}
}

// Rule 5.4: invites.
func TestInvite(t *testing.T) {
	runMemberCases(t, []memberCase{
		{name: "by a member", event: member(user, stranger, spec.Invite)},
		{name: "by someone not joined", event: member("@eve:other.example", stranger, spec.Invite), rule: "5.4.2"},
		{name: "by someone who left", setup: seq([3]string{user, user, spec.Leave}), event: member(user, stranger, spec.Invite), rule: "5.4.2"},
		{name: "of a member", event: member(mod, user, spec.Invite), rule: "5.4.3"},
		{name: "of a banned user", setup: seq([3]string{mod, stranger, spec.Ban}), event: member(mod, stranger, spec.Invite), rule: "5.4.3"},
		{name: "invite level above the sender", setup: setPL(map[string]any{"users": map[string]int{admin: 100, mod: 50}, "invite": 50}), event: member(user, stranger, spec.Invite), rule: "5.4.5"},
		{name: "invite level reached", setup: setPL(map[string]any{"users": map[string]int{admin: 100, mod: 50}, "invite": 50}), event: member(mod, stranger, spec.Invite)},
		// Creators are above any invite level.
		{name: "creator, invite level at the maximum", setup: setPL(map[string]any{"users": map[string]int{admin: 100}, "invite": 9007199254740991}), event: member(coCreate, stranger, spec.Invite)},
		{name: "of a knocking user", joinRule: spec.Knock, setup: seq([3]string{stranger, stranger, spec.Knock}), event: member(user, stranger, spec.Invite)},
	})
}

// Rule 5.5: leaving, kicks and unbans.
func TestLeave(t *testing.T) {
	runMemberCases(t, []memberCase{
		{name: "joined user leaves", event: member(user, user, spec.Leave)},
		{name: "invited user declines", setup: seq([3]string{user, stranger, spec.Invite}), event: member(stranger, stranger, spec.Leave)},
		{name: "knocking user withdraws", joinRule: spec.Knock, setup: seq([3]string{stranger, stranger, spec.Knock}), event: member(stranger, stranger, spec.Leave)},
		{name: "user never in the room leaves", event: member(stranger, stranger, spec.Leave), rule: "5.5.1"},
		{name: "user who left leaves again", setup: seq([3]string{user, user, spec.Leave}), event: member(user, user, spec.Leave), rule: "5.5.1"},
		{name: "banned user unbans themself", setup: seq([3]string{mod, user, spec.Ban}), event: member(user, user, spec.Leave), rule: "5.5.1"},
		{name: "a creator leaves", event: member(coCreate, coCreate, spec.Leave)},
		{name: "kick by a moderator", event: member(mod, user, spec.Leave)},
		{name: "kick by someone not joined", setup: seq([3]string{mod, mod, spec.Leave}), event: member(mod, user, spec.Leave), rule: "5.5.2"},
		{name: "kick below the kick level", event: member(user, stranger, spec.Leave), rule: "5.5.5"},
		{name: "kick of an equal", setup: setPL(map[string]any{"users": map[string]int{admin: 100, mod: 50, user: 50}}), event: member(mod, user, spec.Leave), rule: "5.5.5"},
		{name: "kick of a superior", event: member(mod, admin, spec.Leave), rule: "5.5.5"},
		// v12: creators, in no users map, are above everyone else...
		{name: "creator kicks an admin", event: member(creator, admin, spec.Leave)},
		{name: "additional creator kicks an admin", event: member(coCreate, admin, spec.Leave)},
		{name: "creator kicks a user at the maximum level", setup: setPL(map[string]any{"users": map[string]int{admin: 9007199254740991}}), event: member(coCreate, admin, spec.Leave)},
		// ... and nobody, not even another creator, can remove a creator.
		{name: "admin kicks the creator", event: member(admin, creator, spec.Leave), rule: "5.5.5"},
		{name: "user at the maximum level kicks a creator", setup: setPL(map[string]any{"users": map[string]int{admin: 9007199254740991}}), event: member(admin, coCreate, spec.Leave), rule: "5.5.5"},
		{name: "creator kicks the additional creator", event: member(creator, coCreate, spec.Leave), rule: "5.5.5"},
		{name: "additional creator kicks the creator", event: member(coCreate, creator, spec.Leave), rule: "5.5.5"},
		// Unbans need the ban level too.
		{name: "unban by a moderator", setup: seq([3]string{mod, stranger, spec.Ban}), event: member(mod, stranger, spec.Leave)},
		{name: "unban at the kick level, below the ban level", setup: func(r *room) {
			setPL(map[string]any{"users": map[string]int{admin: 100, mod: 50}, "kick": 50, "ban": 75})(r)
			r.mustApply(r.member(admin, stranger, spec.Ban, nil))
		}, event: member(mod, stranger, spec.Leave), rule: "5.5.3"},
		{name: "unban at the ban level, below the kick level", setup: func(r *room) {
			setPL(map[string]any{"users": map[string]int{admin: 100, mod: 50}, "kick": 75, "ban": 50})(r)
			r.mustApply(r.member(admin, stranger, spec.Ban, nil))
		}, event: member(mod, stranger, spec.Leave), rule: "5.5.5"},
	})
}

// Rule 5.6: bans.
func TestBan(t *testing.T) {
	runMemberCases(t, []memberCase{
		{name: "by a moderator", event: member(mod, user, spec.Ban)},
		{name: "of someone never in the room", event: member(mod, stranger, spec.Ban)},
		{name: "by someone not joined", setup: seq([3]string{mod, mod, spec.Leave}), event: member(mod, user, spec.Ban), rule: "5.6.1"},
		{name: "below the ban level", event: member(user, stranger, spec.Ban), rule: "5.6.3"},
		{name: "below the ban level, above the target", setup: setPL(map[string]any{"users": map[string]int{admin: 100, mod: 50, user: 10}}), event: member(user, stranger, spec.Ban), rule: "5.6.3"},
		{name: "of an equal", setup: setPL(map[string]any{"users": map[string]int{admin: 100, mod: 50, user: 50}}), event: member(mod, user, spec.Ban), rule: "5.6.3"},
		{name: "creator bans an admin", event: member(creator, admin, spec.Ban)},
		{name: "admin bans the creator", event: member(admin, creator, spec.Ban), rule: "5.6.3"},
		{name: "admin bans an additional creator", event: member(admin, coCreate, spec.Ban), rule: "5.6.3"},
		{name: "creator bans the additional creator", event: member(creator, coCreate, spec.Ban), rule: "5.6.3"},
		{name: "creator bans at the maximum ban level", setup: setPL(map[string]any{"users": map[string]int{admin: 9007199254740991}, "ban": 9007199254740991}), event: member(creator, admin, spec.Ban)},
		{name: "user at the maximum level bans an equal", setup: setPL(map[string]any{"users": map[string]int{admin: 9007199254740991, mod: 9007199254740991}}), event: member(admin, mod, spec.Ban), rule: "5.6.3"},
	})
}

// Rule 5.7: knocks.
func TestKnock(t *testing.T) {
	runMemberCases(t, []memberCase{
		{name: "knock room", joinRule: spec.Knock, event: member(stranger, stranger, spec.Knock)},
		{name: "knock_restricted room", joinRule: spec.KnockRestricted, event: member(stranger, stranger, spec.Knock)},
		{name: "after leaving", joinRule: spec.Knock, setup: seq([3]string{user, user, spec.Leave}), event: member(user, user, spec.Knock)},
		{name: "public room", event: member(stranger, stranger, spec.Knock), rule: "5.7.1"},
		{name: "invite room", joinRule: spec.Invite, event: member(stranger, stranger, spec.Knock), rule: "5.7.1"},
		{name: "restricted room", joinRule: spec.Restricted, event: member(stranger, stranger, spec.Knock), rule: "5.7.1"},
		{name: "for someone else", joinRule: spec.Knock, event: member(user, stranger, spec.Knock), rule: "5.7.2"},
		{name: "already joined", joinRule: spec.Knock, event: member(user, user, spec.Knock), rule: "5.7.4"},
		{name: "already invited", joinRule: spec.Knock, setup: seq([3]string{user, stranger, spec.Invite}), event: member(stranger, stranger, spec.Knock), rule: "5.7.4"},
		{name: "banned", joinRule: spec.Knock, setup: seq([3]string{mod, stranger, spec.Ban}), event: member(stranger, stranger, spec.Knock), rule: "5.7.4"},
	})
}
