package roomserver_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

const (
	local = "local.test"
	alice = "@alice:local.test"
	bob   = "@bob:local.test"
	carl  = "@carl:local.test"
)

// localRooms is a room server of local.test on a fresh store, with no
// federation.
func localRooms(t *testing.T, db testdb.Database) (*roomserver.Service, *sqlstore.Store) {
	t.Helper()
	store, err := sqlstore.Open(context.Background(), db.URI, local)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	log := logrus.New()
	log.SetOutput(io.Discard)
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	return roomserver.New(store, roomserver.Options{ServerName: local, KeyID: "ed25519:k", PrivateKey: key, Logger: log}), store
}

// forEachDatabase runs f with a room server of local.test on each kind
// of database.
func forEachDatabase(t *testing.T, f func(t *testing.T, rooms *roomserver.Service)) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		rooms, _ := localRooms(t, db)
		f(t, rooms)
	})
}

func wantStatus(t *testing.T, err error, status int) {
	t.Helper()
	var me *mxerr.Error
	if !errors.As(err, &me) || me.Status != status {
		t.Fatalf("got %v, want status %d", err, status)
	}
}

func wantErr(t *testing.T, err error, status int, code string) {
	t.Helper()
	var me *mxerr.Error
	if !errors.As(err, &me) || me.Status != status || me.Code != code {
		t.Fatalf("got %v, want %d %s", err, status, code)
	}
}

func createRoom(t *testing.T, rooms *roomserver.Service, creator string, req roomserver.CreateRoomRequest) string {
	t.Helper()
	id, err := rooms.CreateRoom(context.Background(), creator, req)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func mustJoin(t *testing.T, rooms *roomserver.Service, userID, roomID string) {
	t.Helper()
	if _, err := rooms.Join(context.Background(), userID, roomID, nil, nil); err != nil {
		t.Fatalf("%s joining %s: %v", userID, roomID, err)
	}
}

func send(t *testing.T, rooms *roomserver.Service, sender, roomID, body string) string {
	t.Helper()
	id, err := rooms.Send(context.Background(), sender, "DEV", roomID, "m.room.message", body,
		json.RawMessage(`{"msgtype":"m.text","body":"`+body+`"}`))
	if err != nil {
		t.Fatalf("%s sending %q: %v", sender, body, err)
	}
	return id
}

func setState(t *testing.T, rooms *roomserver.Service, sender, roomID, evType, content string) string {
	t.Helper()
	id, err := rooms.SendState(context.Background(), sender, roomID, evType, "", json.RawMessage(content))
	if err != nil {
		t.Fatalf("%s setting %s: %v", sender, evType, err)
	}
	return id
}

// content reads one member of a state event's content (format=event).
func stateContent(t *testing.T, rooms *roomserver.Service, userID, roomID, evType, stateKey string) map[string]any {
	t.Helper()
	ev, err := rooms.StateEvent(context.Background(), userID, roomID, evType, stateKey)
	if err != nil {
		t.Fatalf("state %s/%s of %s: %v", evType, stateKey, roomID, err)
	}
	var c map[string]any
	if err := json.Unmarshal(ev.Content, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

func membership(t *testing.T, rooms *roomserver.Service, viewer, roomID, userID string) string {
	t.Helper()
	m, _ := stateContent(t, rooms, viewer, roomID, "m.room.member", userID)["membership"].(string)
	return m
}

// A new room's state is what its request and preset say, in the order
// the spec gives; its creator alone is joined, with power 100.
func TestCreateRoomState(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		rooms, _ := localRooms(t, db)
		name, topic := "Room", "About it"
		id := createRoom(t, rooms, alice, roomserver.CreateRoomRequest{
			Name: &name, Topic: &topic, RoomAliasName: "room", Invite: []string{bob},
			InitialState: []roomserver.StateEvent{
				{Type: "m.room.name", Content: json.RawMessage(`{"name":"loses to name"}`)},
				{Type: "m.room.history_visibility", Content: json.RawMessage(`{"history_visibility":"joined"}`)},
				{Type: "org.example.custom", StateKey: "k", Content: json.RawMessage(`{"x":1}`)},
			},
		})
		state, err := rooms.State(ctx, alice, id)
		if err != nil {
			t.Fatal(err)
		}
		var order []string
		byKey := map[string]map[string]any{}
		for _, ev := range state {
			k := ev.Type + "|" + *ev.StateKey
			order = append(order, k)
			var c map[string]any
			_ = json.Unmarshal(ev.Content, &c)
			byKey[k] = c
		}
		want := []string{"m.room.create|", "m.room.member|" + alice, "m.room.power_levels|", "m.room.canonical_alias|",
			"m.room.join_rules|", "m.room.history_visibility|", "m.room.guest_access|", "org.example.custom|k",
			"m.room.name|", "m.room.topic|", "m.room.member|" + bob}
		if len(order) != len(want) {
			t.Fatalf("state %q, want %q", order, want)
		}
		for _, k := range want {
			if byKey[k] == nil {
				t.Fatalf("no %s in %q", k, order)
			}
		}
		checks := map[string]any{
			"m.room.create|room_version": string(roomserver.DefaultRoomVersion),
			// Version 11 and later name the creator by the event's sender only.
			"m.room.create|creator":                        nil,
			"m.room.join_rules|join_rule":                  "invite", // private_chat, the default
			"m.room.history_visibility|history_visibility": "joined",
			"m.room.guest_access|guest_access":             "can_join",
			"m.room.name|name":                             "Room",
			"m.room.topic|topic":                           "About it",
			"m.room.canonical_alias|alias":                 "#room:local.test",
		}
		for k, v := range checks {
			evType, field, _ := strings.Cut(k, "|")
			if got := byKey[evType+"|"][field]; got != v {
				t.Errorf("%s.%s = %v, want %v", evType, field, got, v)
			}
		}
		if byKey["m.room.member|"+bob]["membership"] != "invite" || byKey["m.room.member|"+alice]["membership"] != "join" {
			t.Fatalf("members %v %v", byKey["m.room.member|"+alice], byKey["m.room.member|"+bob])
		}
		if users := byKey["m.room.power_levels|"]["users"].(map[string]any); users[alice] != float64(100) || len(users) != 1 {
			t.Fatalf("power levels users %v", users)
		}
		if got, err := rooms.JoinedRooms(ctx, alice); err != nil || !slices.Equal(got, []string{id}) {
			t.Fatalf("alice's rooms %v %v", got, err)
		}
		if got, _ := rooms.JoinedRooms(ctx, bob); len(got) != 0 {
			t.Fatalf("invited bob is joined to %v", got)
		}
		if res, err := rooms.ResolveAlias(ctx, "#room:local.test"); err != nil || res.RoomID != id {
			t.Fatalf("alias resolves to %+v %v", res, err)
		}

		// public_chat: anyone may join; trusted_private_chat: the invited
		// have the creator's power; a version 11 create has no creator.
		pub := createRoom(t, rooms, alice, roomserver.CreateRoomRequest{Visibility: "public", RoomVersion: "11"})
		if c := stateContent(t, rooms, alice, pub, "m.room.join_rules", ""); c["join_rule"] != "public" {
			t.Fatalf("public room join rule %v", c)
		}
		if c := stateContent(t, rooms, alice, pub, "m.room.create", ""); c["room_version"] != "11" || c["creator"] != nil {
			t.Fatalf("v11 create %v", c)
		}
		trusted := createRoom(t, rooms, alice, roomserver.CreateRoomRequest{Preset: "trusted_private_chat", Invite: []string{bob}, IsDirect: true})
		if users := stateContent(t, rooms, alice, trusted, "m.room.power_levels", "")["users"].(map[string]any); users[bob] != float64(100) {
			t.Fatalf("trusted_private_chat users %v", users)
		}
		if c := stateContent(t, rooms, alice, trusted, "m.room.member", bob); c["is_direct"] != true {
			t.Fatalf("direct invite %v", c)
		}
	})
}

// Requests that cannot make a room make none.
func TestCreateRoomRefusals(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		rooms, _ := localRooms(t, db)
		createRoom(t, rooms, alice, roomserver.CreateRoomRequest{RoomAliasName: "taken"})
		for name, c := range map[string]struct {
			req    roomserver.CreateRoomRequest
			status int
			code   string
		}{
			"unknown version":   {roomserver.CreateRoomRequest{RoomVersion: "999"}, 400, "M_UNSUPPORTED_ROOM_VERSION"},
			"unknown preset":    {roomserver.CreateRoomRequest{Preset: "party"}, 400, "M_BAD_JSON"},
			"bad visibility":    {roomserver.CreateRoomRequest{Visibility: "secret"}, 400, "M_BAD_JSON"},
			"bad invitee":       {roomserver.CreateRoomRequest{Invite: []string{"bob"}}, 400, "M_BAD_JSON"},
			"state not object":  {roomserver.CreateRoomRequest{InitialState: []roomserver.StateEvent{{Type: "x", Content: json.RawMessage(`[]`)}}}, 400, "M_BAD_JSON"},
			"alias with server": {roomserver.CreateRoomRequest{RoomAliasName: "a:b"}, 400, "M_INVALID_PARAM"},
			"alias taken":       {roomserver.CreateRoomRequest{RoomAliasName: "taken"}, 400, "M_ROOM_IN_USE"},
			"state not allowed": {roomserver.CreateRoomRequest{PowerLevelContentOverride: map[string]json.RawMessage{"state_default": json.RawMessage(`101`)}}, 400, "M_INVALID_ROOM_STATE"},
		} {
			_, err := rooms.CreateRoom(ctx, bob, c.req)
			var me *mxerr.Error
			if !errors.As(err, &me) || me.Status != c.status || me.Code != c.code {
				t.Errorf("%s: %v, want %d %s", name, err, c.status, c.code)
			}
		}
		if got, _ := rooms.JoinedRooms(ctx, bob); len(got) != 0 {
			t.Fatalf("refused requests made rooms %v", got)
		}
	})
}

// The auth rules decide who may join, invite, kick, ban and unban whom;
// a refusal is 403 and changes no membership.
func TestMembershipRules(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		rooms, _ := localRooms(t, db)
		priv := createRoom(t, rooms, alice, roomserver.CreateRoomRequest{Preset: "private_chat"})

		// Invite only: bob needs an invite.
		_, err := rooms.Join(ctx, bob, priv, nil, nil)
		wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN")
		// One not in the room cannot invite.
		wantErr(t, rooms.Invite(ctx, carl, priv, bob, ""), http.StatusForbidden, "M_FORBIDDEN")
		if err := rooms.Invite(ctx, alice, priv, bob, "come"); err != nil {
			t.Fatal(err)
		}
		inviteID, _ := rooms.StateEvent(ctx, alice, priv, "m.room.member", bob)
		if err := rooms.Invite(ctx, alice, priv, bob, ""); err != nil {
			t.Fatalf("inviting again: %v", err)
		}
		if again, _ := rooms.StateEvent(ctx, alice, priv, "m.room.member", bob); again.EventID != inviteID.EventID {
			t.Fatal("inviting again made another event")
		}
		mustJoin(t, rooms, bob, priv)
		joinEv, _ := rooms.StateEvent(ctx, alice, priv, "m.room.member", bob)
		mustJoin(t, rooms, bob, priv) // joining again changes nothing
		if again, _ := rooms.StateEvent(ctx, alice, priv, "m.room.member", bob); again.EventID != joinEv.EventID {
			t.Fatal("joining again made another event")
		}

		// Bob has power 0: he may invite (invite level 0) but not kick or ban.
		wantErr(t, rooms.Kick(ctx, bob, priv, alice, ""), http.StatusForbidden, "M_FORBIDDEN")
		wantErr(t, rooms.Ban(ctx, bob, priv, alice, ""), http.StatusForbidden, "M_FORBIDDEN")
		if err := rooms.Invite(ctx, bob, priv, carl, ""); err != nil {
			t.Fatalf("bob inviting carl: %v", err)
		}
		// A kick of an invite revokes it.
		if err := rooms.Kick(ctx, alice, priv, carl, "no"); err != nil {
			t.Fatal(err)
		}
		if m := membership(t, rooms, alice, priv, carl); m != "leave" {
			t.Fatalf("carl after the kick: %s", m)
		}
		_, err = rooms.Join(ctx, carl, priv, nil, nil)
		wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN")
		wantErr(t, rooms.Kick(ctx, alice, priv, carl, ""), http.StatusForbidden, "M_FORBIDDEN") // not in the room
		wantErr(t, rooms.Kick(ctx, alice, priv, "carl", ""), http.StatusBadRequest, "M_BAD_JSON")

		// Alice kicks bob, who must be invited again.
		if err := rooms.Kick(ctx, alice, priv, bob, ""); err != nil {
			t.Fatal(err)
		}
		_, err = rooms.Join(ctx, bob, priv, nil, nil)
		wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN")

		// A public room: a ban keeps bob out until lifted.
		pub := createRoom(t, rooms, alice, roomserver.CreateRoomRequest{Preset: "public_chat"})
		mustJoin(t, rooms, bob, pub)
		wantErr(t, rooms.Unban(ctx, alice, pub, bob, ""), http.StatusForbidden, "M_FORBIDDEN") // not banned
		if err := rooms.Ban(ctx, alice, pub, bob, "spam"); err != nil {
			t.Fatal(err)
		}
		if c := stateContent(t, rooms, alice, pub, "m.room.member", bob); c["membership"] != "ban" || c["reason"] != "spam" {
			t.Fatalf("ban %v", c)
		}
		_, err = rooms.Join(ctx, bob, pub, nil, nil)
		wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN")
		wantErr(t, rooms.Leave(ctx, bob, pub, ""), http.StatusForbidden, "M_FORBIDDEN")
		wantErr(t, rooms.Invite(ctx, alice, pub, bob, ""), http.StatusForbidden, "M_FORBIDDEN")
		if m := membership(t, rooms, alice, pub, bob); m != "ban" {
			t.Fatalf("refusals changed the ban to %s", m)
		}
		if err := rooms.Unban(ctx, alice, pub, bob, ""); err != nil {
			t.Fatal(err)
		}
		mustJoin(t, rooms, bob, pub)

		// A user leaves, and cannot leave twice; unknown rooms are 404.
		if err := rooms.Leave(ctx, bob, pub, "bye"); err != nil {
			t.Fatal(err)
		}
		wantErr(t, rooms.Leave(ctx, bob, pub, ""), http.StatusForbidden, "M_FORBIDDEN")
		wantErr(t, rooms.Leave(ctx, bob, "!nowhere:local.test", ""), http.StatusNotFound, "M_NOT_FOUND")
		_, err = rooms.Join(ctx, bob, "nowhere", nil, nil)
		wantErr(t, err, http.StatusBadRequest, "M_INVALID_PARAM")

		// The creator's power cannot be taken by one with less.
		mustJoin(t, rooms, bob, pub)
		_, err = rooms.SendState(ctx, bob, pub, "m.room.power_levels", "", json.RawMessage(`{"users":{"`+bob+`":100}}`))
		wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN")
		_, err = rooms.SendState(ctx, bob, pub, "m.room.name", "", json.RawMessage(`{"name":"bob's"}`))
		wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN")
		if _, err := rooms.StateEvent(ctx, alice, pub, "m.room.name", ""); err == nil {
			t.Fatal("a refused name is in the state")
		}
	})
}

// Members, joined members and joined rooms follow memberships; one who
// left sees the members as they were when they left.
func TestMembershipQueries(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		rooms, _ := localRooms(t, db)
		r := createRoom(t, rooms, alice, roomserver.CreateRoomRequest{Preset: "public_chat"})
		mustJoin(t, rooms, bob, r)
		if err := rooms.Invite(ctx, alice, r, carl, ""); err != nil {
			t.Fatal(err)
		}
		members := func(req roomserver.MembersRequest) map[string]string {
			t.Helper()
			evs, err := rooms.Members(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			out := map[string]string{}
			for _, ev := range evs {
				var c struct{ Membership string }
				_ = json.Unmarshal(ev.Content, &c)
				out[*ev.StateKey] = c.Membership
			}
			return out
		}
		same := func(a, b map[string]string) bool {
			if len(a) != len(b) {
				return false
			}
			for k, v := range a {
				if b[k] != v {
					return false
				}
			}
			return true
		}
		if got := members(roomserver.MembersRequest{UserID: alice, RoomID: r}); !same(got, map[string]string{alice: "join", bob: "join", carl: "invite"}) {
			t.Fatalf("members %v", got)
		}
		if got := members(roomserver.MembersRequest{UserID: alice, RoomID: r, Membership: "invite"}); !same(got, map[string]string{carl: "invite"}) {
			t.Fatalf("invited %v", got)
		}
		if got := members(roomserver.MembersRequest{UserID: alice, RoomID: r, NotMembership: "join"}); !same(got, map[string]string{carl: "invite"}) {
			t.Fatalf("not joined %v", got)
		}
		_, err := rooms.Members(ctx, roomserver.MembersRequest{UserID: alice, RoomID: r, Membership: "joined"})
		wantErr(t, err, http.StatusBadRequest, "M_INVALID_PARAM")
		jm, err := rooms.JoinedMembers(ctx, bob, r)
		if err != nil || len(jm) != 2 {
			t.Fatalf("joined members %v %v", jm, err)
		}
		if _, ok := jm[carl]; ok {
			t.Fatal("an invited user is a joined member")
		}
		// Carl, only invited, may not read the members.
		_, err = rooms.JoinedMembers(ctx, carl, r)
		wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN")

		// Bob leaves; carl joins after: bob sees the room as he left it.
		if err := rooms.Leave(ctx, bob, r, ""); err != nil {
			t.Fatal(err)
		}
		mustJoin(t, rooms, carl, r)
		if got := members(roomserver.MembersRequest{UserID: bob, RoomID: r}); !same(got, map[string]string{alice: "join", bob: "leave", carl: "invite"}) {
			t.Fatalf("members as bob left them %v", got)
		}
		if got := members(roomserver.MembersRequest{UserID: alice, RoomID: r}); !same(got, map[string]string{alice: "join", bob: "leave", carl: "join"}) {
			t.Fatalf("members now %v", got)
		}
		_, err = rooms.JoinedMembers(ctx, bob, r)
		wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN")
		if got, _ := rooms.JoinedRooms(ctx, bob); len(got) != 0 {
			t.Fatalf("bob, who left, is in %v", got)
		}
		if got, _ := rooms.JoinedRooms(ctx, carl); !slices.Equal(got, []string{r}) {
			t.Fatalf("carl's rooms %v", got)
		}
		// One never in a shared room sees nothing of it.
		_, err = rooms.State(ctx, "@dave:local.test", r)
		wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN")
		_, err = rooms.State(ctx, alice, "!nowhere:local.test")
		wantErr(t, err, http.StatusNotFound, "M_NOT_FOUND")

		// Forget: only a room one left, and one one was in.
		wantErr(t, rooms.Forget(ctx, alice, r), http.StatusBadRequest, "M_UNKNOWN")
		wantErr(t, rooms.Forget(ctx, "@dave:local.test", r), http.StatusNotFound, "M_NOT_FOUND")
		if err := rooms.Forget(ctx, bob, r); err != nil {
			t.Fatal(err)
		}
	})
}

// The same state set again by the same sender makes no new event: the
// answer is the event that set it, whatever the order of its keys. Other
// content, or another sender, makes a new one.
func TestRepeatedIdenticalState(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		rooms, _ := localRooms(t, db)
		r := createRoom(t, rooms, alice, roomserver.CreateRoomRequest{Preset: "public_chat",
			PowerLevelContentOverride: map[string]json.RawMessage{"users": json.RawMessage(`{"` + alice + `":100,"` + bob + `":50}`)}})
		mustJoin(t, rooms, bob, r)
		first := setState(t, rooms, alice, r, "m.room.topic", `{"topic":"t","extra":{"a":1,"b":2}}`)
		if again := setState(t, rooms, alice, r, "m.room.topic", `{ "extra" : {"b":2,"a":1}, "topic":"t" }`); again != first {
			t.Fatalf("the same topic again: %s, want %s", again, first)
		}
		other := setState(t, rooms, alice, r, "m.room.topic", `{"topic":"u"}`)
		if other == first {
			t.Fatal("another topic has the first's event ID")
		}
		back := setState(t, rooms, alice, r, "m.room.topic", `{"topic":"t","extra":{"a":1,"b":2}}`)
		if back == first || back == other {
			t.Fatal("setting the first topic back made no new event")
		}
		byBob := setState(t, rooms, bob, r, "m.room.topic", `{"topic":"t","extra":{"a":1,"b":2}}`)
		if byBob == back {
			t.Fatal("the same content by another sender made no new event")
		}
		if ev, _ := rooms.StateEvent(ctx, alice, r, "m.room.topic", ""); ev.EventID != byBob || ev.Sender != bob {
			t.Fatalf("current topic %s by %s", ev.EventID, ev.Sender)
		}
		_, err := rooms.SendState(ctx, alice, r, "m.room.create", "", json.RawMessage(`{}`))
		wantErr(t, err, http.StatusBadRequest, "M_BAD_JSON")
		_, err = rooms.SendState(ctx, alice, r, "m.room.topic", "", json.RawMessage(`"t"`))
		wantErr(t, err, http.StatusBadRequest, "M_BAD_JSON")
	})
}

// A retried send of the same device and transaction gets the same event;
// another device or transaction sends another.
func TestSendTransactions(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		rooms, _ := localRooms(t, db)
		r := createRoom(t, rooms, alice, roomserver.CreateRoomRequest{Preset: "public_chat"})
		body := json.RawMessage(`{"body":"hi"}`)
		a, err := rooms.Send(ctx, alice, "D1", r, "m.room.message", "t1", body)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			device, evType, txn string
			same                bool
		}{
			{"D1", "m.room.message", "t1", true},
			{"D2", "m.room.message", "t1", false},
			{"D1", "m.room.message", "t2", false},
			{"D1", "m.other", "t1", false},
		} {
			id, err := rooms.Send(ctx, alice, c.device, r, c.evType, c.txn, body)
			if err != nil {
				t.Fatal(err)
			}
			if (id == a) != c.same {
				t.Fatalf("%+v: %s, first %s", c, id, a)
			}
		}
		_, err = rooms.Send(ctx, bob, "D1", r, "m.room.message", "t1", body)
		wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN") // not in the room
		_, err = rooms.Send(ctx, alice, "D1", r, "m.room.message", "t9", json.RawMessage(`[1]`))
		wantErr(t, err, http.StatusBadRequest, "M_BAD_JSON")
		_, err = rooms.Send(ctx, alice, "D1", "!nowhere:local.test", "m.room.message", "t9", body)
		wantErr(t, err, http.StatusNotFound, "M_NOT_FOUND")
	})
}

// A user may redact their own events, and others' with the room's redact
// level; the redacted event keeps only what redaction keeps and names
// its redaction.
func TestRedaction(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		rooms, _ := localRooms(t, db)
		r := createRoom(t, rooms, alice, roomserver.CreateRoomRequest{Preset: "public_chat"})
		mustJoin(t, rooms, bob, r)
		fromAlice := send(t, rooms, alice, r, "alice's")
		fromBob := send(t, rooms, bob, r, "bob's")
		other := createRoom(t, rooms, bob, roomserver.CreateRoomRequest{Preset: "public_chat"})
		elsewhere := send(t, rooms, bob, other, "elsewhere")

		_, err := rooms.Redact(ctx, bob, "D", r, fromAlice, "x1", "")
		wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN")
		_, err = rooms.Redact(ctx, bob, "D", r, "$unknown", "x2", "")
		wantErr(t, err, http.StatusNotFound, "M_NOT_FOUND")
		_, err = rooms.Redact(ctx, bob, "D", r, elsewhere, "x3", "")
		wantErr(t, err, http.StatusNotFound, "M_NOT_FOUND")
		_, err = rooms.Redact(ctx, carl, "D", r, fromBob, "x4", "")
		wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN")
		_, err = rooms.Send(ctx, bob, "D", r, "m.room.redaction", "x5", json.RawMessage(`{"reason":"no target"}`))
		wantErr(t, err, http.StatusBadRequest, "M_BAD_JSON")
		if ev, _ := rooms.Event(ctx, alice, r, fromAlice); string(ev.Content) == "{}" {
			t.Fatal("a refused redaction redacted")
		}

		own, err := rooms.Redact(ctx, bob, "D", r, fromBob, "y1", "oops")
		if err != nil {
			t.Fatal(err)
		}
		if again, err := rooms.Redact(ctx, bob, "D", r, fromBob, "y1", "oops"); err != nil || again != own {
			t.Fatalf("retried redaction: %s %v, want %s", again, err, own)
		}
		byMod, err := rooms.Redact(ctx, alice, "D", r, fromAlice, "y2", "")
		if err != nil {
			t.Fatal(err)
		}
		for target, redaction := range map[string]string{fromBob: own, fromAlice: byMod} {
			ev, err := rooms.Event(ctx, bob, r, target)
			if err != nil {
				t.Fatal(err)
			}
			var unsigned struct {
				RedactedBecause struct {
					EventID string `json:"event_id"`
					Redacts string `json:"redacts"`
				} `json:"redacted_because"`
			}
			_ = json.Unmarshal(ev.Unsigned, &unsigned)
			if string(ev.Content) != "{}" || unsigned.RedactedBecause.EventID != redaction || ev.Type != "m.room.message" {
				t.Fatalf("redacted event %s: content %s unsigned %s", target, ev.Content, ev.Unsigned)
			}
		}
		// Alice redacts bob's message too (redact level 50 < her 100).
		if _, err := rooms.Redact(ctx, alice, "D", r, send(t, rooms, bob, r, "more"), "y3", ""); err != nil {
			t.Fatal(err)
		}
		// The redaction itself is an event of the room.
		if ev, err := rooms.Event(ctx, alice, r, own); err != nil || ev.Redacts != fromBob {
			t.Fatalf("redaction event %+v %v", ev, err)
		}
	})
}
