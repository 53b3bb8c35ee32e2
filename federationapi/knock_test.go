package federationapi_test

import (
	"encoding/json"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/testutil"
)

func knockOn(roomID string) string { return "/_matrix/client/v3/knock/" + url.PathEscape(roomID) }

func joinPath(roomID string) string { return "/_matrix/client/v3/join/" + url.PathEscape(roomID) }

// syncSection is rooms.{kind}.{roomID} of a /sync answer, or nil.
func syncSection(r map[string]any, kind, roomID string) map[string]any {
	rooms, _ := r["rooms"].(map[string]any)
	k, _ := rooms[kind].(map[string]any)
	room, _ := k[roomID].(map[string]any)
	return room
}

// memberOn is a user's membership in a room as n's member of it sees it.
func memberOn(t *testing.T, n *testutil.Node, viewer *testutil.User, roomID, userID string) map[string]any {
	t.Helper()
	r := n.Do(t, "GET", rpath(roomID, "/state/m.room.member/"+url.PathEscape(userID)), viewer.Token, nil)
	if r.Status != 200 {
		return nil
	}
	return r.Body
}

// A user of B knocks on a room of A: B's /sync shows the room under
// rooms.knock with the stripped state A answered with, A's member sees
// the knock and invites, and the knocker joins. A second knock is
// rejected by a kick, which reaches the knocker's server; a third is
// withdrawn by its knocker leaving through A (B is in the room for
// neither).
func TestRemoteKnock(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		for _, version := range []string{"11", "12"} {
			t.Run("v"+version, func(t *testing.T) { testRemoteKnock(t, db, version) })
		}
	})
}

func testRemoteKnock(t *testing.T, db testutil.Database, version string) {
	{
		p := newRoomPair(t, db)
		carol := p.b.Register(t, "carol", "CAROL1")
		dave := p.b.Register(t, "dave", "DAVE1")
		// A version 12 room ID names no server: the first request for
		// it says which server to ask.
		via := ""
		if version == "12" {
			via = "?server_name=" + url.QueryEscape(p.a.ServerName)
		}
		roomID := p.a.Must(t, "POST", "/_matrix/client/v3/createRoom", p.alice.Token, map[string]any{
			"preset": "private_chat", "name": "ring the bell", "room_version": version,
			"initial_state": []any{map[string]any{"type": "m.room.join_rules", "content": map[string]any{"join_rule": "knock"}}},
		})["room_id"].(string)
		public := p.a.Must(t, "POST", "/_matrix/client/v3/createRoom", p.alice.Token, map[string]any{"preset": "public_chat", "room_version": version})["room_id"].(string)
		aliceSince := syncToken(t, p.a, p.alice)

		// A room whose join rule is not knock refuses, and B keeps nothing.
		if r := p.b.Do(t, "POST", knockOn(public)+"?server_name="+url.QueryEscape(p.a.ServerName), p.bob.Token, map[string]any{}); r.Status != 403 || r.Errcode() != "M_FORBIDDEN" {
			t.Fatalf("knock on a public room: %d %s", r.Status, r.Raw)
		}
		if r := p.b.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0", p.bob.Token, nil); syncSection(r, "knock", public) != nil {
			t.Fatalf("a refused knock in bob's sync: %v", r["rooms"])
		}

		r := p.b.Must(t, "POST", knockOn(roomID)+"?server_name="+url.QueryEscape(p.a.ServerName), p.bob.Token, map[string]any{"reason": "hello"})
		if r["room_id"] != roomID {
			t.Fatalf("knock answer %v", r)
		}
		sync := p.b.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0", p.bob.Token, nil)
		k := syncSection(sync, "knock", roomID)
		if k == nil {
			t.Fatalf("bob's sync has no knock: %v", sync["rooms"])
		}
		var types []string
		for _, e := range asList(k["knock_state"].(map[string]any)["events"]) {
			ev := e.(map[string]any)
			c := ev["content"].(map[string]any)
			s := ev["type"].(string)
			if m, ok := c["membership"].(string); ok {
				s += "|" + m
			}
			if jr, ok := c["join_rule"].(string); ok {
				s += "|" + jr
			}
			types = append(types, s)
		}
		slices.Sort(types)
		if !slices.Equal(types, []string{"m.room.create", "m.room.join_rules|knock", "m.room.member|knock", "m.room.name"}) {
			t.Fatalf("knock_state %v", types)
		}
		bobSince := sync["next_batch"].(string)

		// alice sees the knock, with its reason, in the timeline.
		if m := memberOn(t, p.a, p.alice, roomID, p.bob.UserID); m["membership"] != "knock" || m["reason"] != "hello" {
			t.Fatalf("bob's member event on A %v", m)
		}
		sync = p.a.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0&since="+url.QueryEscape(aliceSince), p.alice.Token, nil)
		seen := false
		for _, e := range asList(syncSection(sync, "join", roomID)["timeline"].(map[string]any)["events"]) {
			ev := e.(map[string]any)
			if ev["type"] == "m.room.member" && ev["state_key"] == p.bob.UserID && ev["content"].(map[string]any)["membership"] == "knock" {
				seen = true
			}
		}
		if !seen {
			t.Fatalf("alice's timeline has no knock: %v", syncSection(sync, "join", roomID))
		}

		// carol's knock is rejected: the kick reaches B, carol sees a leave.
		p.b.Must(t, "POST", knockOn(roomID)+via, carol.Token, map[string]any{})
		carolSince := syncToken(t, p.b, carol)
		p.a.Must(t, "POST", rpath(roomID, "/kick"), p.alice.Token, map[string]any{"user_id": carol.UserID, "reason": "not now"})
		eventually(t, "carol to see the rejection", func() bool {
			r := p.b.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0&since="+url.QueryEscape(carolSince), carol.Token, nil)
			return syncSection(r, "leave", roomID) != nil && syncSection(r, "knock", roomID) == nil
		})
		if r := p.b.Do(t, "POST", rpath(roomID, "/leave"), carol.Token, map[string]any{}); r.Status != 403 {
			t.Fatalf("carol leaving after the rejection: %d %s", r.Status, r.Raw)
		}

		// dave withdraws his knock: A sees him leave.
		p.b.Must(t, "POST", knockOn(roomID)+via, dave.Token, map[string]any{})
		eventually(t, "A to see dave's knock", func() bool {
			return memberOn(t, p.a, p.alice, roomID, dave.UserID)["membership"] == "knock"
		})
		p.b.Must(t, "POST", rpath(roomID, "/leave"), dave.Token, map[string]any{})
		if m := memberOn(t, p.a, p.alice, roomID, dave.UserID); m["membership"] != "leave" {
			t.Fatalf("dave on A after withdrawing %v", m)
		}
		// alice accepts: an invite, then bob joins.
		p.a.Must(t, "POST", rpath(roomID, "/invite"), p.alice.Token, map[string]any{"user_id": p.bob.UserID})
		sync = p.b.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0&since="+url.QueryEscape(bobSince), p.bob.Token, nil)
		if syncSection(sync, "invite", roomID) == nil {
			t.Fatalf("bob's sync after the invite %v", sync["rooms"])
		}
		p.b.Must(t, "POST", joinPath(roomID), p.bob.Token, map[string]any{})
		if got := joinedMembers(t, p.b, p.bob, roomID); !equalStrings(got, p.alice.UserID, p.bob.UserID) {
			t.Fatalf("B's joined members %v", got)
		}
		eventually(t, "A to see bob joined", func() bool {
			return equalStrings(joinedMembers(t, p.a, p.alice, roomID), p.alice.UserID, p.bob.UserID)
		})
	}
}

// A restricted room on A: bob of B, in the allowed room, joins through
// A, which names its user alice in join_authorised_via_users_server and
// signs the join; carol of B, in no allowed room, is refused. Rooms A
// cannot decide for answer as the spec says.
func TestRemoteRestrictedJoin(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		for _, version := range []string{"11", "12"} {
			t.Run("v"+version, func(t *testing.T) { testRemoteRestrictedJoin(t, db, version) })
		}
	})
}

func testRemoteRestrictedJoin(t *testing.T, db testutil.Database, version string) {
	{
		p := newRoomPair(t, db)
		carol := p.b.Register(t, "carol", "CAROL1")
		// A version 12 room ID names no server: the first request for
		// it says which server to ask.
		via := ""
		if version == "12" {
			via = "?server_name=" + url.QueryEscape(p.a.ServerName)
		}
		create := func(body map[string]any) string {
			body["room_version"] = version
			return p.a.Must(t, "POST", "/_matrix/client/v3/createRoom", p.alice.Token, body)["room_id"].(string)
		}
		space := create(map[string]any{"preset": "public_chat"})
		p.b.Must(t, "POST", joinPath(space)+via, p.bob.Token, map[string]any{})
		restricted := func(rule string, allowed string, extra map[string]any) string {
			body := map[string]any{"preset": "private_chat", "initial_state": []any{map[string]any{"type": "m.room.join_rules",
				"content": map[string]any{"join_rule": rule, "allow": []any{map[string]any{"type": "m.room_membership", "room_id": allowed}}}}}}
			for k, v := range extra {
				body[k] = v
			}
			return create(body)
		}
		room := restricted("restricted", space, nil)

		if r := p.b.Do(t, "POST", joinPath(room)+via, carol.Token, map[string]any{}); r.Status != 403 || r.Errcode() != "M_FORBIDDEN" {
			t.Fatalf("carol's join: %d %s", r.Status, r.Raw)
		}
		p.b.Must(t, "POST", joinPath(room)+via, p.bob.Token, map[string]any{})
		m := memberOn(t, p.a, p.alice, room, p.bob.UserID)
		if m["membership"] != "join" || m["join_authorised_via_users_server"] != p.alice.UserID {
			t.Fatalf("bob's join on A %v", m)
		}
		if got := joinedMembers(t, p.b, p.bob, room); !equalStrings(got, p.alice.UserID, p.bob.UserID) {
			t.Fatalf("B's joined members %v", got)
		}
		// bob talks in the room and alice reads it: B holds the room.
		p.b.Must(t, "PUT", rpath(room, "/send/m.room.message/k1"), p.bob.Token, map[string]any{"msgtype": "m.text", "body": "in"})

		// knock_restricted: the same join for bob.
		kr := restricted("knock_restricted", space, nil)
		p.b.Must(t, "POST", joinPath(kr)+via, p.bob.Token, map[string]any{})
		if r := p.b.Do(t, "POST", joinPath(kr)+via, carol.Token, map[string]any{}); r.Status != 403 {
			t.Fatalf("carol's join of a knock_restricted room: %d %s", r.Status, r.Raw)
		}

		// No user of A may invite: A cannot grant the join. In version
		// 12 the creator, above every level, always may.
		closed := restricted("restricted", space, map[string]any{"power_level_content_override": map[string]any{"invite": 101}})
		if version == "12" {
			p.b.Must(t, "POST", joinPath(closed)+via, p.bob.Token, map[string]any{})
			if m := memberOn(t, p.a, p.alice, closed, p.bob.UserID); m["join_authorised_via_users_server"] != p.alice.UserID {
				t.Fatalf("bob's join authorised by the creator %v", m)
			}
		} else if r := p.b.Do(t, "POST", joinPath(closed)+via, p.bob.Token, map[string]any{}); r.Status != 400 || r.Errcode() != "M_UNABLE_TO_GRANT_JOIN" {
			t.Fatalf("a join nobody may grant: %d %s", r.Status, r.Raw)
		}
		// An allowed room A is not in: A cannot tell.
		elsewhere := restricted("restricted", "!elsewhere:other.example", nil)
		if r := p.b.Do(t, "POST", joinPath(elsewhere)+via, p.bob.Token, map[string]any{}); r.Status != 400 || r.Errcode() != "M_UNABLE_TO_AUTHORISE_JOIN" {
			t.Fatalf("a join A cannot check: %d %s", r.Status, r.Raw)
		}
	}
}

// make_knock and send_knock as another server sends them (a server made
// from gomatrixserverlib): the template, the knock signed by that server
// answered with the room's stripped state, and each refusal the spec
// gives.
func TestKnockHandshakeServed(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, nil)
		alice := n.Register(t, "alice", "")
		o := testutil.NewOrigin(t)
		eve := "@eve:" + o.Name
		create := func(body map[string]any) string {
			return n.Must(t, "POST", "/_matrix/client/v3/createRoom", alice.Token, body)["room_id"].(string)
		}
		knockRule := []any{map[string]any{"type": "m.room.join_rules", "content": map[string]any{"join_rule": "knock"}}}
		roomID := create(map[string]any{"preset": "private_chat", "name": "knock", "initial_state": knockRule})
		public := create(map[string]any{"preset": "public_chat"})
		v6 := create(map[string]any{"preset": "private_chat", "room_version": "6", "initial_state": knockRule})
		makeKnock := func(roomID, userID, query string) testutil.Response {
			path := "/_matrix/federation/v1/make_knock/" + url.PathEscape(roomID) + "/" + url.PathEscape(userID) + query
			return testutil.SendTo(t, n, o.SignedRequest(t, "GET", n.ServerName, path, nil, "", nil))
		}
		sendKnock := func(roomID, eventID string, body any) testutil.Response {
			path := "/_matrix/federation/v1/send_knock/" + url.PathEscape(roomID) + "/" + url.PathEscape(eventID)
			return testutil.SendTo(t, n, o.SignedRequest(t, "PUT", n.ServerName, path, body, "", nil))
		}

		for _, c := range []struct {
			what, room, user, query string
			status                  int
			code                    string
		}{
			{"no ver", roomID, eve, "", 400, "M_INCOMPATIBLE_ROOM_VERSION"},
			{"other versions", roomID, eve, "?ver=9&ver=10", 400, "M_INCOMPATIBLE_ROOM_VERSION"},
			{"a user of another server", roomID, "@eve:elsewhere.example", "?ver=11", 403, "M_FORBIDDEN"},
			{"a public room", public, eve, "?ver=11", 403, "M_FORBIDDEN"},
			{"a version without knocking", v6, eve, "?ver=6", 403, "M_FORBIDDEN"},
			{"an unknown room", "!nowhere:" + n.ServerName, eve, "?ver=11", 404, "M_NOT_FOUND"},
		} {
			if r := makeKnock(c.room, c.user, c.query); r.Status != c.status || r.Errcode() != c.code {
				t.Fatalf("make_knock, %s: %d %s", c.what, r.Status, r.Raw)
			} else if c.code == "M_INCOMPATIBLE_ROOM_VERSION" && r.Body["room_version"] != "11" {
				t.Fatalf("make_knock, %s: no room_version in %s", c.what, r.Raw)
			}
		}

		r := makeKnock(roomID, eve, "?ver=1&ver=11")
		if r.Status != 200 || r.Body["room_version"] != "11" {
			t.Fatalf("make_knock: %d %s", r.Status, r.Raw)
		}
		var tmpl struct {
			Event gomatrixserverlib.ProtoEvent `json:"event"`
		}
		if err := json.Unmarshal(r.Raw, &tmpl); err != nil {
			t.Fatal(err)
		}
		if tmpl.Event.Type != "m.room.member" || tmpl.Event.SenderID != eve || tmpl.Event.StateKey == nil || *tmpl.Event.StateKey != eve ||
			string(tmpl.Event.Content) != `{"membership":"knock"}` || tmpl.Event.AuthEvents == nil {
			t.Fatalf("template %s", r.Raw)
		}
		build := func(membership string) gomatrixserverlib.PDU {
			proto := tmpl.Event
			if err := proto.SetContent(map[string]any{"membership": membership, "reason": "knock knock"}); err != nil {
				t.Fatal(err)
			}
			ev, err := gomatrixserverlib.MustGetRoomVersion("11").NewEventBuilderFromProtoEvent(&proto).
				Build(time.Now(), spec.ServerName(o.Name), o.KeyID, o.Key)
			if err != nil {
				t.Fatal(err)
			}
			return ev
		}
		knock := build("knock")

		// Refused knocks change nothing.
		join := build("join")
		if r := sendKnock(roomID, join.EventID(), json.RawMessage(join.JSON())); r.Status != 400 || r.Errcode() != "M_INVALID_PARAM" {
			t.Fatalf("send_knock of a join: %d %s", r.Status, r.Raw)
		}
		if r := sendKnock(roomID, "$other", json.RawMessage(knock.JSON())); r.Status != 400 || r.Errcode() != "M_INVALID_PARAM" {
			t.Fatalf("send_knock at another event ID: %d %s", r.Status, r.Raw)
		}
		var unsigned map[string]any
		_ = json.Unmarshal(knock.JSON(), &unsigned)
		unsigned["signatures"] = map[string]any{}
		if r := sendKnock(roomID, knock.EventID(), unsigned); r.Status != 403 || r.Errcode() != "M_FORBIDDEN" {
			t.Fatalf("send_knock of an unsigned knock: %d %s", r.Status, r.Raw)
		}
		if r := sendKnock(roomID, knock.EventID(), map[string]any{"type": "m.room.member"}); r.Status != 400 {
			t.Fatalf("send_knock of a stub: %d %s", r.Status, r.Raw)
		}
		if m := memberOn(t, n, alice, roomID, eve); m != nil {
			t.Fatalf("eve after refused knocks %v", m)
		}

		r = sendKnock(roomID, knock.EventID(), json.RawMessage(knock.JSON()))
		if r.Status != 200 {
			t.Fatalf("send_knock: %d %s", r.Status, r.Raw)
		}
		var types []string
		for _, e := range asList(r.Body["knock_room_state"]) {
			ev := e.(map[string]any)
			if ev["event_id"] != nil || ev["sender"] == nil {
				t.Fatalf("not stripped state: %v", ev)
			}
			types = append(types, ev["type"].(string))
		}
		slices.Sort(types)
		if !slices.Equal(types, []string{"m.room.create", "m.room.join_rules", "m.room.name"}) {
			t.Fatalf("knock_room_state %v", types)
		}
		if m := memberOn(t, n, alice, roomID, eve); m["membership"] != "knock" || m["reason"] != "knock knock" {
			t.Fatalf("eve's knock on the daemon %v", m)
		}
	})
}

// A join sent to send_join naming one of the daemon's users as its
// authorising user, from a user in none of the allowed rooms (its server
// built it without make_join): refused, and the user stays out.
func TestRestrictedSendJoinChecked(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, nil)
		alice := n.Register(t, "alice", "")
		o := testutil.NewOrigin(t)
		eve := "@eve:" + o.Name
		space := n.Must(t, "POST", "/_matrix/client/v3/createRoom", alice.Token, map[string]any{"preset": "public_chat"})["room_id"].(string)
		roomID := n.Must(t, "POST", "/_matrix/client/v3/createRoom", alice.Token, map[string]any{"preset": "private_chat",
			"initial_state": []any{map[string]any{"type": "m.room.join_rules", "content": map[string]any{"join_rule": "knock_restricted",
				"allow": []any{map[string]any{"type": "m.room_membership", "room_id": space}}}}}})["room_id"].(string)

		// make_join refuses eve.
		path := "/_matrix/federation/v1/make_join/" + url.PathEscape(roomID) + "/" + url.PathEscape(eve) + "?ver=11"
		if r := testutil.SendTo(t, n, o.SignedRequest(t, "GET", n.ServerName, path, nil, "", nil)); r.Status != 403 || r.Errcode() != "M_FORBIDDEN" {
			t.Fatalf("make_join for eve: %d %s", r.Status, r.Raw)
		}
		// eve's server builds the join from a knock template instead.
		path = "/_matrix/federation/v1/make_knock/" + url.PathEscape(roomID) + "/" + url.PathEscape(eve) + "?ver=11"
		r := testutil.SendTo(t, n, o.SignedRequest(t, "GET", n.ServerName, path, nil, "", nil))
		if r.Status != 200 {
			t.Fatalf("make_knock: %d %s", r.Status, r.Raw)
		}
		var tmpl struct {
			Event gomatrixserverlib.ProtoEvent `json:"event"`
		}
		if err := json.Unmarshal(r.Raw, &tmpl); err != nil {
			t.Fatal(err)
		}
		var aliceMember string
		for _, e := range asList(n.Must(t, "GET", rpath(roomID, "/members"), alice.Token, nil)["chunk"]) {
			if ev := e.(map[string]any); ev["state_key"] == alice.UserID {
				aliceMember = ev["event_id"].(string)
			}
		}
		var auth []string
		raw, _ := json.Marshal(tmpl.Event.AuthEvents)
		_ = json.Unmarshal(raw, &auth)
		proto := tmpl.Event
		proto.AuthEvents = append(auth, aliceMember)
		if err := proto.SetContent(map[string]any{"membership": "join", "join_authorised_via_users_server": alice.UserID}); err != nil {
			t.Fatal(err)
		}
		join, err := gomatrixserverlib.MustGetRoomVersion("11").NewEventBuilderFromProtoEvent(&proto).Build(time.Now(), spec.ServerName(o.Name), o.KeyID, o.Key)
		if err != nil {
			t.Fatal(err)
		}
		path = "/_matrix/federation/v2/send_join/" + url.PathEscape(roomID) + "/" + url.PathEscape(join.EventID())
		if r := testutil.SendTo(t, n, o.SignedRequest(t, "PUT", n.ServerName, path, json.RawMessage(join.JSON()), "", nil)); r.Status != 403 || r.Errcode() != "M_FORBIDDEN" {
			t.Fatalf("send_join of a forged authorised join: %d %s", r.Status, r.Raw)
		}
		if m := memberOn(t, n, alice, roomID, eve); m != nil {
			t.Fatalf("eve after the refused join %v", m)
		}
	})
}
