package federationapi_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/fclient"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
)

// The room versions of rooms hosted elsewhere that must be joinable:
// version 1 (event IDs chosen by the sender) and version 10 (reference
// hashes).
var peerVersions = []gomatrixserverlib.RoomVersion{gomatrixserverlib.RoomVersionV1, gomatrixserverlib.RoomVersionV10}

// forEachPeerVersion runs f on a node of each database for each version.
func forEachPeerVersion(t *testing.T, f func(t *testing.T, n *testutil.Node, v gomatrixserverlib.RoomVersion)) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, nil)
		for _, v := range peerVersions {
			t.Run("v"+string(v), func(t *testing.T) { f(t, n, v) })
		}
	})
}

// A user joins a room hosted by a gomatrixserverlib server: both
// servers then agree on the members and the whole state, and the join
// the peer received is the template it gave, completed.
func TestGmslPeerJoin(t *testing.T) {
	forEachPeerVersion(t, func(t *testing.T, n *testutil.Node, v gomatrixserverlib.RoomVersion) {
		alice := n.Register(t, "alice"+string(v), "")
		p := newGmslPeer(t, v)
		joinPeerRoom(t, n, alice, p)

		if got := joinedMembers(t, n, alice, p.roomID); !equalStrings(got, sorted([]string{alice.UserID, p.creator})...) {
			t.Fatalf("joined members %v", got)
		}
		if got, want := daemonState(t, n, alice, p.roomID), p.current().ids(); !maps.Equal(got, want) {
			t.Fatalf("the daemon's state\n%v\nthe peer's\n%v", got, want)
		}
		templates, joins := p.handshakes()
		if len(templates) != 1 || len(joins) != 1 {
			t.Fatalf("%d templates, %d joins", len(templates), len(joins))
		}
		tmpl, join := templates[0], joins[0]
		if join.Type() != spec.MRoomMember || string(join.SenderID()) != alice.UserID || join.StateKey() == nil ||
			*join.StateKey() != alice.UserID || join.RoomID().String() != p.roomID || join.Version() != v {
			t.Fatalf("join %s", join.JSON())
		}
		if m, _ := join.Membership(); m != spec.Join {
			t.Fatalf("membership %q", m)
		}
		if !slices.Equal(join.PrevEventIDs(), refIDs(t, tmpl.PrevEvents)) || !slices.Equal(join.AuthEventIDs(), refIDs(t, tmpl.AuthEvents)) ||
			join.Depth() != tmpl.Depth {
			t.Fatalf("join %s not built on the template %+v", join.JSON(), tmpl)
		}
	})
}

// joinedPeer is a peer whose room u on n has joined.
func joinedPeer(t *testing.T, n *testutil.Node, u *testutil.User, v gomatrixserverlib.RoomVersion) *gmslPeer {
	t.Helper()
	p := newGmslPeer(t, v)
	joinPeerRoom(t, n, u, p)
	return p
}

func message(body string) map[string]any { return map[string]any{"msgtype": "m.text", "body": body} }

// eventStatus is the status of GET /rooms/{roomId}/event/{eventId}.
func eventStatus(t *testing.T, n *testutil.Node, u *testutil.User, roomID, eventID string) int {
	t.Helper()
	return n.Do(t, "GET", rpath(roomID, "/event/"+url.PathEscape(eventID)), u.Token, nil).Status
}

// daemonTemplate asks n for a join template for a user of the peer: its
// prev_events are n's forward extremities of the room.
func daemonTemplate(t *testing.T, n *testutil.Node, p *gmslPeer, localpart string) []string {
	t.Helper()
	path := "/_matrix/federation/v1/make_join/" + url.PathEscape(p.roomID) + "/" + url.PathEscape(p.user(localpart)) +
		"?ver=" + url.QueryEscape(string(p.version))
	r := testutil.SendTo(t, n, p.SignedRequest(t, "GET", n.ServerName, path, nil, "", nil))
	if r.Status != http.StatusOK {
		t.Fatalf("make_join: %d %s", r.Status, r.Raw)
	}
	ev, _ := r.Body["event"].(map[string]any)
	return refIDs(t, ev["prev_events"])
}

// Events from the peer over /send: each accepted, rejected, soft-failed
// or fetched around as the spec says, in rooms of versions 1 and 10.
func TestGmslPeerInbound(t *testing.T) {
	forEachPeerVersion(t, func(t *testing.T, n *testutil.Node, v gomatrixserverlib.RoomVersion) {
		alice := n.Register(t, "alice"+string(v), "")
		empty := ""

		t.Run("a message is accepted and synced", func(t *testing.T) {
			p := joinedPeer(t, n, alice, v)
			since := syncToken(t, n, alice)
			msg := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("hello")})
			if res := p.send(t, n, rawEvents(msg)...); len(res) != 1 || res[msg.EventID()] != "" {
				t.Fatalf("answer %v", res)
			}
			tl, _ := roomTimeline(t, n, alice, p.roomID, since)
			if len(tl) != 1 || tl[0].EventID != msg.EventID() || tl[0].Sender != p.creator || tl[0].Content["body"] != "hello" {
				t.Fatalf("timeline %+v", tl)
			}
			// The same transaction again: the same answer, nothing new.
			if res := p.send(t, n, rawEvents(msg)...); res[msg.EventID()] != "" {
				t.Fatalf("again: %v", res)
			}
		})

		// An event failing the auth rules gets an error, is never shown
		// and changes nothing; the room goes on.
		rejected := func(t *testing.T, p *gmslPeer, bad gomatrixserverlib.PDU) {
			t.Helper()
			state := daemonState(t, n, alice, p.roomID)
			since := syncToken(t, n, alice)
			res := p.send(t, n, rawEvents(bad)...)
			expectRejected(t, n, res, bad)
			if got := daemonState(t, n, alice, p.roomID); !maps.Equal(got, state) {
				t.Fatalf("state changed from\n%v\nto\n%v", state, got)
			}
			if s := eventStatus(t, n, alice, p.roomID, bad.EventID()); s != http.StatusNotFound {
				t.Fatalf("GET the rejected event: %d", s)
			}
			next := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("after")})
			p.sendEvents(t, n, next)
			if tl, _ := roomTimeline(t, n, alice, p.roomID, since); !slices.Equal(timelineIDs(tl), []string{next.EventID()}) {
				t.Fatalf("timeline %v, want only %s", timelineIDs(tl), next.EventID())
			}
			// Sent again, it stays rejected.
			expectRejected(t, n, p.send(t, n, rawEvents(bad)...), bad)
		}
		t.Run("a message from a non-member is rejected", func(t *testing.T) {
			p := joinedPeer(t, n, alice, v)
			rejected(t, p, p.add(peerEvent{Sender: p.user("mallory"), Type: "m.room.message", Content: message("let me in"),
				Unchecked: true, Detached: true}))
		})
		t.Run("power levels changed without power are rejected", func(t *testing.T) {
			p := joinedPeer(t, n, alice, v)
			carol := p.user("carol")
			p.sendEvents(t, n, p.add(peerEvent{Sender: carol, Type: spec.MRoomMember, StateKey: &carol, Content: map[string]any{"membership": spec.Join}}))
			rejected(t, p, p.add(peerEvent{Sender: carol, Type: spec.MRoomPowerLevels, StateKey: &empty,
				Content: map[string]any{"users": map[string]any{p.creator: 100, carol: 100}}, Unchecked: true, Detached: true}))
		})
		t.Run("allowed by its auth events but not by the state before it is rejected", func(t *testing.T) {
			p := joinedPeer(t, n, alice, v)
			carol := p.user("carol")
			join := p.add(peerEvent{Sender: carol, Type: spec.MRoomMember, StateKey: &carol, Content: map[string]any{"membership": spec.Join}})
			leave := p.add(peerEvent{Sender: carol, Type: spec.MRoomMember, StateKey: &carol, Content: map[string]any{"membership": spec.Leave}})
			p.sendEvents(t, n, join, leave)
			// Built after her leave, citing her join.
			rejected(t, p, p.add(peerEvent{Sender: carol, Type: "m.room.message", Content: message("ghost"),
				AuthAt: join.EventID(), Unchecked: true, Detached: true}))
		})

		t.Run("malformed PDUs get an error each", func(t *testing.T) {
			p := joinedPeer(t, n, alice, v)
			other := newGmslPeer(t, v) // a room the daemon is not in
			state := daemonState(t, n, alice, p.roomID)
			since := syncToken(t, n, alice)
			_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
			forged := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("forged"), Key: otherKey, Detached: true})
			elsewhere := other.add(peerEvent{Sender: other.creator, Type: "m.room.message", Content: message("elsewhere")})
			res := p.send(t, n,
				json.RawMessage(`"not an object"`),
				json.RawMessage(`{}`),
				json.RawMessage(`{"event_id":"$badshape:`+p.Name+`","room_id":"`+p.roomID+`","type":5,"sender":[],"depth":"deep"}`),
				json.RawMessage(forged.JSON()),
				json.RawMessage(elsewhere.JSON()))
			for _, id := range []string{"$badshape:" + p.Name, forged.EventID(), elsewhere.EventID()} {
				if res[id] == "" {
					t.Errorf("%s: no error in %v", id, res)
				}
			}
			for id, e := range res {
				if e == "" {
					t.Errorf("%s accepted", id)
				}
			}
			if !strings.Contains(res[forged.EventID()], "signature") {
				t.Errorf("forged: %q", res[forged.EventID()])
			}
			if got := daemonState(t, n, alice, p.roomID); !maps.Equal(got, state) {
				t.Fatalf("state changed from\n%v\nto\n%v", state, got)
			}
			if tl, _ := roomTimeline(t, n, alice, p.roomID, since); len(tl) != 0 {
				t.Fatalf("timeline %+v", tl)
			}
			if s := eventStatus(t, n, alice, p.roomID, forged.EventID()); s != http.StatusNotFound {
				t.Fatalf("GET the forged event: %d", s)
			}
			// Signed and hashed, but too large; with more prev_events (20)
			// or auth_events (10) than a PDU may have.
			var big map[string]any
			_ = json.Unmarshal(p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("x"), Detached: true}).JSON(), &big)
			big["content"] = message(strings.Repeat("x", 70000))
			var branches []string
			for range 21 {
				branches = append(branches, p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("branch"),
					Prev: p.extremities(), Detached: true}).EventID())
			}
			wide := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("wide"), Prev: branches, Detached: true})
			tall := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("tall"), Auth: branches[:11],
				Detached: true, Unchecked: true})
			res = p.send(t, n, p.resign(big), json.RawMessage(wide.JSON()), json.RawMessage(tall.JSON()))
			if !strings.Contains(res[wide.EventID()], "prev_events") || !strings.Contains(res[tall.EventID()], "auth_events") {
				t.Errorf("answer %v", res)
			}
			if p.served("event")+p.served("get_missing_events")+p.served("state_ids") != 0 {
				t.Errorf("invalid events made the daemon fetch: event %d, get_missing_events %d, state_ids %d",
					p.served("event"), p.served("get_missing_events"), p.served("state_ids"))
			}
			for id, e := range res {
				if e == "" {
					t.Errorf("%s accepted", id)
				}
			}
			if tl, _ := roomTimeline(t, n, alice, p.roomID, since); len(tl) != 0 {
				t.Fatalf("timeline %+v", tl)
			}

			// A transaction whose pdus are not a list: 400, not 500.
			r := testutil.SendTo(t, n, p.SignedRequest(t, "PUT", n.ServerName, "/_matrix/federation/v1/send/notalist",
				map[string]any{"origin": p.Name, "origin_server_ts": 1, "pdus": 5}, "", nil))
			if r.Status != http.StatusBadRequest || r.Errcode() != "M_BAD_JSON" {
				t.Fatalf("pdus not a list: %d %s", r.Status, r.Raw)
			}
		})

		// An event whose content does not match its hash is redacted, as
		// the spec says, then processed as usual: its signature covers the
		// redacted form.
		t.Run("a content hash mismatch is redacted", func(t *testing.T) {
			p := joinedPeer(t, n, alice, v)
			since := syncToken(t, n, alice)
			msg := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("original")})
			var obj map[string]any
			if err := json.Unmarshal(msg.JSON(), &obj); err != nil {
				t.Fatal(err)
			}
			obj["content"] = message("tampered")
			tampered, _ := json.Marshal(obj)
			if res := p.send(t, n, tampered); len(res) != 1 || res[msg.EventID()] != "" {
				t.Fatalf("answer %v", res)
			}
			tl, _ := roomTimeline(t, n, alice, p.roomID, since)
			if len(tl) != 1 || tl[0].EventID != msg.EventID() || len(tl[0].Content) != 0 {
				t.Fatalf("timeline %+v, want %s redacted", tl, msg.EventID())
			}
		})

		t.Run("missing prev_events are fetched with get_missing_events", func(t *testing.T) {
			p := joinedPeer(t, n, alice, v)
			since := syncToken(t, n, alice)
			var msgs []gomatrixserverlib.PDU
			for _, body := range []string{"one", "two", "three"} {
				msgs = append(msgs, p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message(body)}))
			}
			if res := p.send(t, n, rawEvents(msgs[2])...); len(res) != 1 || res[msgs[2].EventID()] != "" {
				t.Fatalf("answer %v", res)
			}
			tl, _ := roomTimeline(t, n, alice, p.roomID, since)
			if !slices.Equal(timelineIDs(tl), eventIDs(msgs)) {
				t.Fatalf("timeline %v, want %v", timelineIDs(tl), eventIDs(msgs))
			}
			if p.served("get_missing_events") != 1 || p.served("state_ids") != 0 {
				t.Fatalf("get_missing_events %d, state_ids %d", p.served("get_missing_events"), p.served("state_ids"))
			}
			if x := daemonTemplate(t, n, p, "dave"); !slices.Equal(x, []string{msgs[2].EventID()}) {
				t.Fatalf("extremities %v", x)
			}
		})

		// A gap get_missing_events does not fill: the state before the
		// event is fetched (/state_ids, then each unknown event), and the
		// event is placed on it.
		t.Run("a gap left is crossed with state_ids", func(t *testing.T) {
			p := joinedPeer(t, n, alice, v)
			p.answerNoMissingEvents()
			since := syncToken(t, n, alice)
			topic := p.add(peerEvent{Sender: p.creator, Type: spec.MRoomTopic, StateKey: &empty, Content: map[string]any{"topic": "far away"}})
			two := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("two")})
			three := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("three")})
			if res := p.send(t, n, rawEvents(three)...); len(res) != 1 || res[three.EventID()] != "" {
				t.Fatalf("answer %v", res)
			}
			if p.served("get_missing_events") != 1 || p.served("state_ids") != 1 {
				t.Fatalf("get_missing_events %d, state_ids %d", p.served("get_missing_events"), p.served("state_ids"))
			}
			tl, _ := roomTimeline(t, n, alice, p.roomID, since)
			if !slices.Equal(timelineIDs(tl), []string{three.EventID()}) {
				t.Fatalf("timeline %v, want only %s", timelineIDs(tl), three.EventID())
			}
			if got := daemonState(t, n, alice, p.roomID); got["m.room.topic|"] != topic.EventID() {
				t.Fatalf("topic %q, want %s", got["m.room.topic|"], topic.EventID())
			}
			if s := eventStatus(t, n, alice, p.roomID, two.EventID()); s != http.StatusNotFound {
				t.Fatalf("GET an event never received: %d", s)
			}
		})

		// More missing events than one get_missing_events brings: the
		// newest are placed, the oldest of them on the state its sender
		// gives.
		t.Run("a gap longer than get_missing_events' limit", func(t *testing.T) {
			p := joinedPeer(t, n, alice, v)
			since := syncToken(t, n, alice)
			var msgs []gomatrixserverlib.PDU
			for i := range 30 {
				msgs = append(msgs, p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message(fmt.Sprint(i))}))
			}
			if res := p.send(t, n, rawEvents(msgs[29])...); len(res) != 1 || res[msgs[29].EventID()] != "" {
				t.Fatalf("answer %v", res)
			}
			tl, _ := roomTimeline(t, n, alice, p.roomID, since)
			ids := timelineIDs(tl)
			if len(ids) < 2 || len(ids) >= 30 || !slices.Equal(ids, eventIDs(msgs[30-len(ids):])) {
				t.Fatalf("timeline %v, want the newest of %v in order", ids, eventIDs(msgs))
			}
			if p.served("get_missing_events") != 1 || p.served("state_ids") != 1 {
				t.Fatalf("get_missing_events %d, state_ids %d", p.served("get_missing_events"), p.served("state_ids"))
			}
		})

		// An event built on a rejected one is judged on its own: the
		// rejected event stays out.
		t.Run("an event after a rejected one", func(t *testing.T) {
			p := joinedPeer(t, n, alice, v)
			bad := p.add(peerEvent{Sender: p.user("mallory"), Type: "m.room.message", Content: message("let me in"),
				Unchecked: true})
			expectRejected(t, n, p.send(t, n, rawEvents(bad)...), bad)
			since := syncToken(t, n, alice)
			next := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("after")})
			if res := p.send(t, n, rawEvents(next)...); len(res) != 1 || res[next.EventID()] != "" {
				t.Fatalf("answer %v", res)
			}
			if tl, _ := roomTimeline(t, n, alice, p.roomID, since); !slices.Equal(timelineIDs(tl), []string{next.EventID()}) {
				t.Fatalf("timeline %v, want only %s", timelineIDs(tl), next.EventID())
			}
			if s := eventStatus(t, n, alice, p.roomID, bad.EventID()); s != http.StatusNotFound {
				t.Fatalf("GET the rejected event: %d", s)
			}
			// The state before it is the state before the rejected one: no
			// gap to fill.
			if p.served("get_missing_events")+p.served("state_ids") != 0 {
				t.Fatalf("get_missing_events %d, state_ids %d", p.served("get_missing_events"), p.served("state_ids"))
			}
		})

		// A rejected state event changes no state, also for the events
		// after it: the state before them is as if it were not there.
		t.Run("the state after a rejected state event", func(t *testing.T) {
			p := joinedPeer(t, n, alice, v)
			carol, dave := p.user("carol"), p.user("dave")
			join := p.add(peerEvent{Sender: carol, Type: spec.MRoomMember, StateKey: &carol, Content: map[string]any{"membership": spec.Join}})
			// Only moderators invite.
			power := p.add(peerEvent{Sender: p.creator, Type: spec.MRoomPowerLevels, StateKey: &empty,
				Content: map[string]any{"users": map[string]any{p.creator: 100}, "invite": 50}})
			p.sendEvents(t, n, join, power)
			create := p.current()[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomCreate}]
			// carol takes power; the peer builds on it.
			grab := p.add(peerEvent{Sender: carol, Type: spec.MRoomPowerLevels, StateKey: &empty,
				Content: map[string]any{"users": map[string]any{p.creator: 100, carol: 100}, "invite": 50}, Unchecked: true})
			expectRejected(t, n, p.send(t, n, rawEvents(grab)...), grab)
			msg := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("after the power grab"), AuthAt: power.EventID()})
			p.sendEvents(t, n, msg)
			// carol's invite after it, citing no power levels (where anyone
			// invites): the state before it has the room's real ones.
			invite := p.add(peerEvent{Sender: carol, Type: spec.MRoomMember, StateKey: &dave, Content: map[string]any{"membership": spec.Invite},
				Auth: []string{create.EventID(), join.EventID()}, Unchecked: true, Detached: true})
			// Rejected by the state before it (its own auth events allow it).
			expectRejected(t, n, p.send(t, n, rawEvents(invite)...), invite)
		})

		// Redactions of a daemon user's message from the peer: its
		// moderator's applies; one by a user without power does not (up
		// to version 2 the auth rules reject it).
		t.Run("redactions from the peer", func(t *testing.T) {
			p := joinedPeer(t, n, alice, v)
			carol := p.user("carol")
			p.sendEvents(t, n, p.add(peerEvent{Sender: carol, Type: spec.MRoomMember, StateKey: &carol, Content: map[string]any{"membership": spec.Join}}))
			mine := n.Must(t, "PUT", rpath(p.roomID, "/send/m.room.message/r1"), alice.Token, message("mine"))["event_id"].(string)
			body := func() any {
				return n.Must(t, "GET", rpath(p.roomID, "/event/"+url.PathEscape(mine)), alice.Token, nil)["content"].(map[string]any)["body"]
			}
			byCarol := p.add(peerEvent{Sender: carol, Type: spec.MRoomRedaction, Content: map[string]any{}, Redacts: mine, Unchecked: true, Detached: true})
			res := p.send(t, n, rawEvents(byCarol)...)
			if v == gomatrixserverlib.RoomVersionV1 {
				expectRejected(t, n, res, byCarol)
			}
			if b := body(); b != "mine" {
				t.Fatalf("after carol's redaction: body %v", b)
			}
			byCreator := p.add(peerEvent{Sender: p.creator, Type: spec.MRoomRedaction, Content: map[string]any{}, Redacts: mine})
			p.sendEvents(t, n, byCreator)
			if b := body(); b != nil {
				t.Fatalf("after the moderator's redaction: body %v", b)
			}
		})

		// The peer cannot speak for the daemon's users: an event with one
		// as sender, signed by the peer only, is refused.
		t.Run("an event of a daemon user signed by the peer", func(t *testing.T) {
			p := joinedPeer(t, n, alice, v)
			state := daemonState(t, n, alice, p.roomID)
			leave := p.add(peerEvent{Sender: alice.UserID, Type: spec.MRoomMember, StateKey: &alice.UserID,
				Content: map[string]any{"membership": spec.Leave}, Detached: true})
			res := p.send(t, n, rawEvents(leave)...)
			if !strings.Contains(res[leave.EventID()], "signature") {
				t.Fatalf("answer %v", res)
			}
			if got := daemonState(t, n, alice, p.roomID); !maps.Equal(got, state) {
				t.Fatalf("state changed from\n%v\nto\n%v", state, got)
			}
		})

		// The peer's creator kicks the daemon's user: the daemon's view of
		// the room follows.
		t.Run("a kick of the daemon's user", func(t *testing.T) {
			p := joinedPeer(t, n, alice, v)
			since := syncToken(t, n, alice)
			kick := p.add(peerEvent{Sender: p.creator, Type: spec.MRoomMember, StateKey: &alice.UserID,
				Content: map[string]any{"membership": spec.Leave, "reason": "out"}})
			p.sendEvents(t, n, kick)
			rooms := n.Must(t, "GET", "/_matrix/client/v3/joined_rooms", alice.Token, nil)["joined_rooms"].([]any)
			if slices.Contains(rooms, any(p.roomID)) {
				t.Fatalf("joined rooms %v", rooms)
			}
			r := n.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0&since="+url.QueryEscape(since), alice.Token, nil)
			left, _ := r["rooms"].(map[string]any)["leave"].(map[string]any)[p.roomID].(map[string]any)
			if left == nil {
				t.Fatalf("no leave section for the room: %v", r["rooms"])
			}
		})

		// An event on a branch that left the room's history before the
		// daemon joined: it is placed, and the history before the join
		// (the room's first events, a message) stays out of the timeline,
		// even from a server that does not honour min_depth.
		t.Run("a branch from before the join", func(t *testing.T) {
			p := newGmslPeer(t, v)
			old := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("before alice")})
			joinPeerRoom(t, n, alice, p)
			_, joins := p.handshakes()
			since := syncToken(t, n, alice)
			late := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("from the past"), Prev: []string{old.EventID()}})
			if res := p.send(t, n, rawEvents(late)...); len(res) != 1 || res[late.EventID()] != "" {
				t.Fatalf("answer %v", res)
			}
			tl, _ := roomTimeline(t, n, alice, p.roomID, since)
			if !slices.Equal(timelineIDs(tl), []string{late.EventID()}) {
				t.Fatalf("timeline %v (%+v), want only %s", timelineIDs(tl), tl, late.EventID())
			}
			if d := p.missingMinDepths(); !slices.Equal(d, []int64{joins[0].Depth()}) {
				t.Fatalf("get_missing_events min_depth %v, want the join's %d", d, joins[0].Depth())
			}
			if s := eventStatus(t, n, alice, p.roomID, old.EventID()); s != http.StatusNotFound {
				t.Fatalf("GET the message from before the join: %d", s)
			}
			if got, want := daemonState(t, n, alice, p.roomID), p.current().ids(); !maps.Equal(got, want) {
				t.Fatalf("the daemon's state\n%v\nthe peer's\n%v", got, want)
			}
		})

		// get_missing_events failing: the gap is crossed with state_ids
		// all the same.
		t.Run("a gap when get_missing_events fails", func(t *testing.T) {
			p := joinedPeer(t, n, alice, v)
			p.breakMissingEvents()
			since := syncToken(t, n, alice)
			p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("one")})
			two := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("two")})
			if res := p.send(t, n, rawEvents(two)...); len(res) != 1 || res[two.EventID()] != "" {
				t.Fatalf("answer %v", res)
			}
			if p.served("get_missing_events") != 1 || p.served("state_ids") != 1 {
				t.Fatalf("get_missing_events %d, state_ids %d", p.served("get_missing_events"), p.served("state_ids"))
			}
			if tl, _ := roomTimeline(t, n, alice, p.roomID, since); !slices.Equal(timelineIDs(tl), []string{two.EventID()}) {
				t.Fatalf("timeline %v, want only %s", timelineIDs(tl), two.EventID())
			}
		})

		// Allowed by the state before it, not by the current state: kept,
		// never shown, never built upon.
		t.Run("an event the current state forbids is soft-failed", func(t *testing.T) {
			p := joinedPeer(t, n, alice, v)
			carol := p.user("carol")
			join := p.add(peerEvent{Sender: carol, Type: spec.MRoomMember, StateKey: &carol, Content: map[string]any{"membership": spec.Join}})
			ban := p.add(peerEvent{Sender: p.creator, Type: spec.MRoomMember, StateKey: &carol, Content: map[string]any{"membership": spec.Ban}})
			p.sendEvents(t, n, join, ban)
			since := syncToken(t, n, alice)
			late := p.add(peerEvent{Sender: carol, Type: "m.room.message", Content: message("before my ban"),
				Prev: []string{join.EventID()}, Detached: true})
			if res := p.send(t, n, rawEvents(late)...); len(res) != 1 || res[late.EventID()] != "" {
				t.Fatalf("answer %v", res)
			}
			if tl, _ := roomTimeline(t, n, alice, p.roomID, since); len(tl) != 0 {
				t.Fatalf("timeline %+v", tl)
			}
			stored, err := n.Store.RoomEventsByID(context.Background(), []string{late.EventID()})
			if err != nil || len(stored) != 1 || !stored[0].SoftFailed || stored[0].Rejected || stored[0].Outlier {
				t.Fatalf("stored %+v %v", stored, err)
			}
			if x := daemonTemplate(t, n, p, "dave"); !slices.Equal(x, []string{ban.EventID()}) {
				t.Fatalf("extremities %v, want the ban only", x)
			}
		})

		// Two branches: a name on one, a topic on the other. Both reach
		// the state while the branches are apart (two extremities) and
		// once an event joins them.
		t.Run("branches meeting are resolved", func(t *testing.T) {
			p := joinedPeer(t, n, alice, v)
			fork := p.current()
			base := p.extremities()
			name := p.add(peerEvent{Sender: p.creator, Type: spec.MRoomName, StateKey: &empty, Content: map[string]any{"name": "left"}, Prev: base})
			topic := p.add(peerEvent{Sender: p.creator, Type: spec.MRoomTopic, StateKey: &empty, Content: map[string]any{"topic": "right"}, Prev: base})
			p.sendEvents(t, n, name, topic)
			got := daemonState(t, n, alice, p.roomID)
			if got["m.room.name|"] != name.EventID() || got["m.room.topic|"] != topic.EventID() || len(got) != len(fork)+2 {
				t.Fatalf("state with two extremities %v", got)
			}
			if x := daemonTemplate(t, n, p, "dave"); !slices.Equal(sorted(x), sorted([]string{name.EventID(), topic.EventID()})) {
				t.Fatalf("extremities %v", x)
			}
			merge := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("both")})
			if !slices.Equal(merge.PrevEventIDs(), []string{name.EventID(), topic.EventID()}) {
				t.Fatalf("merge prev_events %v", merge.PrevEventIDs())
			}
			p.sendEvents(t, n, merge)
			if got := daemonState(t, n, alice, p.roomID); !maps.Equal(got, p.current().ids()) {
				t.Fatalf("the daemon's state\n%v\nthe peer's\n%v", got, p.current().ids())
			}
			if x := daemonTemplate(t, n, p, "dave"); !slices.Equal(x, []string{merge.EventID()}) {
				t.Fatalf("extremities %v", x)
			}
		})

		// Both branches change the topic: the daemon resolves as the peer
		// does (gomatrixserverlib's algorithm of the room version), and a
		// merge arriving alone brings its missing branch.
		t.Run("conflicting branches are resolved as the peer does", func(t *testing.T) {
			p := joinedPeer(t, n, alice, v)
			base := p.extremities()
			one := p.add(peerEvent{Sender: p.creator, Type: spec.MRoomTopic, StateKey: &empty, Content: map[string]any{"topic": "one"}, Prev: base})
			two := p.add(peerEvent{Sender: p.creator, Type: spec.MRoomTopic, StateKey: &empty, Content: map[string]any{"topic": "two"}, Prev: base})
			merge := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("both")})
			p.sendEvents(t, n, one)
			p.sendEvents(t, n, merge) // two comes with get_missing_events
			if p.served("get_missing_events") != 1 || eventStatus(t, n, alice, p.roomID, two.EventID()) != http.StatusOK {
				t.Fatalf("the missing branch was not fetched (%d get_missing_events)", p.served("get_missing_events"))
			}
			want := p.current().ids()
			if w := want["m.room.topic|"]; w != one.EventID() && w != two.EventID() {
				t.Fatalf("the peer resolved the topic to %s", w)
			}
			if got := daemonState(t, n, alice, p.roomID); !maps.Equal(got, want) {
				t.Fatalf("the daemon's state\n%v\nthe peer's\n%v", got, want)
			}
		})
	})
}

// A room's server failing during the join: the client gets 502 or 504
// with an errcode, and the daemon keeps nothing of the room; once the
// server answers again, the join goes through.
func TestGmslPeerJoinFailures(t *testing.T) {
	forEachPeerVersion(t, func(t *testing.T, n *testutil.Node, v gomatrixserverlib.RoomVersion) {
		alice := n.Register(t, "alice"+string(v), "")
		fail500 := func(w http.ResponseWriter, _ *http.Request) {
			writeStatus(w, http.StatusInternalServerError, map[string]string{"errcode": "M_UNKNOWN", "error": "broken"})
		}
		refuse := func(status int, errcode string) http.HandlerFunc {
			return func(w http.ResponseWriter, _ *http.Request) {
				writeStatus(w, status, map[string]string{"errcode": errcode, "error": "no"})
			}
		}
		for _, tc := range []struct {
			name               string
			makeJoin, sendJoin http.HandlerFunc
			recover            bool
			status             int    // the answer to the client (0: 502 or 504)
			errcode            string // (when status is set)
		}{
			{name: "make_join refused", makeJoin: refuse(http.StatusForbidden, "M_FORBIDDEN"), status: http.StatusForbidden, errcode: "M_FORBIDDEN"},
			{name: "make_join does not know the room", makeJoin: refuse(http.StatusNotFound, "M_NOT_FOUND"), status: http.StatusNotFound, errcode: "M_NOT_FOUND"},
			{name: "send_join refused", sendJoin: refuse(http.StatusForbidden, "M_FORBIDDEN"), status: http.StatusForbidden, errcode: "M_FORBIDDEN"},
			{name: "make_join answers 500", makeJoin: fail500},
			{name: "send_join answers 500", sendJoin: fail500, recover: true},
			{name: "send_join drops the connection", sendJoin: func(w http.ResponseWriter, _ *http.Request) {
				conn, _, err := http.NewResponseController(w).Hijack()
				if err == nil {
					conn.Close()
				}
			}},
			{name: "send_join answers a state without a create event", sendJoin: func(w http.ResponseWriter, _ *http.Request) {
				writeJSON(w, map[string]any{"state": []any{}, "auth_chain": []any{}})
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				p := newGmslPeer(t, v)
				p.setFailures(tc.makeJoin, tc.sendJoin)
				path := "/_matrix/client/v3/join/" + url.PathEscape(p.roomID) + "?server_name=" + url.QueryEscape(p.Name)
				r := n.Do(t, "POST", path, alice.Token, map[string]any{})
				if tc.status != 0 && (r.Status != tc.status || r.Errcode() != tc.errcode) {
					t.Fatalf("join: %d %s, want %d %s", r.Status, r.Raw, tc.status, tc.errcode)
				}
				if tc.status == 0 && ((r.Status != http.StatusBadGateway && r.Status != http.StatusGatewayTimeout) || r.Errcode() == "") {
					t.Fatalf("join: %d %s", r.Status, r.Raw)
				}
				if tc.sendJoin != nil && p.served("send_join") == 0 {
					t.Fatalf("send_join was not reached (%d)", p.served("send_join"))
				}
				if _, err := n.Store.Room(context.Background(), p.roomID); !errors.Is(err, storage.ErrNotFound) {
					t.Fatalf("the room is stored: %v", err)
				}
				if stored, err := n.Store.RoomEventsByID(context.Background(), eventIDs(p.current().list())); err != nil || len(stored) != 0 {
					t.Fatalf("events of the room are stored: %d %v", len(stored), err)
				}
				if status, raw := roomStateRaw(t, n, alice, p.roomID); status != http.StatusNotFound && status != http.StatusForbidden {
					t.Fatalf("room state: %d %s", status, raw)
				}
				rooms := n.Must(t, "GET", "/_matrix/client/v3/joined_rooms", alice.Token, nil)["joined_rooms"].([]any)
				if slices.Contains(rooms, any(p.roomID)) {
					t.Fatalf("joined rooms %v", rooms)
				}
				if !tc.recover {
					return
				}
				p.setFailures(nil, nil)
				// The failure backs the server off for a moment.
				testutil.Eventually(t, "a join once the server answers", func() bool {
					return n.Do(t, "POST", path, alice.Token, map[string]any{}).Status == http.StatusOK
				})
				if got, want := daemonState(t, n, alice, p.roomID), p.current().ids(); !maps.Equal(got, want) {
					t.Fatalf("the daemon's state\n%v\nthe peer's\n%v", got, want)
				}
			})
		}
	})
}

// A send_join answer with a state event its server did not sign: the
// join goes through without it.
func TestGmslPeerJoinForgedState(t *testing.T) {
	forEachPeerVersion(t, func(t *testing.T, n *testutil.Node, v gomatrixserverlib.RoomVersion) {
		alice := n.Register(t, "alice"+string(v), "")
		p := newGmslPeer(t, v)
		_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
		empty := ""
		forged := p.add(peerEvent{Sender: p.creator, Type: spec.MRoomTopic, StateKey: &empty, Content: map[string]any{"topic": "forged"}, Key: otherKey})
		joinPeerRoom(t, n, alice, p)
		want := p.current().ids()
		delete(want, "m.room.topic|")
		if got := daemonState(t, n, alice, p.roomID); !maps.Equal(got, want) {
			t.Fatalf("the daemon's state\n%v\nwant\n%v", got, want)
		}
		if stored, err := n.Store.RoomEventsByID(context.Background(), []string{forged.EventID()}); err != nil || len(stored) != 0 {
			t.Fatalf("the forged event is stored: %+v %v", stored, err)
		}
	})
}

// A room in a version the daemon does not support is not joined: the
// daemon offers the remote only the versions it supports (those of
// /capabilities), and refuses a template in another one.
func TestGmslPeerJoinRoomVersions(t *testing.T) {
	n := testutil.StartNode(t, testutil.SQLite(t), nil)
	alice := n.Register(t, "alice", "")
	caps := n.Must(t, "GET", "/_matrix/client/v3/capabilities", alice.Token, nil)
	available := slices.Sorted(maps.Keys(caps["capabilities"].(map[string]any)["m.room_versions"].(map[string]any)["available"].(map[string]any)))

	p := joinedPeer(t, n, alice, gomatrixserverlib.RoomVersionV10)
	if offered := p.offeredVersions(); len(offered) != 1 || !slices.Equal(sorted(offered[0]), available) {
		t.Fatalf("make_join offered %v, /capabilities has %v", offered, available)
	}

	unsupported := string(gomatrixserverlib.RoomVersionPseudoIDs)
	if slices.Contains(available, unsupported) {
		t.Fatalf("%s is supported", unsupported)
	}
	for _, tc := range []struct {
		name     string
		makeJoin func(p *gmslPeer) http.HandlerFunc
	}{
		{"the room's server checks the versions offered", func(p *gmslPeer) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) {
				if !slices.Contains(r.URL.Query()["ver"], unsupported) {
					writeStatus(w, http.StatusBadRequest, spec.IncompatibleRoomVersion(unsupported))
					return
				}
				p.makeJoinIn(w, r, unsupported)
			}
		}},
		{"the room's server ignores the versions offered", func(p *gmslPeer) http.HandlerFunc {
			return func(w http.ResponseWriter, r *http.Request) { p.makeJoinIn(w, r, unsupported) }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newGmslPeer(t, gomatrixserverlib.RoomVersionV10)
			p.setFailures(tc.makeJoin(p), nil)
			path := "/_matrix/client/v3/join/" + url.PathEscape(p.roomID) + "?server_name=" + url.QueryEscape(p.Name)
			r := n.Do(t, "POST", path, alice.Token, map[string]any{})
			if r.Status != http.StatusBadRequest || r.Errcode() != "M_INCOMPATIBLE_ROOM_VERSION" {
				t.Fatalf("join: %d %s", r.Status, r.Raw)
			}
			if p.served("send_join") != 0 {
				t.Fatal("send_join was sent")
			}
			if _, err := n.Store.Room(context.Background(), p.roomID); !errors.Is(err, storage.ErrNotFound) {
				t.Fatalf("the room is stored: %v", err)
			}
		})
	}
}

// The daemon's own events reach the peer's room: a message of a local
// user comes to the peer over /send, signed, built on the join.
func TestGmslPeerReceivesDaemonEvents(t *testing.T) {
	forEachPeerVersion(t, func(t *testing.T, n *testutil.Node, v gomatrixserverlib.RoomVersion) {
		alice := n.Register(t, "alice"+string(v), "")
		p := joinedPeer(t, n, alice, v)
		_, joins := p.handshakes()
		id := n.Must(t, "PUT", rpath(p.roomID, "/send/m.room.message/txn1"), alice.Token, message("to the peer"))["event_id"].(string)
		var got gomatrixserverlib.PDU
		testutil.Eventually(t, "the message at the peer", func() bool {
			for _, ev := range p.receivedPDUs() {
				if ev.EventID() == id {
					got = ev
					return true
				}
			}
			return false
		})
		if string(got.SenderID()) != alice.UserID || got.Type() != "m.room.message" || !slices.Equal(got.PrevEventIDs(), []string{joins[0].EventID()}) {
			t.Fatalf("received %s", got.JSON())
		}
		if x := p.extremities(); !slices.Equal(x, []string{id}) {
			t.Fatalf("the peer did not take the message into its room: extremities %v", x)
		}
	})
}

// An event naming an event of another room as its prev_event: the
// daemon must not take that room's state as the state before it. The
// peer's creator is in both rooms (the peer's, and one of the daemon's),
// so the other room's state would allow the event.
func TestGmslPeerPrevEventOfAnotherRoom(t *testing.T) {
	forEachPeerVersion(t, func(t *testing.T, n *testutil.Node, v gomatrixserverlib.RoomVersion) {
		alice := n.Register(t, "alice"+string(v), "")
		p := joinedPeer(t, n, alice, v)
		other := n.Must(t, "POST", "/_matrix/client/v3/createRoom", alice.Token, map[string]any{
			"preset": "public_chat", "room_version": string(v), "name": "another room",
		})["room_id"].(string)
		res := peerJoinDaemonRoom(t, p, n, p.creator, other)
		state := daemonState(t, n, alice, p.roomID)

		for _, prev := range [][]string{{res.JoinEvent.EventID()}, {p.extremities()[0], res.JoinEvent.EventID()}} {
			stray := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("astray"),
				Prev: prev, AuthAt: p.extremities()[0], Unchecked: true, Detached: true})
			// Rejected (kept as such, answered {} as Synapse answers it).
			expectRejected(t, n, p.send(t, n, rawEvents(stray)...), stray)
			if got := daemonState(t, n, alice, p.roomID); !maps.Equal(got, state) {
				t.Fatalf("state changed from\n%v\nto\n%v", state, got)
			}
			if x := daemonTemplate(t, n, p, "dave"); slices.Contains(x, stray.EventID()) {
				t.Fatalf("extremities %v", x)
			}
		}
	})
}

// peerJoinDaemonRoom joins a user of the peer to a daemon's room with
// gomatrixserverlib.PerformJoin.
func peerJoinDaemonRoom(t *testing.T, p *gmslPeer, n *testutil.Node, userID, roomID string) *gomatrixserverlib.PerformJoinResponse {
	t.Helper()
	user, _ := spec.NewUserID(userID, true)
	rid, _ := spec.NewRoomID(roomID)
	res, ferr := gomatrixserverlib.PerformJoin(context.Background(), peerJoinClient{t, p, n}, gomatrixserverlib.PerformJoinInput{
		UserID: user, RoomID: rid, ServerName: spec.ServerName(n.ServerName), PrivateKey: p.Key, KeyID: p.KeyID, KeyRing: p.keyRing,
		EventProvider: func(gomatrixserverlib.RoomVersion, []string) ([]gomatrixserverlib.PDU, error) { return nil, nil },
		UserIDQuerier: peerUserIDForSender,
		GetOrCreateSenderID: func(_ context.Context, u spec.UserID, _ spec.RoomID, _ string) (spec.SenderID, ed25519.PrivateKey, error) {
			return spec.SenderID(u.String()), p.Key, nil
		},
		StoreSenderIDFromPublicID: func(context.Context, spec.SenderID, string, spec.RoomID) error { return nil },
	})
	if ferr != nil {
		t.Fatalf("join: %v", ferr.Err)
	}
	return res
}

// peerJoinClient is the peer's side of a join of a daemon's room, for
// gomatrixserverlib.PerformJoin: make_join and v2 send_join to the node.
type peerJoinClient struct {
	t testing.TB
	p *gmslPeer
	n *testutil.Node
}

func (c peerJoinClient) MakeJoin(_ context.Context, _, _ spec.ServerName, roomID, userID string) (gomatrixserverlib.MakeJoinResponse, error) {
	q := url.Values{}
	for _, v := range peerVersions {
		q.Add("ver", string(v))
	}
	path := "/_matrix/federation/v1/make_join/" + url.PathEscape(roomID) + "/" + url.PathEscape(userID) + "?" + q.Encode()
	r := testutil.SendTo(c.t, c.n, c.p.SignedRequest(c.t, "GET", c.n.ServerName, path, nil, "", nil))
	if r.Status != http.StatusOK {
		return nil, fmt.Errorf("make_join: %d %s", r.Status, r.Raw)
	}
	var out fclient.RespMakeJoin
	return &out, json.Unmarshal(r.Raw, &out)
}

func (c peerJoinClient) SendJoin(_ context.Context, _, _ spec.ServerName, ev gomatrixserverlib.PDU) (gomatrixserverlib.SendJoinResponse, error) {
	path := "/_matrix/federation/v2/send_join/" + url.PathEscape(ev.RoomID().String()) + "/" + url.PathEscape(ev.EventID())
	r := testutil.SendTo(c.t, c.n, c.p.SignedRequest(c.t, "PUT", c.n.ServerName, path, json.RawMessage(ev.JSON()), "", nil))
	if r.Status != http.StatusOK {
		return nil, fmt.Errorf("send_join: %d %s", r.Status, r.Raw)
	}
	var out fclient.RespSendJoin
	return &out, json.Unmarshal(r.Raw, &out)
}

// The other way round: a user of the gomatrixserverlib server joins a
// daemon's room with gomatrixserverlib.PerformJoin, whose checks the
// daemon's make_join and send_join answers pass; both then agree on the
// state.
func TestGmslPeerJoinsDaemonRoom(t *testing.T) {
	forEachPeerVersion(t, func(t *testing.T, n *testutil.Node, v gomatrixserverlib.RoomVersion) {
		alice := n.Register(t, "alice"+string(v), "")
		roomID := n.Must(t, "POST", "/_matrix/client/v3/createRoom", alice.Token, map[string]any{
			"preset": "public_chat", "room_version": string(v), "name": "on the daemon",
		})["room_id"].(string)
		n.Must(t, "PUT", rpath(roomID, "/send/m.room.message/m1"), alice.Token, message("before bob"))
		before := daemonState(t, n, alice, roomID)

		p := newGmslPeer(t, v)
		bob, _ := spec.NewUserID(p.user("bob"), true)
		res := peerJoinDaemonRoom(t, p, n, bob.String(), roomID)
		if res.JoinEvent.Version() != v {
			t.Fatalf("joined a room of version %s", res.JoinEvent.Version())
		}
		got := map[string]string{}
		for _, ev := range res.StateSnapshot.GetStateEvents().UntrustedEvents(v) {
			got[ev.Type()+"|"+*ev.StateKey()] = ev.EventID()
		}
		if !maps.Equal(got, before) {
			t.Fatalf("send_join's state\n%v\nthe daemon's before the join\n%v", got, before)
		}
		if members := joinedMembers(t, n, alice, roomID); !equalStrings(members, sorted([]string{alice.UserID, bob.String()})...) {
			t.Fatalf("joined members %v", members)
		}
		if st := daemonState(t, n, alice, roomID); st["m.room.member|"+bob.String()] != res.JoinEvent.EventID() {
			t.Fatalf("bob's member event %s, want %s", st["m.room.member|"+bob.String()], res.JoinEvent.EventID())
		}

		// bob speaks, built on his join and the state send_join gave.
		since := syncToken(t, n, alice)
		ae := gomatrixserverlib.NewAuthEvents(append(res.StateSnapshot.GetStateEvents().UntrustedEvents(v), res.JoinEvent))
		content, _ := json.Marshal(message("hello from bob"))
		eb := gomatrixserverlib.MustGetRoomVersion(v).NewEventBuilderFromProtoEvent(&gomatrixserverlib.ProtoEvent{
			SenderID: bob.String(), RoomID: roomID, Type: "m.room.message", Content: content,
			PrevEvents: []string{res.JoinEvent.EventID()}, Depth: res.JoinEvent.Depth() + 1})
		if err := eb.AddAuthEvents(&ae); err != nil {
			t.Fatal(err)
		}
		msg, err := eb.Build(time.Now(), spec.ServerName(p.Name), p.KeyID, p.Key)
		if err != nil {
			t.Fatal(err)
		}
		p.sendEvents(t, n, msg)
		if tl, _ := roomTimeline(t, n, alice, roomID, since); !slices.Equal(timelineIDs(tl), []string{msg.EventID()}) {
			t.Fatalf("timeline %v, want bob's message %s", timelineIDs(tl), msg.EventID())
		}

		// bob leaves through the daemon: make_leave, send_leave.
		path := "/_matrix/federation/v1/make_leave/" + url.PathEscape(roomID) + "/" + url.PathEscape(bob.String())
		r := testutil.SendTo(t, n, p.SignedRequest(t, "GET", n.ServerName, path, nil, "", nil))
		if r.Status != http.StatusOK {
			t.Fatalf("make_leave: %d %s", r.Status, r.Raw)
		}
		var tmpl struct {
			Event gomatrixserverlib.ProtoEvent `json:"event"`
		}
		if err := json.Unmarshal(r.Raw, &tmpl); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(refIDs(t, tmpl.Event.PrevEvents), []string{msg.EventID()}) {
			t.Fatalf("make_leave template prev_events %v, want bob's message", refIDs(t, tmpl.Event.PrevEvents))
		}
		leave, err := gomatrixserverlib.MustGetRoomVersion(v).NewEventBuilderFromProtoEvent(&tmpl.Event).Build(time.Now(), spec.ServerName(p.Name), p.KeyID, p.Key)
		if err != nil {
			t.Fatal(err)
		}
		path = "/_matrix/federation/v2/send_leave/" + url.PathEscape(roomID) + "/" + url.PathEscape(leave.EventID())
		if r := testutil.SendTo(t, n, p.SignedRequest(t, "PUT", n.ServerName, path, json.RawMessage(leave.JSON()), "", nil)); r.Status != http.StatusOK {
			t.Fatalf("send_leave: %d %s", r.Status, r.Raw)
		}
		if members := joinedMembers(t, n, alice, roomID); !equalStrings(members, alice.UserID) {
			t.Fatalf("joined members after bob's leave %v", members)
		}
	})
}

// The peer invites a daemon user to an invite-only room: the daemon
// signs the invite (v2 /invite), the user sees it, and joins by room ID
// alone, through the inviter's server.
func TestGmslPeerInvite(t *testing.T) {
	forEachPeerVersion(t, func(t *testing.T, n *testutil.Node, v gomatrixserverlib.RoomVersion) {
		t.Run("joined", func(t *testing.T) { peerInvite(t, n, v, false) })
		t.Run("rejected", func(t *testing.T) { peerInvite(t, n, v, true) })
	})
}

// peerInvite runs an invite from the peer, joined or rejected.
func peerInvite(t *testing.T, n *testutil.Node, v gomatrixserverlib.RoomVersion, reject bool) {
	alice := n.Register(t, fmt.Sprintf("alice%s%v", v, reject), "")
	since := syncToken(t, n, alice)
	p := newGmslPeer(t, v)
	empty := ""
	p.add(peerEvent{Sender: p.creator, Type: spec.MRoomJoinRules, StateKey: &empty, Content: map[string]any{"join_rule": spec.Invite}})
	invite := p.add(peerEvent{Sender: p.creator, Type: spec.MRoomMember, StateKey: &alice.UserID, Content: map[string]any{"membership": spec.Invite}})
	var stripped []any
	for _, ev := range p.current().list() {
		if ev.Type() == spec.MRoomCreate || ev.Type() == spec.MRoomJoinRules {
			stripped = append(stripped, gomatrixserverlib.NewInviteStrippedState(ev))
		}
	}
	path := "/_matrix/federation/v2/invite/" + url.PathEscape(p.roomID) + "/" + url.PathEscape(invite.EventID())
	r := testutil.SendTo(t, n, p.SignedRequest(t, "PUT", n.ServerName, path, map[string]any{
		"room_version": v, "event": json.RawMessage(invite.JSON()), "invite_room_state": stripped}, "", nil))
	if r.Status != http.StatusOK {
		t.Fatalf("invite: %d %s", r.Status, r.Raw)
	}
	raw, _ := json.Marshal(r.Body["event"])
	signed, err := p.impl.NewEventFromUntrustedJSON(raw)
	if err != nil || signed.EventID() != invite.EventID() {
		t.Fatalf("signed invite %s: %v", raw, err)
	}
	if err := gomatrixserverlib.VerifyEventSignatures(context.Background(), signed, p.keyRing, peerUserIDForSender); err != nil {
		t.Fatalf("the signed invite: %v", err)
	}
	p.replace(signed)

	_, _, body := syncChanged(t, n, alice, since)
	if inv, _ := body["rooms"].(map[string]any)["invite"].(map[string]any)[p.roomID].(map[string]any); inv == nil {
		t.Fatalf("no invite in /sync: %v", body["rooms"])
	}
	// Invited is not in the room: the room's events are not taken.
	msg := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("not yet")})
	if res := p.send(t, n, rawEvents(msg)...); res[msg.EventID()] == "" {
		t.Fatalf("an event of a room the daemon is only invited to was accepted: %v", res)
	}
	if stored, err := n.Store.RoomEventsByID(context.Background(), []string{msg.EventID()}); err != nil || len(stored) != 0 {
		t.Fatalf("stored %+v %v", stored, err)
	}
	if reject {
		// Rejected through the inviter's server: make_leave, send_leave.
		n.Must(t, "POST", rpath(p.roomID, "/leave"), alice.Token, map[string]any{})
		leave := p.current()[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomMember, StateKey: alice.UserID}]
		if m, _ := leave.Membership(); m != spec.Leave || string(leave.SenderID()) != alice.UserID {
			t.Fatalf("the peer's member event of alice %s", leave.JSON())
		}
		_, _, body := syncChanged(t, n, alice, since)
		if inv, _ := body["rooms"].(map[string]any)["invite"].(map[string]any)[p.roomID]; inv != nil {
			t.Fatalf("the invite is still in /sync: %v", body["rooms"])
		}
		return
	}
	n.Must(t, "POST", rpath(p.roomID, "/join"), alice.Token, map[string]any{})
	if got := joinedMembers(t, n, alice, p.roomID); !equalStrings(got, sorted([]string{alice.UserID, p.creator})...) {
		t.Fatalf("joined members %v", got)
	}
	if got, want := daemonState(t, n, alice, p.roomID), p.current().ids(); !maps.Equal(got, want) {
		t.Fatalf("the daemon's state\n%v\nthe peer's\n%v", got, want)
	}
}

// expectRejected checks that ev was processed (its /send answer {}, as
// Synapse answers a rejected event) and kept as rejected.
func expectRejected(t *testing.T, n *testutil.Node, res map[string]string, ev gomatrixserverlib.PDU) {
	t.Helper()
	if e, ok := res[ev.EventID()]; !ok || e != "" {
		t.Fatalf("/send answer of %s: %q (in %v), want {}", ev.EventID(), e, res)
	}
	stored, err := n.Store.RoomEventsByID(context.Background(), []string{ev.EventID()})
	if err != nil || len(stored) != 1 || !stored[0].Rejected {
		t.Fatalf("%s is not kept as rejected: %+v %v", ev.EventID(), stored, err)
	}
}
