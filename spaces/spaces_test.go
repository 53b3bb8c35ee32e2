package spaces_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/spaces"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

const (
	local  = "local.test"
	alice  = "@alice:local.test"
	bob    = "@bob:local.test"
	remote = "remote.test"
)

// fakeRemote answers /hierarchy as other servers would, from canned
// bodies by server and room, and records what it was asked.
type fakeRemote struct {
	mu      sync.Mutex
	answers map[string]string // server + " " + room ID -> body
	asked   []string
}

func (f *fakeRemote) Hierarchy(_ context.Context, server, roomID string, suggestedOnly bool) (json.RawMessage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, fmt.Sprintf("%s %s %v", server, roomID, suggestedOnly))
	body, ok := f.answers[server+" "+roomID]
	if !ok {
		return nil, errors.New("404 M_NOT_FOUND")
	}
	return json.RawMessage(body), nil
}

func (f *fakeRemote) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.asked)
}

type fixture struct {
	svc   *spaces.Service
	rooms *roomserver.Service
	clock *int64 // milliseconds, one more for each event
}

func newFixture(t *testing.T, db testdb.Database, r spaces.Remote) fixture {
	t.Helper()
	store, err := sqlstore.Open(context.Background(), db.URI, local)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	log := logrus.New()
	log.SetOutput(io.Discard)
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	ms := int64(1_700_000_000_000)
	var mu sync.Mutex
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); ms++; return time.UnixMilli(ms) }
	rooms := roomserver.New(store, roomserver.Options{ServerName: local, KeyID: "ed25519:k", PrivateKey: key, Logger: log, Now: now})
	return fixture{svc: spaces.New(store, r, local, log), rooms: rooms, clock: &ms}
}

func (f fixture) create(t *testing.T, creator string, preset string, space bool, state ...roomserver.StateEvent) string {
	t.Helper()
	req := roomserver.CreateRoomRequest{Preset: preset, InitialState: state}
	if space {
		req.CreationContent = map[string]json.RawMessage{"type": json.RawMessage(`"m.space"`)}
	}
	id, err := f.rooms.CreateRoom(context.Background(), creator, req)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func (f fixture) child(t *testing.T, parent, child, content string) {
	t.Helper()
	if _, err := f.rooms.SendState(context.Background(), alice, parent, "m.space.child", child, json.RawMessage(content)); err != nil {
		t.Fatal(err)
	}
}

func (f fixture) ids(t *testing.T, user string, req spaces.Request) []string {
	t.Helper()
	if req.MaxDepth == 0 {
		req.MaxDepth = -1
	}
	res, err := f.svc.Hierarchy(context.Background(), user, req)
	if err != nil {
		t.Fatal(err)
	}
	out := []string{}
	for _, r := range res.Rooms {
		out = append(out, r.RoomID)
	}
	return out
}

func wantErr(t *testing.T, err error, status int, code string) {
	t.Helper()
	var me *mxerr.Error
	if !errors.As(err, &me) || me.Status != status || me.Code != code {
		t.Fatalf("got %v, want %d %s", err, status, code)
	}
}

// A space's children are in the spec's order: by a valid "order"
// (printable ASCII, at most 50 characters), those without one last, then
// by origin_server_ts, then by room ID; children without a valid via or
// whose state key is not a room ID are no children.
func TestChildOrder(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		f := newFixture(t, db, nil)
		space := f.create(t, alice, "public_chat", true)
		// Sent in this order: origin_server_ts grows by one each.
		f.child(t, space, "!late:x", `{"via":["x"]}`)
		f.child(t, space, "!b:x", `{"via":["x"],"order":"b"}`)
		f.child(t, space, "!a:x", `{"via":["x"],"order":"a"}`)
		f.child(t, space, "!accent:x", `{"via":["x"],"order":"é"}`)
		f.child(t, space, "!long:x", `{"via":["x"],"order":"`+strings.Repeat("a", 51)+`"}`)
		f.child(t, space, "!number:x", `{"via":["x"],"order":1}`)
		f.child(t, space, "!fifty:x", `{"via":["x"],"order":"`+strings.Repeat("z", 50)+`"}`)
		f.child(t, space, "!noVia:x", `{"order":"0"}`)
		f.child(t, space, "!emptyVia:x", `{"via":[],"order":"0"}`)
		f.child(t, space, "!badVia:x", `{"via":[1],"order":"0"}`)
		f.child(t, space, "notaroom", `{"via":["x"],"order":"0"}`)
		f.child(t, space, "!late:x", `{"via":["x"],"suggested":false}`) // changed: newer

		res, err := f.svc.Hierarchy(context.Background(), bob, spaces.Request{RoomID: space, MaxDepth: 0})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Rooms) != 1 || res.NextBatch != "" {
			t.Fatalf("max_depth 0: %+v", res)
		}
		var got []string
		for _, c := range res.Rooms[0].ChildrenState {
			got = append(got, c.StateKey)
		}
		want := []string{"!a:x", "!b:x", "!fifty:x", "!accent:x", "!long:x", "!number:x", "!late:x"}
		if !slices.Equal(got, want) {
			t.Fatalf("children %v, want %v", got, want)
		}
	})
}

// A restricted room is seen by the members of the rooms its join rule
// names, and not by others.
func TestRestrictedRoom(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		f := newFixture(t, db, nil)
		space := f.create(t, alice, "public_chat", true)
		other := f.create(t, alice, "private_chat", false)
		restricted := f.create(t, alice, "private_chat", false, roomserver.StateEvent{Type: "m.room.join_rules",
			Content: json.RawMessage(`{"join_rule":"restricted","allow":[{"type":"m.room_membership","room_id":"` + space + `"}]}`)})
		f.child(t, space, restricted, `{"via":["local.test"]}`)
		f.child(t, space, other, `{"via":["local.test"]}`)

		if got := f.ids(t, bob, spaces.Request{RoomID: space}); !slices.Equal(got, []string{space}) {
			t.Fatalf("bob outside the space: %v", got)
		}
		_, err := f.svc.Hierarchy(ctx, bob, spaces.Request{RoomID: restricted, MaxDepth: -1})
		wantErr(t, err, 403, "M_FORBIDDEN")
		_, err = f.svc.Summary(ctx, bob, restricted, nil)
		wantErr(t, err, 404, "M_NOT_FOUND")
		// Another server with no one in the space is refused it too.
		_, err = f.svc.FederationHierarchy(ctx, remote, restricted, false)
		wantErr(t, err, 404, "M_NOT_FOUND")
		fed, err := f.svc.FederationHierarchy(ctx, remote, space, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(fed.Children) != 0 || !slices.Equal(fed.InaccessibleChildren, []string{restricted, other}) {
			t.Fatalf("the space for another server: %+v", fed)
		}

		if _, err := f.rooms.Join(ctx, bob, space, nil, nil); err != nil {
			t.Fatal(err)
		}
		if got := f.ids(t, bob, spaces.Request{RoomID: space}); !slices.Equal(got, []string{space, restricted}) {
			t.Fatalf("bob in the space: %v", got)
		}
		s, err := f.svc.Summary(ctx, bob, restricted, nil)
		if err != nil {
			t.Fatal(err)
		}
		if s.JoinRule != "restricted" || s.Membership != "leave" || s.AllowedRoomIDs != nil {
			t.Fatalf("bob's summary of the restricted room: %+v", s)
		}
	})
}

// The rooms of other servers: asked of the servers the child event names
// (the first three, this one left out), answers shaped as Synapse's
// taken, filtered again for the user, kept for five minutes; the children
// the answer names inaccessible are not asked for.
func TestRemoteChildren(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		fr := &fakeRemote{answers: map[string]string{}}
		f := newFixture(t, db, fr)
		space := f.create(t, alice, "public_chat", true)
		const rs, x, y, z, wrong = "!rs:remote.test", "!x:remote.test", "!y:remote.test", "!z:remote.test", "!wrong:remote.test"
		f.child(t, space, rs, `{"via":["local.test","down.test","remote.test"],"order":"1"}`)
		f.child(t, space, wrong, `{"via":["remote.test"],"order":"2"}`)
		f.child(t, space, "!far:remote.test", `{"via":["a.test","b.test","c.test","remote.test"],"order":"3"}`)
		stripped := func(child, order string) string {
			return `{"type":"m.space.child","state_key":"` + child + `","content":{"via":["remote.test"],"order":"` + order +
				`"},"sender":"@carol:remote.test","origin_server_ts":1}`
		}
		fr.answers[remote+" "+rs] = `{"room":{"room_id":"` + rs + `","name":"Remote space","room_type":"m.space","num_joined_members":3,
			"join_rule":"public","world_readable":false,"guest_can_join":false,"im.nheko.summary.version":"10",
			"children_state":[` + stripped(y, "2") + `,` + stripped(x, "1") + `,` + stripped(z, "3") + `]},
			"children":[{"room_id":"` + x + `","name":"X","num_joined_members":1,"join_rule":"public","world_readable":false,"guest_can_join":false},
				{"room_id":"` + y + `","name":"Y","num_joined_members":1,"join_rule":"restricted","allowed_room_ids":["` + space + `"],
				 "world_readable":false,"guest_can_join":false},
				{"room_id":5}],
			"inaccessible_children":["` + z + `"]}`
		fr.answers[remote+" "+wrong] = `{"room":{"room_id":"!other:remote.test","join_rule":"public"},"children":[],"inaccessible_children":[]}`
		fr.answers["c.test "+"!far:remote.test"] = `{"room":{"room_id":"!far:remote.test","join_rule":"public"}}`

		// bob, outside the space, does not see the restricted Y; the room
		// "!far" is asked of its first three servers.
		const far = "!far:remote.test"
		if got := f.ids(t, bob, spaces.Request{RoomID: space}); !slices.Equal(got, []string{space, rs, x, far}) {
			t.Fatalf("bob's hierarchy %v", got)
		}
		wantAsked := []string{"down.test " + rs + " false", "remote.test " + rs + " false", "remote.test " + wrong + " false",
			"a.test !far:remote.test false", "b.test !far:remote.test false", "c.test !far:remote.test false"}
		if !slices.Equal(fr.asked, wantAsked) {
			t.Fatalf("asked %v, want %v", fr.asked, wantAsked)
		}
		res, err := f.svc.Hierarchy(ctx, bob, spaces.Request{RoomID: space, MaxDepth: -1})
		if err != nil {
			t.Fatal(err)
		}
		if e := res.Rooms[1]; e.Name != "Remote space" || e.NumJoinedMembers != 3 || e.RoomVersion != "10" || len(e.ChildrenState) != 3 ||
			e.ChildrenState[0].StateKey != x || e.ChildrenState[0].Sender != "@carol:remote.test" {
			t.Fatalf("the remote space's entry %+v", e)
		}
		// The answers were kept: only the room whose answer was not about
		// it was asked again.
		if n := fr.count(); n != len(wantAsked)+1 || fr.asked[n-1] != "remote.test "+wrong+" false" {
			t.Fatalf("asked again: %v", fr.asked[len(wantAsked):])
		}
		if _, err := f.rooms.Join(ctx, bob, space, nil, nil); err != nil {
			t.Fatal(err)
		}
		if got := f.ids(t, bob, spaces.Request{RoomID: space}); !slices.Equal(got, []string{space, rs, x, y, far}) {
			t.Fatalf("bob's hierarchy in the space %v", got)
		}
		res, err = f.svc.Hierarchy(ctx, bob, spaces.Request{RoomID: space, MaxDepth: -1})
		if err != nil {
			t.Fatal(err)
		}
		if res.Rooms[3].AllowedRoomIDs != nil {
			t.Fatalf("allowed_room_ids are for servers: %+v", res.Rooms[3])
		}

		// suggested_only is asked separately; after five minutes, asked again.
		before := fr.count()
		f.ids(t, bob, spaces.Request{RoomID: space, SuggestedOnly: true})
		if fr.count() != before {
			t.Fatalf("nothing is suggested, yet asked %v", fr.asked[before:])
		}
		later := time.Now().Add(6 * time.Minute)
		spaces.SetNow(f.svc, func() time.Time { return later })
		f.ids(t, bob, spaces.Request{RoomID: space})
		if !slices.Contains(fr.asked[before:], "remote.test "+rs+" false") {
			t.Fatalf("not asked again after five minutes: %v", fr.asked[before:])
		}

		// The summary of a room of another server.
		s, err := f.svc.Summary(ctx, alice, rs, []string{remote})
		if err != nil {
			t.Fatal(err)
		}
		if s.Name != "Remote space" || s.Membership != "leave" || s.RoomVersion != "10" || s.UnstableVersion != "10" || s.ChildrenState != nil {
			t.Fatalf("the remote summary %+v", s)
		}
		if !strings.HasSuffix(fr.asked[len(fr.asked)-1], " true") {
			t.Fatalf("a summary asks with suggested_only: %v", fr.asked)
		}
		_, err = f.svc.Summary(ctx, alice, wrong, []string{remote})
		wantErr(t, err, 404, "M_NOT_FOUND")
		_, err = f.svc.Summary(ctx, alice, rs, nil)
		wantErr(t, err, 400, "M_MISSING_PARAM")
		fr.answers[remote+" !inv:remote.test"] = `{"room":{"room_id":"!inv:remote.test","join_rule":"invite","world_readable":false}}`
		_, err = f.svc.Summary(ctx, alice, "!inv:remote.test", []string{remote})
		wantErr(t, err, 404, "M_NOT_FOUND")
		fr.answers[remote+" !wr:remote.test"] = `{"room":{"room_id":"!wr:remote.test","join_rule":"invite","world_readable":true}}`
		if _, err = f.svc.Summary(ctx, "", "!wr:remote.test", []string{remote}); err != nil {
			t.Fatal(err)
		}
	})
}

// Another server is told of a space's children this server is in: the
// entries it may see, the IDs of those it may not; children not known
// here are not named.
func TestFederationHierarchy(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		f := newFixture(t, db, nil)
		space := f.create(t, alice, "public_chat", true)
		pub := f.create(t, alice, "public_chat", false)
		sub := f.create(t, alice, "public_chat", true)
		priv := f.create(t, alice, "private_chat", false)
		f.child(t, space, pub, `{"via":["local.test"],"order":"a","suggested":true}`)
		f.child(t, space, sub, `{"via":["local.test"],"order":"b"}`)
		f.child(t, space, priv, `{"via":["local.test"],"order":"c","suggested":true}`)
		f.child(t, space, "!elsewhere:remote.test", `{"via":["remote.test"]}`)
		f.child(t, sub, pub, `{"via":["local.test"]}`)

		fed, err := f.svc.FederationHierarchy(ctx, remote, space, false)
		if err != nil {
			t.Fatal(err)
		}
		if fed.Room.RoomID != space || len(fed.Room.ChildrenState) != 4 || len(fed.Children) != 2 ||
			fed.Children[0].RoomID != pub || fed.Children[1].RoomID != sub || fed.Children[1].ChildrenState != nil ||
			!slices.Equal(fed.InaccessibleChildren, []string{priv}) {
			t.Fatalf("the space for another server %+v", fed)
		}
		b, _ := json.Marshal(fed)
		var wire struct {
			Room     map[string]any   `json:"room"`
			Children []map[string]any `json:"children"`
		}
		if err := json.Unmarshal(b, &wire); err != nil {
			t.Fatal(err)
		}
		if _, ok := wire.Room["children_state"]; !ok {
			t.Fatalf("the room without its children: %s", b)
		}
		for _, c := range wire.Children {
			if _, ok := c["children_state"]; ok {
				t.Fatalf("children carry their children: %s", b)
			}
		}
		fed, err = f.svc.FederationHierarchy(ctx, remote, space, true)
		if err != nil {
			t.Fatal(err)
		}
		if len(fed.Room.ChildrenState) != 2 || len(fed.Children) != 1 || !slices.Equal(fed.InaccessibleChildren, []string{priv}) {
			t.Fatalf("suggested only %+v", fed)
		}
		_, err = f.svc.FederationHierarchy(ctx, remote, "!unknown:local.test", false)
		wantErr(t, err, 404, "M_NOT_FOUND")
		_, err = f.svc.FederationHierarchy(ctx, remote, "bad", false)
		wantErr(t, err, 400, "M_INVALID_PARAM")
	})
}
