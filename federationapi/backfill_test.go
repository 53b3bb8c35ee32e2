package federationapi_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/keyserver/keyserver/internal/testutil"
)

// messagesPage is one page of /messages backwards: its events' IDs and
// its end token ("" when the answer has none).
func messagesPage(t *testing.T, n *testutil.Node, u *testutil.User, roomID, from string, limit int) ([]string, string) {
	t.Helper()
	q := url.Values{"dir": {"b"}, "limit": {fmt.Sprint(limit)}}
	if from != "" {
		q.Set("from", from)
	}
	r := n.Do(t, "GET", rpath(roomID, "/messages?"+q.Encode()), u.Token, nil)
	if r.Status != 200 {
		t.Fatalf("/messages: %d %s", r.Status, r.Raw)
	}
	var body struct {
		Chunk []struct {
			EventID string `json:"event_id"`
			Type    string `json:"type"`
			RoomID  string `json:"room_id"`
		} `json:"chunk"`
		End *string `json:"end"`
	}
	if err := json.Unmarshal(r.Raw, &body); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, ev := range body.Chunk {
		if ev.RoomID != roomID || ev.Type == "" {
			t.Fatalf("an event not in client format: %s", r.Raw)
		}
		ids = append(ids, ev.EventID)
	}
	end := ""
	if body.End != nil {
		if *body.End == "" {
			t.Fatalf("an empty end token: %s", r.Raw)
		}
		end = *body.End
	}
	return ids, end
}

// pageBack pages /messages back from the room's newest event until an
// answer has no end token, and returns the events newest first and the
// size of each page.
func pageBack(t *testing.T, n *testutil.Node, u *testutil.User, roomID string, limit int) ([]string, []int) {
	t.Helper()
	var all []string
	var sizes []int
	from := ""
	for range 100 {
		ids, end := messagesPage(t, n, u, roomID, from, limit)
		all, sizes = append(all, ids...), append(sizes, len(ids))
		if end == "" {
			return all, sizes
		}
		from = end
	}
	t.Fatalf("/messages never ended: %d events in pages %v", len(all), sizes)
	return nil, nil
}

// The room's history from before the join is asked of the room's server
// (a gomatrixserverlib server) when the client pages back past the join:
// /messages returns it all, newest first, a page of the limit at a time,
// down to the room's create event, where the end token stops. It is
// fetched once, and never reaches /sync.
func TestBackfillFromPeer(t *testing.T) {
	forEachPeerVersion(t, func(t *testing.T, n *testutil.Node, v gomatrixserverlib.RoomVersion) {
		alice := n.Register(t, "alice"+string(v), "")
		p := newGmslPeer(t, v)
		for i := range 15 {
			p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message(fmt.Sprint("before ", i))})
		}
		joinPeerRoom(t, n, alice, p)
		_, joins := p.handshakes()
		want := p.history(joins[0].EventID())
		if len(want) != 21 {
			t.Fatalf("the peer's history has %d events", len(want))
		}
		since := syncToken(t, n, alice)

		got, sizes := pageBack(t, n, alice, p.roomID, 8)
		if !slices.Equal(got, want) {
			t.Fatalf("/messages\n%v\nthe peer's history\n%v", got, want)
		}
		if !slices.Equal(sizes, []int{8, 8, 5}) {
			t.Fatalf("page sizes %v, want [8 8 5]", sizes)
		}
		asked := p.served("backfill")
		if asked == 0 {
			t.Fatal("the peer was never asked")
		}
		// The history is whole: paging again asks nothing.
		if again, _ := pageBack(t, n, alice, p.roomID, 50); !slices.Equal(again, want) {
			t.Fatalf("again: %v", again)
		}
		if p.served("backfill") != asked {
			t.Fatalf("backfill asked %d times, then %d", asked, p.served("backfill"))
		}
		// /context around a backfilled event reads its neighbours.
		c := n.Must(t, "GET", rpath(p.roomID, "/context/"+url.PathEscape(want[10])+"?limit=4"), alice.Token, nil)
		ctxIDs := func(key string) []string {
			var ids []string
			for _, ev := range asList(c[key]) {
				ids = append(ids, ev.(map[string]any)["event_id"].(string))
			}
			return ids
		}
		if b, a := ctxIDs("events_before"), ctxIDs("events_after"); !slices.Equal(b, want[11:13]) || !slices.Equal(a, []string{want[9], want[8]}) {
			t.Fatalf("/context: before %v after %v, want %v and %v", b, a, want[11:13], []string{want[9], want[8]})
		}
		// What was backfilled is served on in turn.
		ans := fedMust(t, n, asOrigin(p.Origin), "GET", fedV1+"/backfill/"+url.PathEscape(p.roomID)+"?limit=100&v="+url.QueryEscape(want[0]), nil)
		if pdus, _ := ans["pdus"].([]any); len(pdus) != len(want) {
			t.Fatalf("the daemon's /backfill answered %d events, want %d", len(pdus), len(want))
		}
		if tl, _ := roomTimeline(t, n, alice, p.roomID, since); len(tl) != 0 {
			t.Fatalf("the history reached /sync: %v", timelineIDs(tl))
		}
		// The room goes on as before.
		msg := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("after")})
		p.sendEvents(t, n, msg)
		if tl, _ := roomTimeline(t, n, alice, p.roomID, since); !slices.Equal(timelineIDs(tl), []string{msg.EventID()}) {
			t.Fatalf("timeline %v, want %s", timelineIDs(tl), msg.EventID())
		}
		if got, want := daemonState(t, n, alice, p.roomID), p.current().ids(); !maps.Equal(got, want) {
			t.Fatalf("the daemon's state\n%v\nthe peer's\n%v", got, want)
		}
	})
}

// A server answering /backfill with events slipped in: one badly signed,
// one of another room, one the auth rules reject. The history is taken
// all the same; the forged event and the other room's are not kept, the
// rejected one is kept as rejected, and none is shown.
func TestBackfillFromMisbehavingPeer(t *testing.T) {
	forEachPeerVersion(t, func(t *testing.T, n *testutil.Node, v gomatrixserverlib.RoomVersion) {
		alice := n.Register(t, "alice"+string(v), "")
		p := newGmslPeer(t, v)
		other := newGmslPeer(t, v)
		for i := range 4 {
			p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message(fmt.Sprint("before ", i))})
		}
		_, otherKey, _ := ed25519.GenerateKey(rand.Reader)
		forged := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("forged"), Key: otherKey, Detached: true})
		mallory := p.add(peerEvent{Sender: p.user("mallory"), Type: "m.room.message", Content: message("let me in"),
			Unchecked: true, Detached: true})
		elsewhere := other.add(peerEvent{Sender: other.creator, Type: "m.room.message", Content: message("elsewhere")})
		p.mu.Lock()
		p.backfillExtra = rawEvents(forged, mallory, elsewhere)
		p.mu.Unlock()
		joinPeerRoom(t, n, alice, p)
		_, joins := p.handshakes()
		want := p.history(joins[0].EventID())

		if got, _ := pageBack(t, n, alice, p.roomID, 5); !slices.Equal(got, want) {
			t.Fatalf("/messages\n%v\nthe peer's history\n%v", got, want)
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

// The room's servers are asked in turn: the room's creator's server
// failing or hanging, the history comes from another of its servers.
func TestBackfillTriesServersInTurn(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		for _, mode := range []string{"fails", "hangs"} {
			t.Run(mode, func(t *testing.T) {
				a := testutil.StartNode(t, testutil.SQLite(t), nil)
				b := testutil.StartNode(t, db, nil)
				v := gomatrixserverlib.RoomVersionV10
				alice, bob := a.Register(t, "alice", ""), b.Register(t, "bob", "")
				p := newGmslPeer(t, v)
				joinPeerRoom(t, a, alice, p)
				var msgs []gomatrixserverlib.PDU
				for i := range 6 {
					msgs = append(msgs, p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message(fmt.Sprint(i))}))
				}
				p.sendEvents(t, a, msgs...)
				p.mu.Lock()
				p.failBackfill, p.hangBackfill = mode == "fails", mode == "hangs"
				p.mu.Unlock()
				joinPeerRoom(t, b, bob, p)
				_, joins := p.handshakes()
				p.sendEvents(t, a, joins[1]) // A serves servers in the room
				// A's history starts at alice's join: B gets what A has.
				want := p.history(joins[1].EventID())
				want = want[:slices.Index(want, joins[0].EventID())+1]

				got, _ := pageBack(t, b, bob, p.roomID, 4)
				if !slices.Equal(got, want) {
					t.Fatalf("/messages\n%v\nwant\n%v", got, want)
				}
				if p.served("backfill") == 0 {
					t.Fatal("the room's creator's server was not asked first")
				}
			})
		}
	})
}

// Two daemons: bob on B joins alice's room on A after a dozen messages,
// and pages back through the whole of it as alice sees it on A.
func TestBackfillBetweenDaemons(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a := testutil.StartNode(t, testutil.SQLite(t), nil)
		b := testutil.StartNode(t, db, nil)
		alice, bob := a.Register(t, "alice", ""), b.Register(t, "bob", "")
		roomID := a.Must(t, "POST", "/_matrix/client/v3/createRoom", alice.Token, map[string]any{"preset": "public_chat"})["room_id"].(string)
		a.Must(t, "PUT", rpath(roomID, "/state/m.room.topic/"), alice.Token, map[string]any{"topic": "old times"})
		for i := range 12 {
			a.Must(t, "PUT", rpath(roomID, fmt.Sprintf("/send/m.room.message/t%d", i)), alice.Token, message(fmt.Sprint(i)))
		}
		b.Must(t, "POST", "/_matrix/client/v3/join/"+url.PathEscape(roomID)+"?server_name="+url.QueryEscape(a.ServerName), bob.Token, map[string]any{})
		want, _ := pageBack(t, a, alice, roomID, 100)
		if len(want) < 15 {
			t.Fatalf("A's history %v", want)
		}
		got, _ := pageBack(t, b, bob, roomID, 6)
		if !slices.Equal(got, want) {
			t.Fatalf("B's /messages\n%v\nA's\n%v", got, want)
		}
	})
}
