package federationapi_test

import (
	"encoding/json"
	"maps"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/fclient"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/testutil"
)

// Older servers serve the membership handshakes under v1 only, with the
// answer in [200, answer]: the daemon joins their rooms and rejects their
// invites through v1 when v2 is an unknown path to them, and serves v1 to
// them in turn.

func TestGmslPeerV1OnlyServer(t *testing.T) {
	forEachPeerVersion(t, func(t *testing.T, n *testutil.Node, v gomatrixserverlib.RoomVersion) {
		t.Run("join", func(t *testing.T) {
			alice := n.Register(t, "alicev1"+string(v), "")
			p := newGmslPeer(t, v)
			p.setV1Only(true)
			joinPeerRoom(t, n, alice, p)
			if p.served("v2 refused") != 1 || p.served("v1 send_join") != 1 {
				t.Fatalf("v2 refused %d, v1 send_join %d", p.served("v2 refused"), p.served("v1 send_join"))
			}
			if got, want := daemonState(t, n, alice, p.roomID), p.current().ids(); !maps.Equal(got, want) {
				t.Fatalf("the daemon's state\n%v\nthe peer's\n%v", got, want)
			}
		})

		t.Run("an unknown room is not retried under v1", func(t *testing.T) {
			alice := n.Register(t, "alicev1nf"+string(v), "")
			p := newGmslPeer(t, v)
			p.setFailures(nil, func(w http.ResponseWriter, _ *http.Request) {
				writeStatus(w, http.StatusNotFound, map[string]string{"errcode": "M_NOT_FOUND", "error": "unknown room"})
			})
			path := "/_matrix/client/v3/join/" + url.PathEscape(p.roomID) + "?server_name=" + url.QueryEscape(p.Name)
			if r := n.Do(t, "POST", path, alice.Token, map[string]any{}); r.Status != http.StatusNotFound {
				t.Fatalf("join: %d %s", r.Status, r.Raw)
			}
			if p.served("v1 send_join") != 0 {
				t.Fatal("a 404 M_NOT_FOUND from v2 send_join was retried under v1")
			}
		})

		t.Run("invite rejected", func(t *testing.T) {
			alice := n.Register(t, "alicev1rej"+string(v), "")
			p := newGmslPeer(t, v)
			p.setV1Only(true)
			empty := ""
			p.add(peerEvent{Sender: p.creator, Type: spec.MRoomJoinRules, StateKey: &empty, Content: map[string]any{"join_rule": spec.Invite}})
			invite := p.add(peerEvent{Sender: p.creator, Type: spec.MRoomMember, StateKey: &alice.UserID, Content: map[string]any{"membership": spec.Invite}})
			path := "/_matrix/federation/v2/invite/" + url.PathEscape(p.roomID) + "/" + url.PathEscape(invite.EventID())
			r := testutil.SendTo(t, n, p.SignedRequest(t, "PUT", n.ServerName, path, map[string]any{
				"room_version": v, "event": json.RawMessage(invite.JSON()), "invite_room_state": []any{}}, "", nil))
			if r.Status != http.StatusOK {
				t.Fatalf("invite: %d %s", r.Status, r.Raw)
			}
			raw, _ := json.Marshal(r.Body["event"])
			signed, err := p.impl.NewEventFromUntrustedJSON(raw)
			if err != nil {
				t.Fatal(err)
			}
			p.replace(signed)
			n.Must(t, "POST", rpath(p.roomID, "/leave"), alice.Token, map[string]any{})
			if p.served("v1 send_leave") != 1 {
				t.Fatalf("v1 send_leave %d", p.served("v1 send_leave"))
			}
			leave := p.current()[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomMember, StateKey: alice.UserID}]
			if m, _ := leave.Membership(); m != spec.Leave || string(leave.SenderID()) != alice.UserID {
				t.Fatalf("the peer's member event of alice %s", leave.JSON())
			}
		})
	})
}

// A peer joins and leaves a daemon's room with the v1 handshakes.
func TestGmslPeerJoinsDaemonRoomV1(t *testing.T) {
	forEachPeerVersion(t, func(t *testing.T, n *testutil.Node, v gomatrixserverlib.RoomVersion) {
		alice := n.Register(t, "alicein1"+string(v), "")
		roomID := n.Must(t, "POST", "/_matrix/client/v3/createRoom", alice.Token, map[string]any{
			"preset": "public_chat", "room_version": string(v),
		})["room_id"].(string)
		before := daemonState(t, n, alice, roomID)
		p := newGmslPeer(t, v)
		bob := p.user("bob")
		impl := gomatrixserverlib.MustGetRoomVersion(v)

		template := func(kind string) gomatrixserverlib.ProtoEvent {
			t.Helper()
			path := "/_matrix/federation/v1/make_" + kind + "/" + url.PathEscape(roomID) + "/" + url.PathEscape(bob) + "?ver=" + url.QueryEscape(string(v))
			r := testutil.SendTo(t, n, p.SignedRequest(t, "GET", n.ServerName, path, nil, "", nil))
			if r.Status != http.StatusOK || r.Body["room_version"] != string(v) {
				t.Fatalf("make_%s: %d %s", kind, r.Status, r.Raw)
			}
			var tmpl struct {
				Event gomatrixserverlib.ProtoEvent `json:"event"`
			}
			if err := json.Unmarshal(r.Raw, &tmpl); err != nil {
				t.Fatal(err)
			}
			return tmpl.Event
		}
		send := func(kind string, ev gomatrixserverlib.PDU) json.RawMessage {
			t.Helper()
			path := "/_matrix/federation/v1/send_" + kind + "/" + url.PathEscape(roomID) + "/" + url.PathEscape(ev.EventID())
			r := testutil.SendTo(t, n, p.SignedRequest(t, "PUT", n.ServerName, path, json.RawMessage(ev.JSON()), "", nil))
			var pair []json.RawMessage
			if r.Status != http.StatusOK || json.Unmarshal(r.Raw, &pair) != nil || len(pair) != 2 || string(pair[0]) != "200" {
				t.Fatalf("v1 send_%s: %d %s", kind, r.Status, r.Raw)
			}
			return pair[1]
		}

		tmpl := template("join")
		join, err := impl.NewEventBuilderFromProtoEvent(&tmpl).Build(time.Now(), spec.ServerName(p.Name), p.KeyID, p.Key)
		if err != nil {
			t.Fatal(err)
		}
		var res fclient.RespSendJoin
		if err := json.Unmarshal(send("join", join), &res); err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, raw := range res.StateEvents {
			ev, err := impl.NewEventFromTrustedJSON(raw, false)
			if err != nil {
				t.Fatal(err)
			}
			got[ev.Type()+"|"+*ev.StateKey()] = ev.EventID()
		}
		if !maps.Equal(got, before) || len(res.AuthEvents) == 0 {
			t.Fatalf("v1 send_join's state\n%v\nthe daemon's before the join\n%v", got, before)
		}
		if members := joinedMembers(t, n, alice, roomID); !equalStrings(members, sorted([]string{alice.UserID, bob})...) {
			t.Fatalf("joined members %v", members)
		}

		tmpl = template("leave")
		leave, err := impl.NewEventBuilderFromProtoEvent(&tmpl).Build(time.Now(), spec.ServerName(p.Name), p.KeyID, p.Key)
		if err != nil {
			t.Fatal(err)
		}
		if body := send("leave", leave); string(body) != "{}" {
			t.Fatalf("v1 send_leave answer %s", body)
		}
		if members := joinedMembers(t, n, alice, roomID); !equalStrings(members, alice.UserID) {
			t.Fatalf("joined members after bob's leave %v", members)
		}
	})
}

// An invite to a room of a version this server does not know: 400
// M_UNSUPPORTED_ROOM_VERSION naming the version, as Synapse answers.
func TestInviteOfUnsupportedRoomVersion(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, nil)
		alice := n.Register(t, "alice", "")
		p := newGmslPeer(t, gomatrixserverlib.RoomVersionV10)
		invite := p.add(peerEvent{Sender: p.creator, Type: spec.MRoomMember, StateKey: &alice.UserID, Content: map[string]any{"membership": spec.Invite}})
		path := "/_matrix/federation/v2/invite/" + url.PathEscape(p.roomID) + "/" + url.PathEscape(invite.EventID())
		r := testutil.SendTo(t, n, p.SignedRequest(t, "PUT", n.ServerName, path, map[string]any{
			"room_version": "org.example.unknown", "event": json.RawMessage(invite.JSON()), "invite_room_state": []any{}}, "", nil))
		if r.Status != http.StatusBadRequest || r.Body["errcode"] != "M_UNSUPPORTED_ROOM_VERSION" || r.Body["room_version"] != "org.example.unknown" {
			t.Fatalf("invite: %d %s", r.Status, r.Raw)
		}
	})
}
