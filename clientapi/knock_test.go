package clientapi_test

import (
	"net/url"
	"slices"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

func knockPath(roomIDOrAlias string) string { return v3 + "/knock/" + url.PathEscape(roomIDOrAlias) }

// strippedTypes returns "type|membership-or-join_rule" of a knock_state
// or invite_state's events, sorted.
func strippedTypes(t *testing.T, room map[string]any, part string) []string {
	t.Helper()
	p, _ := room[part].(map[string]any)
	if p == nil {
		t.Fatalf("no %s in %v", part, room)
	}
	var out []string
	for _, e := range p["events"].([]any) {
		ev := e.(map[string]any)
		s := ev["type"].(string)
		c, _ := ev["content"].(map[string]any)
		if m, ok := c["membership"].(string); ok {
			s += "|" + m
		}
		if jr, ok := c["join_rule"].(string); ok {
			s += "|" + jr
		}
		// The create event is shown whole (MSC4311), the rest stripped.
		if _, ok := ev["event_id"]; ok != (ev["type"] == "m.room.create") {
			t.Fatalf("stripped state with an event ID, or a create event without: %v", ev)
		}
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// Knocking on a room of this server: the knocker sees the room under
// rooms.knock with its stripped state, the members see the knock in the
// timeline; an invite accepts it, a kick rejects it and the knocker's
// leave withdraws it. Rooms that do not let a user knock refuse.
func TestKnockLocal(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		dave := srv.Register(t, "dave", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "private_chat", "name": "knock here", "room_alias_name": "knocky",
			"initial_state": []any{map[string]any{"type": "m.room.join_rules", "content": map[string]any{"join_rule": "knock"}}}})
		public := createRoom(t, srv, alice, map[string]any{"preset": "public_chat"})
		old := createRoom(t, srv, alice, map[string]any{"preset": "private_chat", "room_version": "6",
			"initial_state": []any{map[string]any{"type": "m.room.join_rules", "content": map[string]any{"join_rule": "knock"}}}})
		aliceSince := roomSync(t, srv, alice, nil)["next_batch"].(string)
		bobSince := roomSync(t, srv, bob, nil)["next_batch"].(string)

		// Refusals, each changing nothing.
		expectError(t, srv, "POST", knockPath(public), bob.Token, map[string]any{}, 403, "M_FORBIDDEN")
		expectError(t, srv, "POST", knockPath(old), bob.Token, map[string]any{}, 403, "M_FORBIDDEN")
		expectError(t, srv, "POST", knockPath(roomID), alice.Token, map[string]any{}, 403, "M_FORBIDDEN") // already in
		expectError(t, srv, "POST", knockPath("!nowhere:"+srv.ServerName), bob.Token, map[string]any{}, 404, "M_NOT_FOUND")
		expectError(t, srv, "POST", knockPath("nonsense"), bob.Token, map[string]any{}, 400, "M_INVALID_PARAM")
		expectError(t, srv, "POST", knockPath(roomID), bob.Token, map[string]any{"reason": 7}, 400, "M_BAD_JSON")
		expectError(t, srv, "POST", knockPath(roomID), "", map[string]any{}, 401, "M_MISSING_TOKEN")
		if m := membershipOf(t, srv, alice, roomID, bob.UserID); m != "" {
			t.Fatalf("bob's membership after refusals %q", m)
		}

		// bob knocks by alias, with a reason.
		r := srv.Must(t, "POST", knockPath("#knocky:"+srv.ServerName), bob.Token, map[string]any{"reason": "let me in"})
		if r["room_id"] != roomID {
			t.Fatalf("knock answer %v", r)
		}
		if m := membershipOf(t, srv, alice, roomID, bob.UserID); m != "knock" {
			t.Fatalf("bob's membership %q", m)
		}
		sync := roomSync(t, srv, bob, url.Values{"since": {bobSince}})
		k := section(t, sync, "knock", roomID)
		if k == nil || section(t, sync, "join", roomID) != nil {
			t.Fatalf("bob's sync rooms %v", sync["rooms"])
		}
		if got := strippedTypes(t, k, "knock_state"); !slices.Equal(got, []string{"m.room.canonical_alias", "m.room.create", "m.room.join_rules|knock", "m.room.member|knock", "m.room.name"}) {
			t.Fatalf("knock_state %v", got)
		}
		bobSince = sync["next_batch"].(string)
		// The initial sync shows it too; the next incremental one does not.
		if section(t, roomSync(t, srv, bob, nil), "knock", roomID) == nil {
			t.Fatal("no knock in bob's initial sync")
		}
		if section(t, roomSync(t, srv, bob, url.Values{"since": {bobSince}}), "knock", roomID) != nil {
			t.Fatal("the knock again in an incremental sync")
		}
		// alice sees the knock in the timeline.
		sync = roomSync(t, srv, alice, url.Values{"since": {aliceSince}})
		var seen bool
		for _, e := range section(t, sync, "join", roomID)["timeline"].(map[string]any)["events"].([]any) {
			ev := e.(map[string]any)
			c := ev["content"].(map[string]any)
			if ev["type"] == "m.room.member" && ev["state_key"] == bob.UserID && c["membership"] == "knock" && c["reason"] == "let me in" {
				seen = true
			}
		}
		if !seen {
			t.Fatalf("alice's timeline has no knock: %v", section(t, sync, "join", roomID))
		}

		// Accepted by an invite: bob is invited, then joins.
		srv.Must(t, "POST", roomPath(roomID, "/invite"), alice.Token, map[string]any{"user_id": bob.UserID})
		sync = roomSync(t, srv, bob, url.Values{"since": {bobSince}})
		if section(t, sync, "invite", roomID) == nil || section(t, sync, "knock", roomID) != nil {
			t.Fatalf("bob's sync after the invite %v", sync["rooms"])
		}
		srv.Must(t, "POST", v3+"/join/"+url.PathEscape(roomID), bob.Token, map[string]any{})
		if m := membershipOf(t, srv, alice, roomID, bob.UserID); m != "join" {
			t.Fatalf("bob after joining %q", m)
		}

		// Rejected by a kick: carol's knock ends in a leave she sees.
		srv.Must(t, "POST", knockPath(roomID), carol.Token, nil)
		carolSince := roomSync(t, srv, carol, nil)["next_batch"].(string)
		srv.Must(t, "POST", roomPath(roomID, "/kick"), alice.Token, map[string]any{"user_id": carol.UserID, "reason": "no"})
		if m := membershipOf(t, srv, alice, roomID, carol.UserID); m != "leave" {
			t.Fatalf("carol after the kick %q", m)
		}
		sync = roomSync(t, srv, carol, url.Values{"since": {carolSince}})
		if section(t, sync, "leave", roomID) == nil || section(t, sync, "knock", roomID) != nil {
			t.Fatalf("carol's sync after the rejection %v", sync["rooms"])
		}
		// A member who may not kick cannot reject (bob has power 0).
		srv.Must(t, "POST", knockPath(roomID), dave.Token, map[string]any{})
		expectError(t, srv, "POST", roomPath(roomID, "/kick"), bob.Token, map[string]any{"user_id": dave.UserID}, 403, "M_FORBIDDEN")

		// Withdrawn: dave leaves.
		srv.Must(t, "POST", roomPath(roomID, "/leave"), dave.Token, map[string]any{})
		if m := membershipOf(t, srv, alice, roomID, dave.UserID); m != "leave" {
			t.Fatalf("dave after withdrawing %q", m)
		}
		// A knock does not let the knocker in.
		expectError(t, srv, "PUT", roomPath(roomID, "/send/m.room.message/t1"), dave.Token, map[string]any{"body": "hi"}, 403, "M_FORBIDDEN")
	})
}

// Restricted rooms: a user joined to an allowed room joins, the join
// naming a local user with the power to invite; anyone else is refused.
func TestRestrictedJoinLocal(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		space := createRoom(t, srv, alice, map[string]any{"preset": "public_chat"})
		srv.Must(t, "POST", v3+"/join/"+url.PathEscape(space), bob.Token, map[string]any{})
		allow := []any{map[string]any{"type": "m.room_membership", "room_id": space}}
		restricted := func(rule string, extra map[string]any) string {
			body := map[string]any{"preset": "private_chat",
				"initial_state": []any{map[string]any{"type": "m.room.join_rules", "content": map[string]any{"join_rule": rule, "allow": allow}}}}
			for k, v := range extra {
				body[k] = v
			}
			return createRoom(t, srv, alice, body)
		}
		room := restricted("restricted", nil)

		expectError(t, srv, "POST", v3+"/join/"+url.PathEscape(room), carol.Token, map[string]any{}, 403, "M_FORBIDDEN")
		if m := membershipOf(t, srv, alice, room, carol.UserID); m != "" {
			t.Fatalf("carol after the refusal %q", m)
		}
		// A client's own authorising user is not taken.
		srv.Must(t, "POST", v3+"/join/"+url.PathEscape(room), bob.Token, map[string]any{"join_authorised_via_users_server": carol.UserID})
		member := srv.Must(t, "GET", roomPath(room, "/state/m.room.member/"+url.PathEscape(bob.UserID)), bob.Token, nil)
		if member["membership"] != "join" || member["join_authorised_via_users_server"] != alice.UserID {
			t.Fatalf("bob's join %v", member)
		}

		// knock_restricted: the allowed join, or a knock for the others.
		kr := restricted("knock_restricted", nil)
		srv.Must(t, "POST", v3+"/join/"+url.PathEscape(kr), bob.Token, map[string]any{})
		expectError(t, srv, "POST", v3+"/join/"+url.PathEscape(kr), carol.Token, map[string]any{}, 403, "M_FORBIDDEN")
		srv.Must(t, "POST", knockPath(kr), carol.Token, map[string]any{})
		if m := membershipOf(t, srv, alice, kr, carol.UserID); m != "knock" {
			t.Fatalf("carol's knock %q", m)
		}
		// An invited user needs no authorising user.
		srv.Must(t, "POST", roomPath(kr, "/invite"), alice.Token, map[string]any{"user_id": carol.UserID})
		srv.Must(t, "POST", v3+"/join/"+url.PathEscape(kr), carol.Token, map[string]any{})
		member = srv.Must(t, "GET", roomPath(kr, "/state/m.room.member/"+url.PathEscape(carol.UserID)), carol.Token, nil)
		if member["membership"] != "join" || member["join_authorised_via_users_server"] != nil {
			t.Fatalf("carol's join after the invite %v", member)
		}

		// Nobody here may invite: the join cannot be granted.
		closed := restricted("restricted", map[string]any{"power_level_content_override": map[string]any{"invite": 101}})
		expectError(t, srv, "POST", v3+"/join/"+url.PathEscape(closed), bob.Token, map[string]any{}, 400, "M_UNABLE_TO_GRANT_JOIN")
		// An allowed room this server is not in: it cannot tell, so no.
		allow = []any{map[string]any{"type": "m.room_membership", "room_id": "!elsewhere:other.example"}}
		unknown := restricted("restricted", nil)
		expectError(t, srv, "POST", v3+"/join/"+url.PathEscape(unknown), bob.Token, map[string]any{}, 403, "M_FORBIDDEN")
		// A room version without restricted rooms: the rule is as invite.
		allow = []any{map[string]any{"type": "m.room_membership", "room_id": space}}
		v7 := restricted("restricted", map[string]any{"room_version": "7"})
		expectError(t, srv, "POST", v3+"/join/"+url.PathEscape(v7), bob.Token, map[string]any{}, 403, "M_FORBIDDEN")
	})
}
