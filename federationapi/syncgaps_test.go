package federationapi_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

// syncedRoom is a joined room's entry of a /sync answer.
type syncedRoom struct {
	Timeline struct {
		Events    []timelineEvent `json:"events"`
		Limited   bool            `json:"limited"`
		PrevBatch *string         `json:"prev_batch"`
	} `json:"timeline"`
	State struct {
		Events []struct {
			Type     string `json:"type"`
			StateKey string `json:"state_key"`
			EventID  string `json:"event_id"`
		} `json:"events"`
	} `json:"state"`
}

// syncRoom runs /sync (since "": initial) with a timeline limit and
// returns the room's entry under join (nil when it has none).
func syncRoom(t *testing.T, n *testutil.Node, u *testutil.User, roomID, since string, limit int) *syncedRoom {
	t.Helper()
	q := url.Values{"timeout": {"0"}, "filter": {fmt.Sprintf(`{"room":{"timeline":{"limit":%d}}}`, limit)}}
	if since != "" {
		q.Set("since", since)
	}
	r := n.Do(t, "GET", "/_matrix/client/v3/sync?"+q.Encode(), u.Token, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("/sync: %d %s", r.Status, r.Raw)
	}
	var body struct {
		Rooms struct {
			Join map[string]*syncedRoom `json:"join"`
		} `json:"rooms"`
	}
	if err := json.Unmarshal(r.Raw, &body); err != nil {
		t.Fatal(err)
	}
	return body.Rooms.Join[roomID]
}

// stateIDs is a /sync entry's state as "type|state_key" -> event ID.
func (r *syncedRoom) stateIDs() map[string]string {
	out := map[string]string{}
	for _, ev := range r.State.Events {
		out[ev.Type+"|"+ev.StateKey] = ev.EventID
	}
	return out
}

// A gap get_missing_events does not fill: B's /sync starts the timeline
// after it, limited, with the state that changed in it (a topic B only
// knows from A's /state_ids), though the timeline's limit would hold more;
// an event B received before the gap is left out of the timeline and
// comes first paging back from prev_batch, which goes on into the room's
// history from before B's join.
func TestSyncGapLimitedBetweenDaemons(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		g := newGapPair(t, db)
		since := syncToken(t, g.b, g.bob)
		seen := g.say(t, "seen")
		g.bobSees(t, since, seen)
		lost := g.missed(t, func(i int) string {
			if i == 0 {
				return g.a.Must(t, "PUT", rpath(g.roomID, "/state/m.room.topic/"), g.alice.Token, map[string]any{"topic": "missed"})["event_id"].(string)
			}
			return g.say(t, fmt.Sprint("lost ", i))
		}, 15)
		next := g.say(t, "next")
		g.bobSees(t, since, next)

		for _, c := range []struct {
			name, since string
		}{{"incremental", since}, {"initial", ""}} {
			room := syncRoom(t, g.b, g.bob, g.roomID, c.since, 100)
			if room == nil {
				t.Fatalf("%s: no room", c.name)
			}
			want := append(slices.Clone(lost[5:]), next)
			if got := timelineIDs(room.Timeline.Events); !slices.Equal(got, want) {
				t.Fatalf("%s: timeline %v, want the events after the gap %v", c.name, got, want)
			}
			if !room.Timeline.Limited || room.Timeline.PrevBatch == nil {
				t.Fatalf("%s: a timeline after a gap: limited %v, prev_batch %v", c.name, room.Timeline.Limited, room.Timeline.PrevBatch)
			}
			if got := room.stateIDs()["m.room.topic|"]; got != lost[0] {
				t.Fatalf("%s: the state before the timeline has topic %q, want %s (%v)", c.name, got, lost[0], room.stateIDs())
			}
			if c.since != "" {
				if _, ok := room.stateIDs()["m.room.create|"]; ok {
					t.Fatalf("incremental: the state holds what did not change: %v", room.stateIDs())
				}
			}
			// Paging back from prev_batch: what B has before the gap,
			// newest first, then the history before B's join, from A.
			back, _ := messagesPage(t, g.b, g.bob, g.roomID, *room.Timeline.PrevBatch, 3)
			if len(back) == 0 || back[0] != seen || slices.Contains(back, next) || slices.Contains(back, lost[14]) {
				t.Fatalf("%s: /messages back from prev_batch %v, want %s first", c.name, back, seen)
			}
		}
		// Without a gap in the range, no limit: the next event alone.
		after := syncToken(t, g.b, g.bob)
		last := g.say(t, "after")
		g.bobSees(t, after, last)
		if room := syncRoom(t, g.b, g.bob, g.roomID, after, 100); room == nil || room.Timeline.Limited || !slices.Equal(timelineIDs(room.Timeline.Events), []string{last}) {
			t.Fatalf("a contiguous timeline: %+v", room)
		}
	})
}

// bob on B joins alice's room on A, which has history: his /sync (the
// one after his join, and an initial one) shows the room limited, with a
// prev_batch from which /messages pages back through the history from
// before the join, fetched from A, down to the room's creation.
func TestSyncRemoteJoinLimitedBetweenDaemons(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a := testutil.StartNode(t, testutil.SQLite(t), nil)
		b := testutil.StartNode(t, db, nil)
		alice, bob := a.Register(t, "alice", ""), b.Register(t, "bob", "")
		roomID := a.Must(t, "POST", "/_matrix/client/v3/createRoom", alice.Token, map[string]any{"preset": "public_chat"})["room_id"].(string)
		for i := range 12 {
			a.Must(t, "PUT", rpath(roomID, fmt.Sprintf("/send/m.room.message/t%d", i)), alice.Token, message(fmt.Sprint(i)))
		}
		history, _ := pageBack(t, a, alice, roomID, 100)
		since := syncToken(t, b, bob)
		b.Must(t, "POST", "/_matrix/client/v3/join/"+url.PathEscape(roomID)+"?server_name="+url.QueryEscape(a.ServerName), bob.Token, map[string]any{})
		for _, c := range []struct {
			name, since string
		}{{"joined in the range", since}, {"initial", ""}} {
			room := syncRoom(t, b, bob, roomID, c.since, 20)
			if room == nil {
				t.Fatalf("%s: no room", c.name)
			}
			tl := room.Timeline.Events
			if len(tl) == 0 || tl[len(tl)-1].Type != "m.room.member" || tl[len(tl)-1].Sender != bob.UserID {
				t.Fatalf("%s: timeline %v, want bob's join last", c.name, timelineIDs(tl))
			}
			if !room.Timeline.Limited || room.Timeline.PrevBatch == nil {
				t.Fatalf("%s: the room's history is left out, yet limited %v, prev_batch %v", c.name, room.Timeline.Limited, room.Timeline.PrevBatch)
			}
			if _, ok := room.stateIDs()["m.room.create|"]; !ok {
				t.Fatalf("%s: a newly joined room without its state: %v", c.name, room.stateIDs())
			}
			var got []string
			var historyToken string // a /messages token below the stream's start
			from := *room.Timeline.PrevBatch
			for range 20 {
				ids, end := messagesPage(t, b, bob, roomID, from, 5)
				got = append(got, ids...)
				if end == "" {
					break
				}
				if historyToken == "" && strings.HasPrefix(end, "h") {
					historyToken = end
				}
				from = end
			}
			if !slices.Equal(got, history) {
				t.Fatalf("%s: back from prev_batch\n%v\nA's history before the join\n%v", c.name, got, history)
			}
			// /members at a token of that history: alice alone.
			if historyToken == "" {
				t.Fatalf("%s: no /messages token in the history before the join", c.name)
			}
			r := b.Do(t, "GET", rpath(roomID, "/members?at="+url.QueryEscape(historyToken)), bob.Token, nil)
			var members struct {
				Chunk []struct {
					StateKey string `json:"state_key"`
				} `json:"chunk"`
			}
			if r.Status != http.StatusOK || json.Unmarshal(r.Raw, &members) != nil || len(members.Chunk) != 1 || members.Chunk[0].StateKey != alice.UserID {
				t.Fatalf("%s: /members at %s: %d %s", c.name, historyToken, r.Status, r.Raw)
			}
		}
	})
}
