package federationapi_test

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/testutil"
)

// A PDU citing among its auth_events an event of another room is
// rejected: answered {} in /send, as Synapse answers a rejected event,
// kept as rejected, never shown, and the room's state does not move.
// The other room's event is one of a room the daemon is in, or one it
// does not know, fetched from the sender (and not kept).
func TestGmslPeerAuthEventOfAnotherRoom(t *testing.T) {
	forEachPeerVersion(t, func(t *testing.T, n *testutil.Node, v gomatrixserverlib.RoomVersion) {
		alice := n.Register(t, "alice"+string(v), "")
		p := joinedPeer(t, n, alice, v)
		// A room of the daemon the peer's creator is in.
		mine := n.Must(t, "POST", "/_matrix/client/v3/createRoom", alice.Token, map[string]any{
			"preset": "public_chat", "room_version": string(v),
		})["room_id"].(string)
		known := peerJoinDaemonRoom(t, p, n, p.creator, mine).JoinEvent
		// A room the daemon is not in, whose event the peer serves.
		other := newGmslPeer(t, v)
		unknown := other.current()[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomMember, StateKey: other.creator}]
		p.mu.Lock()
		p.events[unknown.EventID()] = unknown
		p.mu.Unlock()

		state := p.current()
		create := state[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomCreate}]
		power := state[gomatrixserverlib.StateKeyTuple{EventType: spec.MRoomPowerLevels}]
		for name, foreign := range map[string]gomatrixserverlib.PDU{"known": known, "unknown": unknown} {
			t.Run(name, func(t *testing.T) {
				before := daemonState(t, n, alice, p.roomID)
				since := syncToken(t, n, alice)
				// The creator's membership taken from the other room.
				bad := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("astray"),
					Auth: []string{create.EventID(), power.EventID(), foreign.EventID()}, Unchecked: true, Detached: true})
				expectRejected(t, n, p.send(t, n, rawEvents(bad)...), bad)
				if s := eventStatus(t, n, alice, p.roomID, bad.EventID()); s != http.StatusNotFound {
					t.Fatalf("GET the rejected event: %d", s)
				}
				if got := daemonState(t, n, alice, p.roomID); !maps.Equal(got, before) {
					t.Fatalf("state changed from\n%v\nto\n%v", before, got)
				}
				next := p.add(peerEvent{Sender: p.creator, Type: "m.room.message", Content: message("after")})
				p.sendEvents(t, n, next)
				if tl, _ := roomTimeline(t, n, alice, p.roomID, since); !slices.Equal(timelineIDs(tl), []string{next.EventID()}) {
					t.Fatalf("timeline %v, want only %s", timelineIDs(tl), next.EventID())
				}
			})
		}
		if stored, err := n.Store.RoomEventsByID(context.Background(), []string{unknown.EventID()}); err != nil || len(stored) != 0 {
			t.Fatalf("the other room's event is kept: %+v %v", stored, err)
		}
	})
}
