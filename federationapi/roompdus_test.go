package federationapi_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/fclient"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/identity"
	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/storage"
)

// fixedKey verifies the signatures of one server with its one key.
type fixedKey struct {
	server string
	id     gomatrixserverlib.KeyID
	key    ed25519.PublicKey
}

func (f fixedKey) VerifyJSONs(_ context.Context, reqs []gomatrixserverlib.VerifyJSONRequest) ([]gomatrixserverlib.VerifyJSONResult, error) {
	out := make([]gomatrixserverlib.VerifyJSONResult, len(reqs))
	for i, r := range reqs {
		if string(r.ServerName) != f.server {
			out[i].Error = fmt.Errorf("no key of %s", r.ServerName)
			continue
		}
		out[i].Error = gomatrixserverlib.VerifyJSON(f.server, f.id, f.key, r.Message)
	}
	return out, nil
}

// pduWatcher is a remote server that checks every /send it is given (the
// request's X-Matrix signature, each PDU's hashes and its signature by
// the sending server) and records the events in arrival order.
type pduWatcher struct {
	*testutil.Origin
	mu     sync.Mutex
	events []gomatrixserverlib.PDU
	// down makes it answer 503 to every /send, recording nothing;
	// attempts counts those.
	down     atomic.Bool
	attempts atomic.Int32
}

func newPDUWatcher(t *testing.T, from *testutil.Node) *pduWatcher {
	key, _, err := identity.LoadOrCreateSigningKey(from.Config.SigningKeyFile())
	if err != nil {
		t.Fatal(err)
	}
	sender := from.ServerName // from.Server is replaced when the node restarts
	keys := fixedKey{server: sender, id: key.KeyID, key: key.PublicKey()}
	w := &pduWatcher{Origin: testutil.NewOrigin(t)}
	w.Mux.HandleFunc("GET /_matrix/federation/v1/user/devices/{user}", func(rw http.ResponseWriter, r *http.Request) {
		writeJSON(rw, map[string]any{"user_id": r.PathValue("user"), "stream_id": 1, "devices": []any{}})
	})
	w.Mux.HandleFunc("PUT /_matrix/federation/v1/send/{txn}", func(rw http.ResponseWriter, r *http.Request) {
		w.attempts.Add(1)
		if w.down.Load() {
			rw.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fr, resp := fclient.VerifyHTTPRequest(r, time.Now(), spec.ServerName(w.Name), nil, keys)
		if fr == nil {
			t.Errorf("a /send that fails X-Matrix: %d %v", resp.Code, resp.JSON)
			rw.WriteHeader(resp.Code)
			return
		}
		var txn struct {
			Origin string            `json:"origin"`
			PDUs   []json.RawMessage `json:"pdus"`
		}
		if err := json.Unmarshal(fr.Content(), &txn); err != nil || txn.Origin != sender || string(fr.Origin()) != sender {
			t.Errorf("transaction from %s: %s (%v)", fr.Origin(), fr.Content(), err)
		}
		impl := gomatrixserverlib.MustGetRoomVersion(roomserver.DefaultRoomVersion) // the rooms are created in it
		var evs []gomatrixserverlib.PDU
		for _, raw := range txn.PDUs {
			ev, err := impl.NewEventFromUntrustedJSON(raw)
			if err != nil {
				t.Errorf("PDU %s: %v", raw, err)
				continue
			}
			if err := gomatrixserverlib.VerifyEventSignatures(r.Context(), ev, keys, func(_ spec.RoomID, s spec.SenderID) (*spec.UserID, error) {
				return spec.NewUserID(string(s), true)
			}); err != nil {
				t.Errorf("PDU %s: %v", ev.EventID(), err)
			}
			evs = append(evs, ev)
		}
		w.mu.Lock()
		w.events = append(w.events, evs...)
		w.mu.Unlock()
		writeJSON(rw, map[string]any{"pdus": map[string]any{}})
	})
	return w
}

// received lists the (type, event ID) of the events received, in order.
func (w *pduWatcher) received() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, ev := range w.events {
		out = append(out, ev.EventID())
	}
	return out
}

// joinAs writes into n's room a join of userID signed by its server o,
// as the room has it once the user joined over federation (an Origin
// does not run the join handshake).
func joinAs(t *testing.T, n *testutil.Node, o *testutil.Origin, roomID, userID string) {
	t.Helper()
	ctx := context.Background()
	room, err := n.Store.Room(ctx, roomID)
	if err != nil {
		t.Fatal(err)
	}
	state, err := n.Store.RoomCurrentState(ctx, roomID)
	if err != nil {
		t.Fatal(err)
	}
	var auth []string
	for _, ev := range state {
		switch ev.Type {
		case spec.MRoomCreate, spec.MRoomJoinRules, spec.MRoomPowerLevels:
			auth = append(auth, ev.EventID)
		}
	}
	impl := gomatrixserverlib.MustGetRoomVersion(gomatrixserverlib.RoomVersion(room.RoomVersion))
	proto := gomatrixserverlib.ProtoEvent{SenderID: userID, RoomID: roomID, Type: spec.MRoomMember, StateKey: &userID,
		Content: []byte(`{"membership":"join"}`), PrevEvents: room.Extremities, AuthEvents: auth, Depth: room.Depth + 1}
	ev, err := impl.NewEventBuilderFromProtoEvent(&proto).Build(time.Now(), spec.ServerName(o.Name), o.KeyID, o.Key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Store.WriteRoomEvents(ctx, storage.RoomWrite{RoomID: roomID, Extremities: room.Extremities, Now: time.Now().UnixMilli(),
		Events: []storage.RoomEvent{{EventID: ev.EventID(), RoomID: roomID, Type: ev.Type(), StateKey: ev.StateKey(), Sender: userID,
			Depth: ev.Depth(), RoomVersion: room.RoomVersion, JSON: ev.JSON(), Membership: spec.Join}}}); err != nil {
		t.Fatal(err)
	}
}

// Our room events reach the other servers of the room over real TLS and
// X-Matrix, signed by us, in order, through the sender's durable queue:
// messages and state while the server has a joined member, the kick of
// its member though it then has none, then nothing but a membership
// event about its user.
func TestRoomEventsReachTheRoomsServers(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, nil)
		alice := n.Register(t, "alice", "A1")
		w := newPDUWatcher(t, n)
		bob := "@bob:" + w.Name
		roomID := n.Must(t, "POST", "/_matrix/client/v3/createRoom", alice.Token, map[string]any{"preset": "public_chat"})["room_id"].(string)
		joinAs(t, n, w.Origin, roomID, bob)
		path := func(rest string) string { return "/_matrix/client/v3/rooms/" + url.PathEscape(roomID) + rest }
		eventID := func(r map[string]any) string { return r["event_id"].(string) }

		var want []string
		want = append(want, eventID(n.Must(t, "PUT", path("/send/m.room.message/t1"), alice.Token, map[string]any{"msgtype": "m.text", "body": "hi"})))
		want = append(want, eventID(n.Must(t, "PUT", path("/state/m.room.topic"), alice.Token, map[string]any{"topic": "t"})))
		eventually(t, "the message and the topic at B", func() bool { return len(w.received()) >= 2 })
		n.Must(t, "POST", path("/kick"), alice.Token, map[string]any{"user_id": bob})
		state, err := n.Store.RoomMembership(context.Background(), roomID, bob)
		if err != nil || state != spec.Leave {
			t.Fatalf("bob's membership after the kick: %q %v", state, err)
		}
		kick, err := n.Store.RoomCurrentState(context.Background(), roomID)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range kick {
			if ev.Type == spec.MRoomMember && ev.StateKey != nil && *ev.StateKey == bob {
				want = append(want, ev.EventID)
			}
		}
		// B has left: the next message is not for it; the ban of its user
		// is, and comes after anything queued before it.
		n.Must(t, "PUT", path("/send/m.room.message/t2"), alice.Token, map[string]any{"msgtype": "m.text", "body": "gone"})
		n.Must(t, "POST", path("/ban"), alice.Token, map[string]any{"user_id": bob})
		ban, err := n.Store.RoomStateEvents(context.Background(), roomID, []storage.StateKey{{Type: spec.MRoomMember, StateKey: bob}})
		if err != nil || len(ban) != 1 {
			t.Fatalf("the ban: %v %v", ban, err)
		}
		want = append(want, ban[0].EventID)
		eventually(t, "the ban at B", func() bool { return len(w.received()) >= len(want) })
		if got := w.received(); !slices.Equal(got, want) {
			t.Fatalf("B received %v, want %v", got, want)
		}
		eventually(t, "the queue to empty", func() bool {
			d, err := n.Store.PDUDestinations(context.Background())
			return err == nil && len(d) == 0
		})
	})
}

// Events queued while the room's other server is down stay queued across
// a restart of the daemon and reach it, once, when it is back.
func TestRoomEventsSurviveRestart(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, nil)
		alice := n.Register(t, "alice", "A1")
		w := newPDUWatcher(t, n)
		w.down.Store(true)
		roomID := n.Must(t, "POST", "/_matrix/client/v3/createRoom", alice.Token, map[string]any{"preset": "public_chat"})["room_id"].(string)
		joinAs(t, n, w.Origin, roomID, "@bob:"+w.Name)
		var want []string
		for i := 0; i < 3; i++ {
			r := n.Must(t, "PUT", fmt.Sprintf("/_matrix/client/v3/rooms/%s/send/m.room.message/t%d", url.PathEscape(roomID), i), alice.Token,
				map[string]any{"msgtype": "m.text", "body": "queued"})
			want = append(want, r["event_id"].(string))
		}
		eventually(t, "a failed attempt", func() bool { return w.attempts.Load() > 0 })
		n.Stop()
		w.down.Store(false)
		n.Restart()
		eventually(t, "the events at B after the restart", func() bool { return len(w.received()) >= len(want) })
		if got := w.received(); !slices.Equal(got, want) {
			t.Fatalf("B received %v, want %v", got, want)
		}
	})
}

// timelineHas reports whether u's initial /sync on n shows eventID in the
// room's timeline.
func timelineHas(t *testing.T, n *testutil.Node, u *testutil.User, roomID, eventID string) bool {
	t.Helper()
	r := n.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0", u.Token, nil)
	room, _ := r["rooms"].(map[string]any)["join"].(map[string]any)[roomID].(map[string]any)
	if room == nil {
		return false
	}
	for _, ev := range asList(room["timeline"].(map[string]any)["events"]) {
		if ev.(map[string]any)["event_id"] == eventID {
			return true
		}
	}
	return false
}

// Two daemons in one room, bob of B having joined alice's room on A over
// federation: each one's messages reach the other's users through the
// sender's queue, without a sweep (the write pokes the sender).
func TestRoomMessagesFlowBetweenDaemons(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		p := newRoomPair(t, db)
		roomID := p.a.Must(t, "POST", "/_matrix/client/v3/createRoom", p.alice.Token, map[string]any{
			"preset": "private_chat", "invite": []string{p.bob.UserID}})["room_id"].(string)
		p.b.Must(t, "POST", "/_matrix/client/v3/join/"+url.PathEscape(roomID), p.bob.Token, map[string]any{})
		if got := joinedMembers(t, p.a, p.alice, roomID); !equalStrings(got, p.alice.UserID, p.bob.UserID) {
			t.Fatalf("A's joined members %v", got)
		}

		fromAlice := p.a.Must(t, "PUT", rpath(roomID, "/send/m.room.message/a1"), p.alice.Token,
			map[string]any{"msgtype": "m.text", "body": "from A"})["event_id"].(string)
		eventually(t, "alice's message in bob's timeline on B", func() bool { return timelineHas(t, p.b, p.bob, roomID, fromAlice) })
		fromBob := p.b.Must(t, "PUT", rpath(roomID, "/send/m.room.message/b1"), p.bob.Token,
			map[string]any{"msgtype": "m.text", "body": "from B"})["event_id"].(string)
		eventually(t, "bob's message in alice's timeline on A", func() bool { return timelineHas(t, p.a, p.alice, roomID, fromBob) })
		for _, n := range []*testutil.Node{p.a, p.b} {
			eventually(t, n.ServerName+"'s queue to empty", func() bool {
				d, err := n.Store.PDUDestinations(context.Background())
				return err == nil && len(d) == 0
			})
		}
	})
}
