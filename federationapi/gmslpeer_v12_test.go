package federationapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
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

			// Alice leaves: the leave reaches the peer, which takes it
			// with the rules of version 12.
			n.Must(t, "POST", rpath(p.roomID, "/leave"), alice.Token, map[string]any{})
			var leave gomatrixserverlib.PDU
			testutil.Eventually(t, "alice's leave in the peer's room", func() bool {
				leave = p.current()[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomMember, StateKey: alice.UserID}]
				m, _ := leave.Membership()
				return m == spec.Leave
			})
			expectNoCreateInAuth(t, p.roomID, leave)
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

// stateEvent finds the event of a key among evs.
func stateEvent(t *testing.T, evs []gomatrixserverlib.PDU, evType, stateKey string) gomatrixserverlib.PDU {
	t.Helper()
	for _, ev := range evs {
		if ev.Type() == evType && ev.StateKeyEquals(stateKey) {
			return ev
		}
	}
	t.Fatalf("no %s %q among %d events", evType, stateKey, len(evs))
	return nil
}

// putState sets a state event on n and returns its ID.
func putState(t *testing.T, n *testutil.Node, u *testutil.User, roomID, evType string, content map[string]any) string {
	t.Helper()
	return n.Must(t, "PUT", rpath(roomID, "/state/"+evType+"/"), u.Token, content)["event_id"].(string)
}

// joinRule is the join rule of a room on n, as u sees it.
func joinRule(t *testing.T, n *testutil.Node, u *testutil.User, roomID string) any {
	t.Helper()
	r := n.Do(t, "GET", rpath(roomID, "/state/m.room.join_rules/"), u.Token, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("join rules: %d %s", r.Status, r.Raw)
	}
	return r.Body["join_rule"]
}

// MSC4289: a user of the peer with a power level above 100 changes the
// join rule at the same time as the room's creator, who is in no power
// level entry. State resolution orders the creator's event first, as the
// most powerful, so the other user's, applied after it, wins
// (Complement's "admin with >PL100 sorts after the room creator for state
// resolution"). Were the creator taken at level 100, the order would be
// the other way round, and the creator's invite rule would win.
func TestGmslPeerV12CreatorSortsFirst(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, nil)
		alice := n.Register(t, "alice", "")
		roomID := n.Must(t, "POST", "/_matrix/client/v3/createRoom", alice.Token, map[string]any{
			"preset": "public_chat", "room_version": "12",
		})["room_id"].(string)
		p := newGmslPeer(t, v12)
		bob := p.user("bob")
		joined := peerJoinDaemonRoom12(t, p, n, bob, roomID)
		plID := putState(t, n, alice, roomID, spec.MRoomPowerLevels, map[string]any{"users": map[string]any{bob: 9493420}})
		pl := receivedFromDaemon(t, p, plID)

		since := syncToken(t, n, alice)
		aliceJR := putState(t, n, alice, roomID, spec.MRoomJoinRules, map[string]any{"join_rule": spec.Invite})
		empty := ""
		bobJR := p.build12(t, roomID, bob, spec.MRoomJoinRules, &empty, map[string]any{"join_rule": spec.Knock},
			[]gomatrixserverlib.PDU{pl}, plID, joined.join.EventID())
		p.sendEvents(t, n, bobJR)
		tl, _ := roomTimeline(t, n, alice, roomID, since)
		if ids := timelineIDs(tl); !slices.Contains(ids, bobJR.EventID()) || !slices.Contains(ids, aliceJR) {
			t.Fatalf("timeline %v, want %s and %s", ids, aliceJR, bobJR.EventID())
		}
		if got := joinRule(t, n, alice, roomID); got != spec.Knock {
			t.Fatalf("join rule %v, want knock", got)
		}
		if got := daemonState(t, n, alice, roomID)["m.room.join_rules|"]; got != bobJR.EventID() {
			t.Fatalf("join rules event %s, want %s", got, bobJR.EventID())
		}
	})
}

// gapOfMemberEvents builds count member events of user (display name
// changes) in a chain from prev, each authorised by auth and the one
// before, held by the peer for the daemon's /event and
// /get_missing_events; it returns them and their positions.
func gapOfMemberEvents(t *testing.T, p *gmslPeer, roomID, user string, count int, prev, member gomatrixserverlib.PDU, auth ...string) ([]gomatrixserverlib.PDU, map[string]int) {
	t.Helper()
	evs := make([]gomatrixserverlib.PDU, count)
	index := map[string]int{}
	for i := range evs {
		evs[i] = p.build12(t, roomID, user, spec.MRoomMember, &user,
			map[string]any{"membership": spec.Join, "displayname": user + " " + string(rune('A'+i%26)) + strconv.Itoa(i)},
			[]gomatrixserverlib.PDU{prev}, append(slices.Clone(auth), member.EventID())...)
		index[evs[i].EventID()] = i
		prev, member = evs[i], evs[i]
	}
	p.hold(evs...)
	return evs, index
}

// MSC4297, state resolution v2.1 starts from the empty set: a user of
// the peer sends the last of 30 events the daemon misses; after
// /get_missing_events the daemon asks /state_ids, answered with a join
// rule (public) older than the room's (invite, set before its creator
// left). Resolving that state with the daemon's replays the join rules on
// their own auth events, so the room stays invite-only; v2 would replay
// them on the creator having left and lose the join rule.
func TestGmslPeerV12StateResStartsFromEmpty(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, nil)
		alice := n.Register(t, "alice", "")
		bob := n.Register(t, "bob", "")
		roomID := n.Must(t, "POST", "/_matrix/client/v3/createRoom", alice.Token, map[string]any{
			"preset": "public_chat", "room_version": "12",
		})["room_id"].(string)
		n.Must(t, "POST", rpath(roomID, "/join"), bob.Token, map[string]any{})
		p := newGmslPeer(t, v12)
		charlie := p.user("charlie")
		joined := peerJoinDaemonRoom12(t, p, n, charlie, roomID)
		all := append(slices.Clone(joined.state), joined.authChain...)
		jrPublic := stateEvent(t, joined.state, spec.MRoomJoinRules, "")
		aliceJoin := stateEvent(t, all, spec.MRoomMember, alice.UserID)
		bobJoin := stateEvent(t, joined.state, spec.MRoomMember, bob.UserID)
		create := stateEvent(t, joined.state, spec.MRoomCreate, "")
		pl := stateEvent(t, joined.state, spec.MRoomPowerLevels, "")
		msg := n.Must(t, "PUT", rpath(roomID, "/send/m.room.message/sync1"), bob.Token, message("can you hear me charlie?"))["event_id"].(string)
		receivedFromDaemon(t, p, msg)

		jrInvite := putState(t, n, alice, roomID, spec.MRoomJoinRules, map[string]any{"join_rule": spec.Invite})
		receivedFromDaemon(t, p, jrInvite)
		n.Must(t, "POST", rpath(roomID, "/leave"), alice.Token, map[string]any{})
		aliceLeave := receivedFromDaemon(t, p, daemonState(t, n, bob, roomID)["m.room.member|"+alice.UserID])
		if m, _ := aliceLeave.Membership(); m != spec.Leave {
			t.Fatalf("alice's member event %s", aliceLeave.JSON())
		}

		evs, index := gapOfMemberEvents(t, p, roomID, charlie, 30, aliceLeave, joined.join, pl.EventID(), jrInvite)
		p.answerState(func(rid, eventID string) ([]gomatrixserverlib.PDU, []gomatrixserverlib.PDU, bool) {
			i, ok := index[eventID]
			if rid != roomID || !ok || i == 0 {
				return nil, nil, false
			}
			// The join rule is wrong: public, where it is invite.
			state := []gomatrixserverlib.PDU{evs[i-1], create, pl, bobJoin, jrPublic, aliceLeave}
			return state, append(slices.Clone(evs[:i-1]), aliceJoin), true
		})
		last := evs[len(evs)-1]
		p.sendEvents(t, n, last)
		if p.served("state_ids")+p.served("state") == 0 {
			t.Fatal("the daemon asked neither /state_ids nor /state")
		}
		if s := eventStatus(t, n, bob, roomID, last.EventID()); s != http.StatusOK {
			t.Fatalf("the last event: %d", s)
		}
		if got := joinRule(t, n, bob, roomID); got != spec.Invite {
			t.Fatalf("join rule %v, want invite", got)
		}
	})
}

// MSC4297, state resolution v2.1 includes the conflicted subgraph: the
// power levels go from the creator's (alice at 100) to alice's (bob at
// 50) to bob's (charlie at 50); a user of the peer joins on the last and
// sends the last of 30 events the daemon misses, and /state_ids answers
// with the first power levels. The events between the conflicted power
// levels are replayed too, so the last power levels stay; v2 would go
// back to the first.
func TestGmslPeerV12StateResConflictedSubgraph(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, nil)
		creator := n.Register(t, "creator", "")
		alice := n.Register(t, "alice", "")
		bob := n.Register(t, "bob", "")
		zara := n.Register(t, "zara", "")
		roomID := n.Must(t, "POST", "/_matrix/client/v3/createRoom", creator.Token, map[string]any{
			"preset": "public_chat", "room_version": "12",
		})["room_id"].(string)
		putState(t, n, creator, roomID, spec.MRoomPowerLevels, map[string]any{"users": map[string]any{alice.UserID: 100}})
		n.Must(t, "POST", rpath(roomID, "/join"), alice.Token, map[string]any{})
		n.Must(t, "POST", rpath(roomID, "/join"), bob.Token, map[string]any{})
		p := newGmslPeer(t, v12)
		charlie, eve := p.user("charlie"), p.user("eve")
		joined := peerJoinDaemonRoom12(t, p, n, charlie, roomID)
		firstPL := stateEvent(t, joined.state, spec.MRoomPowerLevels, "")
		create := stateEvent(t, joined.state, spec.MRoomCreate, "")
		jr := stateEvent(t, joined.state, spec.MRoomJoinRules, "")
		aliceJoin := stateEvent(t, joined.state, spec.MRoomMember, alice.UserID)
		bobJoin := stateEvent(t, joined.state, spec.MRoomMember, bob.UserID)
		putState(t, n, alice, roomID, spec.MRoomPowerLevels, map[string]any{"users": map[string]any{alice.UserID: 100, bob.UserID: 50}})
		pl3ID := putState(t, n, bob, roomID, spec.MRoomPowerLevels, map[string]any{"users": map[string]any{alice.UserID: 100, bob.UserID: 50, charlie: 50}})
		pl3 := receivedFromDaemon(t, p, pl3ID)
		n.Must(t, "POST", rpath(roomID, "/join"), zara.Token, map[string]any{})

		// Eve joins on the third power levels, beside zara's join.
		eveJoin := p.build12(t, roomID, eve, spec.MRoomMember, &eve, map[string]any{"membership": spec.Join},
			[]gomatrixserverlib.PDU{pl3}, pl3ID, jr.EventID())
		p.hold(eveJoin)
		since := syncToken(t, n, alice)
		p.sendEvents(t, n, eveJoin)
		if tl, _ := roomTimeline(t, n, alice, roomID, since); !slices.Contains(timelineIDs(tl), eveJoin.EventID()) {
			t.Fatalf("timeline %v lacks eve's join", timelineIDs(tl))
		}

		evs, index := gapOfMemberEvents(t, p, roomID, eve, 30, eveJoin, eveJoin, pl3ID, jr.EventID())
		p.answerState(func(rid, eventID string) ([]gomatrixserverlib.PDU, []gomatrixserverlib.PDU, bool) {
			i, ok := index[eventID]
			if rid != roomID || !ok || i == 0 {
				return nil, nil, false
			}
			// The power levels are wrong: the first, where they are the third.
			state := []gomatrixserverlib.PDU{evs[i-1], create, aliceJoin, firstPL, jr, bobJoin, joined.join}
			return state, append(slices.Clone(evs[:i-1]), eveJoin), true
		})
		last := evs[len(evs)-1]
		p.sendEvents(t, n, last)
		if p.served("state_ids")+p.served("state") == 0 {
			t.Fatal("the daemon asked neither /state_ids nor /state")
		}
		if s := eventStatus(t, n, alice, roomID, last.EventID()); s != http.StatusOK {
			t.Fatalf("the last event: %d", s)
		}
		content := n.Must(t, "GET", rpath(roomID, "/state/m.room.power_levels/"), alice.Token, nil)
		users, _ := content["users"].(map[string]any)
		if users[alice.UserID] != float64(100) || users[bob.UserID] != float64(50) || users[charlie] != float64(50) {
			t.Fatalf("power levels users %v, want the third power levels'", users)
		}
	})
}

// inviteTo12 sends the peer's invite of a daemon's user to n (v2
// /invite) with the given invite_room_state.
func inviteTo12(t *testing.T, p *gmslPeer, n *testutil.Node, invite gomatrixserverlib.PDU, roomState []any) testutil.Response {
	t.Helper()
	path := "/_matrix/federation/v2/invite/" + url.PathEscape(p.roomID) + "/" + url.PathEscape(invite.EventID())
	return testutil.SendTo(t, n, p.SignedRequest(t, "PUT", n.ServerName, path, map[string]any{
		"room_version": v12, "event": json.RawMessage(invite.JSON()), "invite_room_state": roomState}, "", nil))
}

// inviteState is the invite_state of a room in u's /sync (nil: not
// invited).
func inviteState(t *testing.T, n *testutil.Node, u *testutil.User, roomID string) []any {
	t.Helper()
	r := n.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0", u.Token, nil)
	rooms, _ := r["rooms"].(map[string]any)
	inv, _ := rooms["invite"].(map[string]any)
	room, _ := inv[roomID].(map[string]any)
	if room == nil {
		return nil
	}
	st, _ := room["invite_state"].(map[string]any)
	return asList(st["events"])
}

// MSC4311: the peer invites a daemon's user to a version 12 room. Its
// invite_room_state must hold the room's create event whole, signed, and
// only PDUs of the room: otherwise the invite is refused with 400
// M_MISSING_PARAM and nothing is kept. With the create event, the
// invitee's /sync shows it with its timestamp and room ID, and the
// invitee joins through the inviter's server.
func TestGmslPeerV12Invite(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, nil)
		other := newGmslPeer(t, v12)
		otherCreate := other.current()[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomCreate}]
		edit := func(ev gomatrixserverlib.PDU, f func(obj map[string]any)) json.RawMessage {
			var obj map[string]any
			if err := json.Unmarshal(ev.JSON(), &obj); err != nil {
				t.Fatal(err)
			}
			f(obj)
			raw, _ := json.Marshal(obj)
			return raw
		}
		for i, tc := range []struct {
			name      string
			roomState func(p *gmslPeer, create, jr gomatrixserverlib.PDU) []any
		}{
			{"without the create event", func(_ *gmslPeer, _, jr gomatrixserverlib.PDU) []any {
				return []any{json.RawMessage(jr.JSON())}
			}},
			{"stripped state, not PDUs", func(_ *gmslPeer, create, jr gomatrixserverlib.PDU) []any {
				return []any{gomatrixserverlib.NewInviteStrippedState(create), gomatrixserverlib.NewInviteStrippedState(jr)}
			}},
			{"the create event whole beside a stripped entry", func(_ *gmslPeer, create, jr gomatrixserverlib.PDU) []any {
				return []any{json.RawMessage(create.JSON()), gomatrixserverlib.NewInviteStrippedState(jr)}
			}},
			{"the create event of another room", func(_ *gmslPeer, _, jr gomatrixserverlib.PDU) []any {
				return []any{json.RawMessage(otherCreate.JSON()), json.RawMessage(jr.JSON())}
			}},
			{"the create event unsigned", func(_ *gmslPeer, create, jr gomatrixserverlib.PDU) []any {
				return []any{edit(create, func(obj map[string]any) { delete(obj, "signatures") }), json.RawMessage(jr.JSON())}
			}},
			{"the create event altered", func(_ *gmslPeer, create, jr gomatrixserverlib.PDU) []any {
				return []any{edit(create, func(obj map[string]any) { obj["content"].(map[string]any)["m.federate"] = false }), json.RawMessage(jr.JSON())}
			}},
			{"the create event altered and signed again", func(p *gmslPeer, create, jr gomatrixserverlib.PDU) []any {
				var obj map[string]any
				_ = json.Unmarshal(create.JSON(), &obj)
				obj["content"].(map[string]any)["m.federate"] = false
				return []any{p.resign(obj), json.RawMessage(jr.JSON())}
			}},
			{"an event whose signature does not hold", func(p *gmslPeer, create, _ gomatrixserverlib.PDU) []any {
				jr := edit(other.current()[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomJoinRules}], func(obj map[string]any) {
					obj["room_id"] = p.roomID
				})
				return []any{json.RawMessage(create.JSON()), jr}
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				alice := n.Register(t, "alice"+strconv.Itoa(i), "")
				p := newGmslPeer(t, v12)
				invite := p.add(peerEvent{Sender: p.creator, Type: spec.MRoomMember, StateKey: &alice.UserID, Content: map[string]any{"membership": spec.Invite}})
				state := p.current()
				create := state[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomCreate}]
				jr := state[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomJoinRules}]
				r := inviteTo12(t, p, n, invite, tc.roomState(p, create, jr))
				if r.Status != http.StatusBadRequest || r.Errcode() != "M_MISSING_PARAM" {
					t.Fatalf("invite: %d %s", r.Status, r.Raw)
				}
				if _, err := n.Store.Room(context.Background(), p.roomID); !errors.Is(err, storage.ErrNotFound) {
					t.Fatalf("the room is stored: %v", err)
				}
				if stored, err := n.Store.RoomEventsByID(context.Background(), []string{invite.EventID()}); err != nil || len(stored) != 0 {
					t.Fatalf("the invite is stored: %+v %v", stored, err)
				}
				if st := inviteState(t, n, alice, p.roomID); st != nil {
					t.Fatalf("invited: %v", st)
				}
			})
		}

		t.Run("the create event whole", func(t *testing.T) {
			alice := n.Register(t, "alice", "")
			p := newGmslPeer(t, v12)
			invite := p.add(peerEvent{Sender: p.creator, Type: spec.MRoomMember, StateKey: &alice.UserID, Content: map[string]any{"membership": spec.Invite}})
			state := p.current()
			create := state[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomCreate}]
			jr := state[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomJoinRules}]
			r := inviteTo12(t, p, n, invite, []any{json.RawMessage(create.JSON()), json.RawMessage(jr.JSON())})
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
			found := false
			for _, e := range inviteState(t, n, alice, p.roomID) {
				ev, _ := e.(map[string]any)
				if ev["type"] != spec.MRoomCreate {
					continue
				}
				found = true
				if ev["origin_server_ts"] != float64(create.OriginServerTS()) || ev["room_id"] != p.roomID ||
					ev["sender"] != p.creator || ev["event_id"] != create.EventID() {
					t.Fatalf("the create event in invite_state: %v", ev)
				}
			}
			if !found {
				t.Fatalf("no create event in invite_state %v", inviteState(t, n, alice, p.roomID))
			}
			n.Must(t, "POST", rpath(p.roomID, "/join"), alice.Token, map[string]any{})
			if got, want := daemonState(t, n, alice, p.roomID), p.current().ids(); !maps.Equal(got, want) {
				t.Fatalf("the daemon's state\n%v\nthe peer's\n%v", got, want)
			}
		})

		t.Run("the create event whole, rejected", func(t *testing.T) {
			alice := n.Register(t, "alicerejects", "")
			p := newGmslPeer(t, v12)
			invite := p.add(peerEvent{Sender: p.creator, Type: spec.MRoomMember, StateKey: &alice.UserID, Content: map[string]any{"membership": spec.Invite}})
			create := p.current()[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomCreate}]
			r := inviteTo12(t, p, n, invite, []any{json.RawMessage(create.JSON())})
			if r.Status != http.StatusOK {
				t.Fatalf("invite: %d %s", r.Status, r.Raw)
			}
			raw, _ := json.Marshal(r.Body["event"])
			signed, err := p.impl.NewEventFromUntrustedJSON(raw)
			if err != nil {
				t.Fatal(err)
			}
			p.replace(signed)
			// Rejected through the inviter's server: make_leave, send_leave.
			n.Must(t, "POST", rpath(p.roomID, "/leave"), alice.Token, map[string]any{})
			leave := p.current()[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomMember, StateKey: alice.UserID}]
			if m, _ := leave.Membership(); m != spec.Leave || string(leave.SenderID()) != alice.UserID || p.served("make_leave") != 1 {
				t.Fatalf("the peer's member event of alice %s (make_leave served %d times)", leave.JSON(), p.served("make_leave"))
			}
			expectNoCreateInAuth(t, p.roomID, leave)
			if st := inviteState(t, n, alice, p.roomID); st != nil {
				t.Fatalf("still invited: %v", st)
			}
		})
	})
}
