package roomserver_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// Events of another server, remote.test, come in as its server signs
// them: its key is known to the room server's key ring, and it builds
// each event on the events it names.

const (
	remote   = "remote.test"
	carol    = "@carol:remote.test"
	remoteID = gomatrixserverlib.KeyID("ed25519:r")
)

// t0 is the clock of the room server; a remote event's origin_server_ts
// is set apart from it where state resolution's tie-break needs it.
var t0 = time.UnixMilli(1_700_000_000_000)

// ringKeys is a key ring's store of other servers' keys.
type ringKeys map[gomatrixserverlib.PublicKeyLookupRequest]gomatrixserverlib.PublicKeyLookupResult

func (ringKeys) FetcherName() string { return "test" }

func (k ringKeys) FetchKeys(_ context.Context, reqs map[gomatrixserverlib.PublicKeyLookupRequest]spec.Timestamp) (
	map[gomatrixserverlib.PublicKeyLookupRequest]gomatrixserverlib.PublicKeyLookupResult, error) {
	out := map[gomatrixserverlib.PublicKeyLookupRequest]gomatrixserverlib.PublicKeyLookupResult{}
	for r := range reqs {
		if v, ok := k[r]; ok {
			out[r] = v
		}
	}
	return out, nil
}

func (ringKeys) StoreKeys(context.Context, map[gomatrixserverlib.PublicKeyLookupRequest]gomatrixserverlib.PublicKeyLookupResult) error {
	return nil
}

// fedRooms is a room server of local.test that knows remote.test's key.
type fedRooms struct {
	t         *testing.T
	rooms     *roomserver.Service
	store     *sqlstore.Store
	remoteKey ed25519.PrivateKey
}

func newFedRooms(t *testing.T, db testdb.Database) *fedRooms {
	t.Helper()
	store, err := sqlstore.Open(context.Background(), db.URI, local)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	log := logrus.New()
	log.SetOutput(io.Discard)
	_, localKey, _ := ed25519.GenerateKey(rand.Reader)
	remotePub, remoteKey, _ := ed25519.GenerateKey(rand.Reader)
	kdb := ringKeys{{ServerName: remote, KeyID: remoteID}: {
		VerifyKey:    gomatrixserverlib.VerifyKey{Key: spec.Base64Bytes(remotePub)},
		ExpiredTS:    gomatrixserverlib.PublicKeyNotExpired,
		ValidUntilTS: spec.AsTimestamp(t0.Add(365 * 24 * time.Hour)),
	}}
	rooms := roomserver.New(store, roomserver.Options{ServerName: local, KeyID: "ed25519:k", PrivateKey: localKey, Logger: log,
		KeyRing: &gomatrixserverlib.KeyRing{KeyDatabase: kdb}, Now: func() time.Time { return t0 }})
	return &fedRooms{t: t, rooms: rooms, store: store, remoteKey: remoteKey}
}

// remoteEvent describes an event remote.test builds.
type remoteEvent struct {
	roomID, sender, evType string
	stateKey               *string
	content                any
	prev, auth             []string
	ts                     time.Time
	key                    ed25519.PrivateKey // default: remote.test's
	depth                  int64              // default: one more than its prev events'
}

// build builds and signs a remote event on its prev events.
func (f *fedRooms) build(e remoteEvent) gomatrixserverlib.PDU {
	f.t.Helper()
	ctx := context.Background()
	depth := e.depth - 1
	for _, p := range e.prev {
		if e.depth > 0 {
			break
		}
		ev, err := f.store.RoomEvent(ctx, p)
		if err != nil {
			f.t.Fatalf("prev event %s: %v", p, err)
		}
		depth = max(depth, ev.Depth)
	}
	raw, _ := json.Marshal(e.content)
	proto := gomatrixserverlib.ProtoEvent{SenderID: e.sender, RoomID: e.roomID, Type: e.evType, StateKey: e.stateKey,
		Content: raw, PrevEvents: e.prev, AuthEvents: e.auth, Depth: depth + 1}
	if e.ts.IsZero() {
		e.ts = t0
	}
	if e.key == nil {
		e.key = f.remoteKey
	}
	ev, err := gomatrixserverlib.MustGetRoomVersion(roomserver.DefaultRoomVersion).NewEventBuilderFromProtoEvent(&proto).
		Build(e.ts, remote, remoteID, e.key)
	if err != nil {
		f.t.Fatal(err)
	}
	return ev
}

// receive hands remote.test's PDUs to the room server and returns its
// answer for each.
func (f *fedRooms) receive(evs ...gomatrixserverlib.PDU) map[string]string {
	f.t.Helper()
	var raws []json.RawMessage
	for _, ev := range evs {
		raws = append(raws, ev.JSON())
	}
	return f.rooms.ReceivePDUs(context.Background(), remote, raws)
}

// stateID is the event ID of a room's current state of that type and key.
func (f *fedRooms) stateID(roomID, evType, stateKey string) string {
	f.t.Helper()
	ev, err := f.rooms.StateEvent(context.Background(), alice, roomID, evType, stateKey)
	if err != nil {
		f.t.Fatalf("state %s/%s: %v", evType, stateKey, err)
	}
	return ev.EventID
}

// latest is the newest event of a room's timeline.
func (f *fedRooms) latest(roomID string) string {
	f.t.Helper()
	res, err := f.rooms.Messages(context.Background(), roomserver.MessagesRequest{UserID: alice, RoomID: roomID, Dir: "b", Limit: "1"})
	if err != nil || len(res.Chunk) != 1 {
		f.t.Fatalf("latest event: %v", err)
	}
	return res.Chunk[0].EventID
}

// roomWithCarol is a public room of alice's that carol of remote.test
// joined through /make_join and /send_join, with power 50; before runs
// before she joins.
func (f *fedRooms) roomWithCarol(before ...func(roomID string)) string {
	f.t.Helper()
	ctx := context.Background()
	roomID := createRoom(f.t, f.rooms, alice, roomserver.CreateRoomRequest{Preset: "public_chat",
		PowerLevelContentOverride: map[string]json.RawMessage{"users": json.RawMessage(`{"` + alice + `":100,"` + carol + `":50}`)}})
	for _, b := range before {
		b(roomID)
	}
	tmpl, err := f.rooms.MakeJoin(ctx, remote, roomID, carol, []string{string(roomserver.DefaultRoomVersion)})
	if err != nil {
		f.t.Fatal(err)
	}
	join, err := gomatrixserverlib.MustGetRoomVersion(gomatrixserverlib.RoomVersion(tmpl.RoomVersion)).
		NewEventBuilderFromProtoEvent(&tmpl.Event).Build(t0, remote, remoteID, f.remoteKey)
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.rooms.SendJoin(ctx, remote, roomID, join.EventID(), join.JSON()); err != nil {
		f.t.Fatal(err)
	}
	if m := membership(f.t, f.rooms, alice, roomID, carol); m != "join" {
		f.t.Fatalf("carol is %q after send_join", m)
	}
	return roomID
}

// carolAuth are the auth events of an event of carol's now: create,
// power levels, her join.
func (f *fedRooms) carolAuth(roomID string) []string {
	return []string{f.stateID(roomID, "m.room.create", ""), f.stateID(roomID, "m.room.power_levels", ""),
		f.stateID(roomID, "m.room.member", carol)}
}

// stored reads an event as stored, rejected or not.
func (f *fedRooms) stored(eventID string) storage.RoomEvent {
	f.t.Helper()
	evs, err := f.store.RoomEventsByID(context.Background(), []string{eventID})
	if err != nil || len(evs) != 1 {
		f.t.Fatalf("event %s: %v (%d found)", eventID, err, len(evs))
	}
	return evs[0]
}

// An event the auth rules refuse is rejected: answered as processed,
// kept as rejected, never state, never shown; an event that names it as
// an auth event is rejected too. A bad signature is an error and keeps
// nothing.
func TestRejectedEvents(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		f := newFedRooms(t, db)
		ctx := context.Background()
		roomID := f.roomWithCarol()
		plBefore := f.stateID(roomID, "m.room.power_levels", "")

		msg := f.build(remoteEvent{roomID: roomID, sender: carol, evType: "m.room.message", content: map[string]any{"body": "hello"},
			prev: []string{f.latest(roomID)}, auth: f.carolAuth(roomID)})
		if res := f.receive(msg); res[msg.EventID()] != "" {
			t.Fatalf("a good message: %v", res)
		}
		if ev, err := f.rooms.Event(ctx, alice, roomID, msg.EventID()); err != nil || ev.Sender != carol {
			t.Fatalf("carol's message: %+v %v", ev, err)
		}

		// Carol (50) raises herself to 100: refused by the auth rules.
		empty := ""
		grab := f.build(remoteEvent{roomID: roomID, sender: carol, evType: "m.room.power_levels", stateKey: &empty,
			content: map[string]any{"users": map[string]any{alice: 100, carol: 100}},
			prev:    []string{msg.EventID()}, auth: f.carolAuth(roomID)})
		if res := f.receive(grab); len(res) != 1 || res[grab.EventID()] != "" {
			t.Fatalf("a rejected event's answer: %v, want it processed", res)
		}
		if got := f.stateID(roomID, "m.room.power_levels", ""); got != plBefore {
			t.Fatalf("the rejected power levels are state: %s", got)
		}
		if !f.stored(grab.EventID()).Rejected {
			t.Fatal("the refused event is not kept as rejected")
		}
		_, err := f.rooms.Event(ctx, alice, roomID, grab.EventID())
		wantErr(t, err, http.StatusNotFound, "M_NOT_FOUND")
		// Sent again, it stays rejected.
		if res := f.receive(grab); res[grab.EventID()] != "" || !f.stored(grab.EventID()).Rejected {
			t.Fatalf("the rejected event again: %v", res)
		}

		// A name carol may set, naming the rejected power levels as an
		// auth event: rejected too.
		named := f.build(remoteEvent{roomID: roomID, sender: carol, evType: "m.room.name", stateKey: &empty,
			content: map[string]any{"name": "carol's"}, prev: []string{msg.EventID()},
			auth: []string{f.stateID(roomID, "m.room.create", ""), grab.EventID(), f.stateID(roomID, "m.room.member", carol)}})
		if res := f.receive(named); res[named.EventID()] != "" {
			t.Fatalf("an event authorised by a rejected event: %v", res)
		}
		if !f.stored(named.EventID()).Rejected {
			t.Fatal("an event authorised by a rejected event is not rejected")
		}
		if _, err := f.rooms.StateEvent(ctx, alice, roomID, "m.room.name", ""); err == nil {
			t.Fatal("the rejected name is state")
		}

		// Signed by another key than remote.test's: not taken in.
		_, wrongKey, _ := ed25519.GenerateKey(rand.Reader)
		forged := f.build(remoteEvent{roomID: roomID, sender: carol, evType: "m.room.message", content: map[string]any{"body": "forged"},
			prev: []string{msg.EventID()}, auth: f.carolAuth(roomID), key: wrongKey})
		if res := f.receive(forged); res[forged.EventID()] == "" {
			t.Fatalf("a forged event was accepted: %v", res)
		}
		if evs, _ := f.store.RoomEventsByID(ctx, []string{forged.EventID()}); len(evs) != 0 {
			t.Fatal("a forged event was stored")
		}
		// An event of a room this server is not in is not taken in.
		other := f.build(remoteEvent{roomID: roomID, sender: carol, evType: "m.room.message", content: map[string]any{"body": "x"},
			prev: []string{msg.EventID()}, auth: f.carolAuth(roomID)})
		raw := []byte(string(other.JSON()))
		var obj map[string]any
		_ = json.Unmarshal(raw, &obj)
		obj["room_id"] = "!unknown:remote.test"
		raw, _ = json.Marshal(obj)
		if res := f.rooms.ReceivePDUs(ctx, remote, []json.RawMessage{raw}); len(res) != 1 {
			t.Fatalf("a PDU of an unknown room: %v", res)
		} else {
			for _, e := range res {
				if e == "" {
					t.Fatalf("a PDU of an unknown room was processed: %v", res)
				}
			}
		}
	})
}

// An event allowed by the state before it but not by the room's state now
// (carol's message built before her ban) is soft-failed: kept, hidden,
// and changing nothing.
func TestSoftFailedEvent(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		f := newFedRooms(t, db)
		ctx := context.Background()
		roomID := f.roomWithCarol()
		before := f.latest(roomID)
		auth := f.carolAuth(roomID)
		if err := f.rooms.Ban(ctx, alice, roomID, carol, ""); err != nil {
			t.Fatal(err)
		}
		late := f.build(remoteEvent{roomID: roomID, sender: carol, evType: "m.room.message", content: map[string]any{"body": "late"},
			prev: []string{before}, auth: auth})
		if res := f.receive(late); res[late.EventID()] != "" {
			t.Fatalf("a soft-failed event's answer %v", res)
		}
		ev := f.stored(late.EventID())
		if !ev.SoftFailed || ev.Rejected {
			t.Fatalf("soft-failed %v, rejected %v", ev.SoftFailed, ev.Rejected)
		}
		res, err := f.rooms.Messages(ctx, roomserver.MessagesRequest{UserID: alice, RoomID: roomID, Dir: "b", Limit: "50"})
		if err != nil {
			t.Fatal(err)
		}
		if slices.ContainsFunc(res.Chunk, func(e roomserver.ClientEvent) bool { return e.EventID == late.EventID() }) {
			t.Fatal("a soft-failed event is in the timeline")
		}
		_, err = f.rooms.Context(ctx, roomserver.ContextRequest{UserID: alice, RoomID: roomID, EventID: late.EventID()})
		wantErr(t, err, http.StatusNotFound, "M_NOT_FOUND")
		// The next local event builds on the ban, not on the soft-failed one.
		next := send(t, f.rooms, alice, roomID, "after")
		if got := f.stored(next); !slices.Contains(prevEvents(t, got), f.stateID(roomID, "m.room.member", carol)) {
			t.Fatalf("the next event builds on %v", prevEvents(t, got))
		}
		if m := membership(t, f.rooms, alice, roomID, carol); m != "ban" {
			t.Fatalf("carol is %s", m)
		}
	})
}

func prevEvents(t *testing.T, ev storage.RoomEvent) []string {
	var pdu struct {
		PrevEvents []string `json:"prev_events"`
	}
	if err := json.Unmarshal(ev.JSON, &pdu); err != nil {
		t.Fatal(err)
	}
	return pdu.PrevEvents
}

// Two topics set at once, one here and one by carol on the state before
// it, leave the room with two forward extremities; its state is theirs
// resolved: between events of equal power, the later origin_server_ts
// wins. The next local event joins both branches.
func TestConcurrentStateIsResolved(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		for _, c := range []struct {
			name      string
			carolTS   time.Time
			carolWins bool
		}{
			{"carol's later", t0.Add(time.Second), true},
			{"carol's earlier", t0.Add(-time.Second), false},
		} {
			f := newFedRooms(t, db)
			roomID := f.roomWithCarol()
			fork := f.latest(roomID)
			auth := f.carolAuth(roomID)
			local := setState(t, f.rooms, alice, roomID, "m.room.topic", `{"topic":"alice's"}`)
			empty := ""
			theirs := f.build(remoteEvent{roomID: roomID, sender: carol, evType: "m.room.topic", stateKey: &empty,
				content: map[string]any{"topic": "carol's"}, prev: []string{fork}, auth: auth, ts: c.carolTS})
			if res := f.receive(theirs); res[theirs.EventID()] != "" {
				t.Fatalf("%s: %v", c.name, res)
			}
			if ev := f.stored(theirs.EventID()); ev.Rejected || ev.SoftFailed {
				t.Fatalf("%s: carol's topic rejected %v soft-failed %v", c.name, ev.Rejected, ev.SoftFailed)
			}
			want := local
			if c.carolWins {
				want = theirs.EventID()
			}
			if got := f.stateID(roomID, "m.room.topic", ""); got != want {
				t.Fatalf("%s: the topic is %s, want %s (alice's %s, carol's %s)", c.name, got, want, local, theirs.EventID())
			}
			next := send(t, f.rooms, alice, roomID, "merge")
			prev := prevEvents(t, f.stored(next))
			slices.Sort(prev)
			both := []string{local, theirs.EventID()}
			slices.Sort(both)
			if !slices.Equal(prev, both) {
				t.Fatalf("%s: the next event's prev_events %v, want both branches %v", c.name, prev, both)
			}
			if got := f.stateID(roomID, "m.room.topic", ""); got != want {
				t.Fatalf("%s: after the merge the topic is %s, want %s", c.name, got, want)
			}
		}
	})
}

// A demotion here and carol's topic built on the state before it: the
// topic is allowed by that state but not by the room's now, so it never
// becomes state.
func TestDemotionWinsOverConcurrentState(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		f := newFedRooms(t, db)
		roomID := f.roomWithCarol()
		fork := f.latest(roomID)
		auth := f.carolAuth(roomID)
		setState(t, f.rooms, alice, roomID, "m.room.power_levels", `{"users":{"`+alice+`":100},"state_default":50}`)
		empty := ""
		topic := f.build(remoteEvent{roomID: roomID, sender: carol, evType: "m.room.topic", stateKey: &empty,
			content: map[string]any{"topic": "carol's"}, prev: []string{fork}, auth: auth, ts: t0.Add(time.Minute)})
		f.receive(topic)
		if _, err := f.rooms.StateEvent(context.Background(), alice, roomID, "m.room.topic", ""); err == nil {
			t.Fatal("a demoted user's concurrent topic became state")
		}
		if ev := f.stored(topic.EventID()); !ev.SoftFailed && !ev.Rejected {
			t.Fatal("the demoted user's topic was accepted")
		}
	})
}

func gmslVersion() gomatrixserverlib.IRoomVersion {
	return gomatrixserverlib.MustGetRoomVersion(roomserver.DefaultRoomVersion)
}
