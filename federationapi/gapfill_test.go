package federationapi_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"database/sql"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/testutil"
)

// gapPair is alice's room on A (SQLite, so the test can reach into its
// queue) joined by bob on B (the database under test).
type gapPair struct {
	a, b       *testutil.Node
	dbA        testutil.Database
	alice, bob *testutil.User
	roomID     string
}

func newGapPair(t *testing.T, db testutil.Database) *gapPair {
	g := &gapPair{dbA: testutil.SQLite(t)}
	g.a, g.b = testutil.StartNode(t, g.dbA, nil), testutil.StartNode(t, db, nil)
	g.alice, g.bob = g.a.Register(t, "alice", ""), g.b.Register(t, "bob", "")
	g.roomID = g.a.Must(t, "POST", "/_matrix/client/v3/createRoom", g.alice.Token, map[string]any{"preset": "public_chat"})["room_id"].(string)
	g.b.Must(t, "POST", "/_matrix/client/v3/join/"+url.PathEscape(g.roomID)+"?server_name="+url.QueryEscape(g.a.ServerName), g.bob.Token, map[string]any{})
	return g
}

// missed has alice send what B never receives: B is down while A sends,
// and A's queue for B is emptied before B is back. It returns the events'
// IDs.
func (g *gapPair) missed(t *testing.T, send func(i int) string, n int) []string {
	t.Helper()
	g.b.Stop()
	var ids []string
	for i := range n {
		ids = append(ids, send(i))
	}
	g.a.Stop()
	sqlDB, err := sql.Open("sqlite3", g.dbA.URI)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sqlDB.Exec(`DELETE FROM outbound_pdus WHERE destination = $1`, g.b.ServerName); err != nil {
		t.Fatal(err)
	}
	sqlDB.Close()
	g.a.Restart()
	g.b.Restart()
	return ids
}

func (g *gapPair) say(t *testing.T, body string) string {
	t.Helper()
	return g.a.Must(t, "PUT", rpath(g.roomID, "/send/m.room.message/"+url.PathEscape(body)), g.alice.Token, message(body))["event_id"].(string)
}

// bobSees waits until B's /sync since since has the event last in the
// room's timeline, and returns the timeline.
func (g *gapPair) bobSees(t *testing.T, since, last string) []string {
	t.Helper()
	var ids []string
	eventually(t, "B to have "+last, func() bool {
		tl, _ := roomTimeline(t, g.b, g.bob, g.roomID, since)
		ids = timelineIDs(tl)
		return slices.Contains(ids, last)
	})
	return ids
}

// Two daemons: B missed some of A's events; the next one brings them
// with get_missing_events (no state fetched), and all reach B's /sync in
// order.
func TestGapFilledBetweenDaemons(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		g := newGapPair(t, db)
		since := syncToken(t, g.b, g.bob)
		lost := g.missed(t, func(i int) string { return g.say(t, fmt.Sprint("lost ", i)) }, 3)
		gmeBefore := g.a.Requests.Count("POST", "/_matrix/federation/v1/get_missing_events/")
		next := g.say(t, "next")
		if got, want := g.bobSees(t, since, next), append(lost, next); !slices.Equal(got, want) {
			t.Fatalf("B's timeline %v, want %v", got, want)
		}
		if n := g.a.Requests.Count("POST", "/_matrix/federation/v1/get_missing_events/") - gmeBefore; n != 1 {
			t.Fatalf("A served %d get_missing_events", n)
		}
		if n := g.a.Requests.Count("GET", "/_matrix/federation/v1/state_ids/"); n != 0 {
			t.Fatalf("A served %d state_ids", n)
		}
	})
}

// More missed than one get_missing_events brings (10, as Synapse asks):
// the newest ten come with it, the oldest of them placed on the state A
// gives (/state_ids), so a topic set in the part never fetched reaches
// B's state; the events never fetched are not in B's timeline.
func TestGapLongerThanMissingEventsBetweenDaemons(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		g := newGapPair(t, db)
		since := syncToken(t, g.b, g.bob)
		lost := g.missed(t, func(i int) string {
			if i == 0 {
				return g.a.Must(t, "PUT", rpath(g.roomID, "/state/m.room.topic/"), g.alice.Token, map[string]any{"topic": "missed"})["event_id"].(string)
			}
			return g.say(t, fmt.Sprint("lost ", i))
		}, 15)
		next := g.say(t, "next")
		got := g.bobSees(t, since, next)
		if want := append(slices.Clone(lost[5:]), next); !slices.Equal(got, want) {
			t.Fatalf("B's timeline %v, want the newest ten and the new one %v", got, want)
		}
		if n := g.a.Requests.Count("GET", "/_matrix/federation/v1/state_ids/"); n != 1 {
			t.Fatalf("A served %d state_ids", n)
		}
		state := daemonState(t, g.b, g.bob, g.roomID)
		if state["m.room.topic|"] != lost[0] {
			t.Fatalf("B's topic %q, want %s", state["m.room.topic|"], lost[0])
		}
	})
}

// A gap get_missing_events does not fill, crossed with the state the
// sender gives: when the daemon misses a tenth or more of the events
// /state_ids names, they come in one /state; fewer come one by one with
// /event. Either way the daemon's state is the peer's, and the event
// reaches /sync.
func TestGmslPeerGapCrossedWithState(t *testing.T) {
	forEachPeerVersion(t, func(t *testing.T, n *testutil.Node, v gomatrixserverlib.RoomVersion) {
		alice := n.Register(t, "alice"+string(v), "")
		empty := ""
		join := func(p *gmslPeer, name string) gomatrixserverlib.PDU {
			u := p.user(name)
			return p.add(peerEvent{Sender: u, Type: spec.MRoomMember, StateKey: &u, Content: map[string]any{"membership": spec.Join}})
		}
		cross := func(t *testing.T, p *gmslPeer) {
			t.Helper()
			since := syncToken(t, n, alice)
			msg := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("across")})
			p.sendEvents(t, n, msg)
			if p.served("get_missing_events") != 1 || p.served("state_ids") != 1 {
				t.Fatalf("get_missing_events %d, state_ids %d", p.served("get_missing_events"), p.served("state_ids"))
			}
			if tl, _ := roomTimeline(t, n, alice, p.roomID, since); !slices.Equal(timelineIDs(tl), []string{msg.EventID()}) {
				t.Fatalf("timeline %v, want only %s", timelineIDs(tl), msg.EventID())
			}
			if got, want := daemonState(t, n, alice, p.roomID), p.current().ids(); !maps.Equal(got, want) {
				t.Fatalf("the daemon's state\n%v\nthe peer's\n%v", got, want)
			}
		}
		t.Run("many missing: /state", func(t *testing.T) {
			p := joinedPeer(t, n, alice, v)
			p.answerNoMissingEvents()
			for i := range 6 {
				join(p, fmt.Sprint("carol", i))
			}
			p.add(peerEvent{Sender: p.creator, Type: spec.MRoomTopic, StateKey: &empty, Content: map[string]any{"topic": "missed"}})
			cross(t, p)
			if p.served("state") != 1 || p.served("event") != 0 {
				t.Fatalf("state %d, event %d", p.served("state"), p.served("event"))
			}
		})
		t.Run("few missing: /event", func(t *testing.T) {
			p := joinedPeer(t, n, alice, v)
			var known []gomatrixserverlib.PDU
			for i := range 12 {
				known = append(known, join(p, fmt.Sprint("dave", i)))
			}
			p.sendEvents(t, n, known...)
			p.answerNoMissingEvents()
			p.add(peerEvent{Sender: p.creator, Type: spec.MRoomTopic, StateKey: &empty, Content: map[string]any{"topic": "missed"}})
			cross(t, p)
			if p.served("state") != 0 || p.served("event") != 1 {
				t.Fatalf("state %d, event %d", p.served("state"), p.served("event"))
			}
		})
	})
}

// A server answering get_missing_events newest first, with events slipped
// in (badly signed, of another room, failing the auth rules): the missing
// events are taken all the same, oldest first, with no state fetched; the
// forged event and the other room's are not kept, the one the auth rules
// refuse is kept as rejected, and none reaches /sync.
func TestGmslPeerMisbehavingMissingEvents(t *testing.T) {
	forEachPeerVersion(t, func(t *testing.T, n *testutil.Node, v gomatrixserverlib.RoomVersion) {
		alice := n.Register(t, "alice"+string(v), "")
		p := joinedPeer(t, n, alice, v)
		other := newGmslPeer(t, v)
		_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
		forged := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("forged"), Key: otherKey, Detached: true})
		mallory := p.add(peerEvent{Sender: p.user("mallory"), Type: "m.room.message", Content: message("let me in"),
			Unchecked: true, Detached: true})
		elsewhere := other.add(peerEvent{Sender: other.creator, Type: "m.room.message", Content: message("elsewhere")})
		p.mu.Lock()
		p.missingNewestFirst = true
		p.missingExtra = rawEvents(forged, mallory, elsewhere)
		p.mu.Unlock()
		since := syncToken(t, n, alice)
		var msgs []gomatrixserverlib.PDU
		for _, body := range []string{"one", "two", "three", "four"} {
			msgs = append(msgs, p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message(body)}))
		}
		p.sendEvents(t, n, msgs[3])
		if tl, _ := roomTimeline(t, n, alice, p.roomID, since); !slices.Equal(timelineIDs(tl), eventIDs(msgs)) {
			t.Fatalf("timeline %v, want %v", timelineIDs(tl), eventIDs(msgs))
		}
		if p.served("get_missing_events") != 1 || p.served("state_ids") != 0 {
			t.Fatalf("get_missing_events %d, state_ids %d", p.served("get_missing_events"), p.served("state_ids"))
		}
		stored, err := n.Store.RoomEventsByID(context.Background(), []string{forged.EventID(), mallory.EventID(), elsewhere.EventID()})
		if err != nil {
			t.Fatal(err)
		}
		if len(stored) != 1 || stored[0].EventID != mallory.EventID() || !stored[0].Rejected {
			t.Fatalf("stored %+v, want the non-member's message only, rejected", stored)
		}
	})
}
