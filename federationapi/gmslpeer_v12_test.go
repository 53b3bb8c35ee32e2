package federationapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/roomversion"
	"github.com/keyserver/keyserver/storage"
)

// Room version 12 against another implementation's events: a peer built
// on gomatrixserverlib (with the version 12 rules) hosts rooms, joins the
// daemon's rooms and invites its users, as Complement's tests/v12 drive a
// server.

var v12 = roomversion.V12

// peerJoined12 is what a peer's user got joining a daemon's version 12
// room: the join and the send_join answer's events.
type peerJoined12 struct {
	join             gomatrixserverlib.PDU
	state, authChain []gomatrixserverlib.PDU
}

// peerJoinDaemonRoom12 joins a user of the peer to a daemon's version 12
// room as another server does it: make_join offering version 12, the
// join built on the template, v2 send_join.
func peerJoinDaemonRoom12(t *testing.T, p *gmslPeer, n *testutil.Node, userID, roomID string) peerJoined12 {
	t.Helper()
	path := "/_matrix/federation/v1/make_join/" + url.PathEscape(roomID) + "/" + url.PathEscape(userID) + "?ver=" + string(v12)
	r := testutil.SendTo(t, n, p.SignedRequest(t, "GET", n.ServerName, path, nil, "", nil))
	if r.Status != http.StatusOK {
		t.Fatalf("make_join: %d %s", r.Status, r.Raw)
	}
	var tmpl struct {
		RoomVersion string                       `json:"room_version"`
		Event       gomatrixserverlib.ProtoEvent `json:"event"`
	}
	if err := json.Unmarshal(r.Raw, &tmpl); err != nil || tmpl.RoomVersion != string(v12) {
		t.Fatalf("make_join answer %s: %v", r.Raw, err)
	}
	if slices.Contains(refIDs(t, tmpl.Event.AuthEvents), roomversion.CreateEventID(roomID)) {
		t.Fatalf("the join template lists the create event in its auth events: %s", r.Raw)
	}
	join, err := roomversion.Build(v12, &tmpl.Event, time.Now(), spec.ServerName(p.Name), p.KeyID, p.Key)
	if err != nil {
		t.Fatal(err)
	}
	path = "/_matrix/federation/v2/send_join/" + url.PathEscape(roomID) + "/" + url.PathEscape(join.EventID())
	r = testutil.SendTo(t, n, p.SignedRequest(t, "PUT", n.ServerName, path, json.RawMessage(join.JSON()), "", nil))
	if r.Status != http.StatusOK {
		t.Fatalf("send_join: %d %s", r.Status, r.Raw)
	}
	var answer struct {
		State     []json.RawMessage `json:"state"`
		AuthChain []json.RawMessage `json:"auth_chain"`
	}
	if err := json.Unmarshal(r.Raw, &answer); err != nil {
		t.Fatal(err)
	}
	out := peerJoined12{join: join}
	out.state = parse12(t, answer.State)
	out.authChain = parse12(t, answer.AuthChain)
	return out
}

func parse12(t *testing.T, raws []json.RawMessage) []gomatrixserverlib.PDU {
	t.Helper()
	var out []gomatrixserverlib.PDU
	for _, raw := range raws {
		ev, err := gomatrixserverlib.MustGetRoomVersion(v12).NewEventFromUntrustedJSON(raw)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		out = append(out, ev)
	}
	return out
}

// build12 builds an event of the peer's user in a daemon's version 12
// room on the given prev and auth events.
func (p *gmslPeer) build12(t *testing.T, roomID, sender, evType string, stateKey *string, content any, prev []gomatrixserverlib.PDU, auth ...string) gomatrixserverlib.PDU {
	t.Helper()
	raw, err := json.Marshal(content)
	if err != nil {
		t.Fatal(err)
	}
	depth := int64(0)
	for _, ev := range prev {
		depth = max(depth, ev.Depth())
	}
	ev, err := roomversion.Build(v12, &gomatrixserverlib.ProtoEvent{SenderID: sender, RoomID: roomID, Type: evType, StateKey: stateKey,
		Content: raw, PrevEvents: eventIDs(prev), AuthEvents: auth, Depth: depth + 1}, time.Now(), spec.ServerName(p.Name), p.KeyID, p.Key)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// expectNoCreateInAuth fails when an event of a version 12 room lists the
// create event in its auth_events or is of another room.
func expectNoCreateInAuth(t *testing.T, roomID string, evs ...gomatrixserverlib.PDU) {
	t.Helper()
	for _, ev := range evs {
		if slices.Contains(ev.AuthEventIDs(), roomversion.CreateEventID(roomID)) {
			t.Fatalf("%s (%s) lists the create event in its auth events: %s", ev.EventID(), ev.Type(), ev.JSON())
		}
		if ev.RoomID().String() != roomID {
			t.Fatalf("%s is of room %s, not %s", ev.EventID(), ev.RoomID().String(), roomID)
		}
	}
}

// receivedFromDaemon waits for the PDU id at the peer.
func receivedFromDaemon(t *testing.T, p *gmslPeer, id string) gomatrixserverlib.PDU {
	t.Helper()
	var got gomatrixserverlib.PDU
	testutil.Eventually(t, "the event "+id+" at the peer", func() bool {
		for _, ev := range p.receivedPDUs() {
			if ev.EventID() == id {
				got = ev
				return true
			}
		}
		return false
	})
	return got
}

// A daemon's user joins a version 12 room hosted by the peer: the room ID
// is the hash of the peer's create event, the daemon holds the peer's
// state, the peer's messages reach the user and the user's reach the
// peer, and none of the daemon's events lists the create event in its
// auth events. The other way round, the peer joins the daemon's version
// 12 room and finds no event of it listing the create event either
// (Complement's AuthEventsOmitsCreateEvent).
func TestGmslPeerV12Join(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, nil)
		alice := n.Register(t, "alice", "")

		t.Run("the peer's room", func(t *testing.T) {
			p := newGmslPeer(t, v12)
			create := p.current()[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomCreate}]
			if p.roomID != roomversion.RoomIDOfCreate(create.EventID()) || !hashRoomID.MatchString(p.roomID) {
				t.Fatalf("room ID %s, create event %s", p.roomID, create.EventID())
			}
			since := syncToken(t, n, alice)
			joinPeerRoom(t, n, alice, p)
			if got := joinedMembers(t, n, alice, p.roomID); !equalStrings(got, sorted([]string{alice.UserID, p.creator})...) {
				t.Fatalf("joined members %v", got)
			}
			if got, want := daemonState(t, n, alice, p.roomID), p.current().ids(); !maps.Equal(got, want) {
				t.Fatalf("the daemon's state\n%v\nthe peer's\n%v", got, want)
			}
			// The creator, privileged, is in no power level entry: the
			// daemon still lets the creator's state change through.
			empty := ""
			topic := p.add(peerEvent{Sender: p.creator, Type: spec.MRoomTopic, StateKey: &empty, Content: map[string]any{"topic": "v12"}})
			msg := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("from the peer")})
			p.sendEvents(t, n, topic, msg)
			if tl, _ := roomTimeline(t, n, alice, p.roomID, since); !slices.Contains(timelineIDs(tl), msg.EventID()) ||
				!slices.Contains(timelineIDs(tl), topic.EventID()) {
				t.Fatalf("timeline %v lacks %s or %s", timelineIDs(tl), topic.EventID(), msg.EventID())
			}
			if got := daemonState(t, n, alice, p.roomID)["m.room.topic|"]; got != topic.EventID() {
				t.Fatalf("topic %s, want %s", got, topic.EventID())
			}

			_, joins := p.handshakes()
			if len(joins) != 1 || joins[0].Version() != v12 {
				t.Fatalf("joins %v", joins)
			}
			id := n.Must(t, "PUT", rpath(p.roomID, "/send/m.room.message/v12a"), alice.Token, message("to the peer"))["event_id"].(string)
			got := receivedFromDaemon(t, p, id)
			if string(got.SenderID()) != alice.UserID || !slices.Equal(got.PrevEventIDs(), []string{msg.EventID()}) {
				t.Fatalf("received %s", got.JSON())
			}
			if x := p.extremities(); !slices.Equal(x, []string{id}) {
				t.Fatalf("the peer did not take the message into its room: extremities %v", x)
			}
			expectNoCreateInAuth(t, p.roomID, joins[0], got)
		})

		t.Run("the daemon's room", func(t *testing.T) {
			roomID := n.Must(t, "POST", "/_matrix/client/v3/createRoom", alice.Token, map[string]any{
				"preset": "public_chat", "room_version": "12", "name": "on the daemon",
			})["room_id"].(string)
			n.Must(t, "PUT", rpath(roomID, "/send/m.room.message/v12b"), alice.Token, message("before bob"))
			p := newGmslPeer(t, v12)
			res := peerJoinDaemonRoom12(t, p, n, p.user("bob"), roomID)
			var create gomatrixserverlib.PDU
			for _, ev := range res.state {
				if ev.Type() == spec.MRoomCreate {
					create = ev
				}
			}
			if create == nil || roomID != roomversion.RoomIDOfCreate(create.EventID()) {
				t.Fatalf("create event %v of room %s", create, roomID)
			}
			if len(res.state) < 5 {
				t.Fatalf("send_join's state has %d events", len(res.state))
			}
			expectNoCreateInAuth(t, roomID, append(append(slices.Clone(res.state), res.authChain...), res.join)...)
			if members := joinedMembers(t, n, alice, roomID); !equalStrings(members, sorted([]string{alice.UserID, p.user("bob")})...) {
				t.Fatalf("joined members %v", members)
			}
			id := n.Must(t, "PUT", rpath(roomID, "/send/m.room.message/v12c"), alice.Token, message("after bob"))["event_id"].(string)
			expectNoCreateInAuth(t, roomID, receivedFromDaemon(t, p, id))
		})
	})
}

// The room's server answers send_join with a create event that does not
// hash to the room ID: the join fails, the client is told, and nothing
// of the room is kept.
func TestGmslPeerV12JoinWrongCreate(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, nil)
		alice := n.Register(t, "alice", "")
		other := newGmslPeer(t, v12)
		otherCreate := other.current()[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomCreate}]
		for _, tc := range []struct {
			name   string
			create func(p *gmslPeer, create gomatrixserverlib.PDU) json.RawMessage
		}{
			{"the create event of another room", func(*gmslPeer, gomatrixserverlib.PDU) json.RawMessage {
				return otherCreate.JSON()
			}},
			{"the create event altered and signed again", func(p *gmslPeer, create gomatrixserverlib.PDU) json.RawMessage {
				var obj map[string]any
				if err := json.Unmarshal(create.JSON(), &obj); err != nil {
					t.Fatal(err)
				}
				obj["content"].(map[string]any)["m.federate"] = true
				return p.resign(obj)
			}},
			{"the create event altered", func(_ *gmslPeer, create gomatrixserverlib.PDU) json.RawMessage {
				var obj map[string]any
				if err := json.Unmarshal(create.JSON(), &obj); err != nil {
					t.Fatal(err)
				}
				obj["content"].(map[string]any)["m.federate"] = true
				raw, _ := json.Marshal(obj)
				return raw
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				p := newGmslPeer(t, v12)
				create := p.current()[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomCreate}]
				replacement := tc.create(p, create)
				p.changeSendJoin(func(answer map[string]any) {
					for _, key := range []string{"state", "auth_chain"} {
						evs := answer[key].([]json.RawMessage)
						for i, raw := range evs {
							if string(raw) == string(create.JSON()) {
								evs[i] = replacement
							}
						}
					}
				})
				path := "/_matrix/client/v3/join/" + url.PathEscape(p.roomID) + "?server_name=" + url.QueryEscape(p.Name)
				r := n.Do(t, "POST", path, alice.Token, map[string]any{})
				t.Logf("join: %d %s", r.Status, r.Raw)
				if r.Status == http.StatusOK || r.Status >= 500 && r.Status != http.StatusBadGateway || r.Errcode() == "" {
					t.Fatalf("join: %d %s", r.Status, r.Raw)
				}
				if p.served("send_join") != 1 {
					t.Fatalf("send_join served %d times", p.served("send_join"))
				}
				if _, err := n.Store.Room(context.Background(), p.roomID); !errors.Is(err, storage.ErrNotFound) {
					t.Fatalf("the room is stored: %v", err)
				}
				if stored, err := n.Store.RoomEventsByID(context.Background(), eventIDs(p.current().list())); err != nil || len(stored) != 0 {
					t.Fatalf("events of the room are stored: %d %v", len(stored), err)
				}
				rooms := n.Must(t, "GET", "/_matrix/client/v3/joined_rooms", alice.Token, nil)["joined_rooms"].([]any)
				if slices.Contains(rooms, any(p.roomID)) {
					t.Fatalf("joined rooms %v", rooms)
				}
				// The same room answered whole is joined: the failure was
				// the create event.
				p.changeSendJoin(nil)
				testutil.Eventually(t, "a join once the answer is right", func() bool {
					return n.Do(t, "POST", path, alice.Token, map[string]any{}).Status == http.StatusOK
				})
			})
		}
	})
}

// expectNotShown checks that an event the peer sent is not shown to
// clients and, when kept, is kept as rejected.
func expectNotShown(t *testing.T, n *testutil.Node, u *testutil.User, roomID, since string, ev gomatrixserverlib.PDU) {
	t.Helper()
	if s := eventStatus(t, n, u, roomID, ev.EventID()); s != http.StatusNotFound {
		t.Fatalf("GET /event of %s: %d", ev.EventID(), s)
	}
	if tl, _ := roomTimeline(t, n, u, roomID, since); slices.Contains(timelineIDs(tl), ev.EventID()) {
		t.Fatalf("%s is in the timeline %v", ev.EventID(), timelineIDs(tl))
	}
	stored, err := n.Store.RoomEventsByID(context.Background(), []string{ev.EventID()})
	if err != nil || len(stored) > 1 || len(stored) == 1 && !stored[0].Rejected {
		t.Fatalf("%s is kept as accepted: %+v %v", ev.EventID(), stored, err)
	}
}

// PDUs of a version 12 room whose auth events break rule 3: the create
// event listed, or an auth event of another room. Each is rejected and
// never shown; the same message with right auth events goes through.
func TestGmslPeerV12AuthEvents(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, nil)
		alice := n.Register(t, "alice", "")
		p := joinedPeer(t, n, alice, v12)
		other := n.Must(t, "POST", "/_matrix/client/v3/createRoom", alice.Token, map[string]any{
			"preset": "public_chat", "room_version": "12",
		})["room_id"].(string)
		otherPL := daemonState(t, n, alice, other)["m.room.power_levels|"]
		state := p.current()
		member := state[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomMember, StateKey: p.creator}].EventID()
		pl := state[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomPowerLevels}].EventID()
		create := state[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomCreate}].EventID()
		if ok := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("right"), Detached: true}); !slices.Equal(sorted(ok.AuthEventIDs()), sorted([]string{member, pl})) {
			t.Fatalf("the peer's auth events %v, want %v", ok.AuthEventIDs(), []string{member, pl})
		}
		for _, tc := range []struct {
			name string
			auth []string
		}{
			{"the create event listed", []string{create, pl, member}},
			{"the power levels of another room", []string{otherPL, member}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				since := syncToken(t, n, alice)
				bad := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message(tc.name), Auth: tc.auth, Unchecked: true, Detached: true})
				res := p.send(t, n, rawEvents(bad)...)
				t.Logf("/send: %v", res)
				if _, ok := res[bad.EventID()]; !ok {
					t.Fatalf("/send answer %v lacks %s", res, bad.EventID())
				}
				expectNotShown(t, n, alice, p.roomID, since, bad)
				// Built on the same prev events with the right auth
				// events, the message is taken.
				good := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("good " + tc.name), Prev: bad.PrevEventIDs(), Detached: true})
				p.sendEvents(t, n, good)
				if tl, _ := roomTimeline(t, n, alice, p.roomID, since); !slices.Contains(timelineIDs(tl), good.EventID()) {
					t.Fatalf("timeline %v lacks %s", timelineIDs(tl), good.EventID())
				}
			})
		}
	})
}
