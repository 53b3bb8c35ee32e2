package federationapi_test

import (
	"maps"
	"slices"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/testutil"
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

		if got := joinedMembers(t, n, alice, p.roomID); !equalStrings(got, sorted(alice.UserID, p.creator)...) {
			t.Fatalf("joined members %v", got)
		}
		if got, want := daemonState(t, n, alice, p.roomID), p.current().ids(); !maps.Equal(got, want) {
			t.Fatalf("the daemon's state\n%v\nthe peer's\n%v", got, want)
		}
		if len(p.templates) != 1 || len(p.joins) != 1 {
			t.Fatalf("%d templates, %d joins", len(p.templates), len(p.joins))
		}
		tmpl, join := p.templates[0], p.joins[0]
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

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}
