package initialsync_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/initialsync"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/server"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

const (
	local = "local.test"
	alice = "@alice:local.test"
	bob   = "@bob:local.test"
)

type fixture struct {
	store *sqlstore.Store
	rooms *roomserver.Service
	sync  *initialsync.Service
}

func newFixture(t *testing.T, db testdb.Database) fixture {
	t.Helper()
	store, err := sqlstore.Open(context.Background(), db.URI, local)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	log := logrus.New()
	log.SetOutput(io.Discard)
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	rooms := roomserver.New(store, roomserver.Options{ServerName: local, KeyID: "ed25519:k", PrivateKey: key, Logger: log})
	return fixture{store: store, rooms: rooms, sync: initialsync.New(server.InitialSyncRooms(rooms), store)}
}

func (f fixture) create(t *testing.T, creator string, req roomserver.CreateRoomRequest) string {
	t.Helper()
	id, err := f.rooms.CreateRoom(context.Background(), creator, req)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func (f fixture) send(t *testing.T, sender, roomID, body string) {
	t.Helper()
	if _, err := f.rooms.Send(context.Background(), sender, "D", roomID, "m.room.message", body,
		json.RawMessage(`{"body":"`+body+`"}`)); err != nil {
		t.Fatal(err)
	}
}

// messageBodies are the bodies of the messages among events (client
// events, encoded or not).
func messageBodies(events any) []string {
	var evs []struct {
		Type    string          `json:"type"`
		Content json.RawMessage `json:"content"`
	}
	js, _ := json.Marshal(events)
	_ = json.Unmarshal(js, &evs)
	out := []string{}
	for _, ev := range evs {
		if ev.Type == "m.room.message" {
			var c struct{ Body string }
			_ = json.Unmarshal(ev.Content, &c)
			out = append(out, c.Body)
		}
	}
	return out
}

func roomByID(t *testing.T, res initialsync.Response, roomID string) *initialsync.Room {
	t.Helper()
	for i := range res.Rooms {
		if res.Rooms[i].RoomID == roomID {
			return &res.Rooms[i]
		}
	}
	return nil
}

// GET /initialSync: the rooms a user is joined to with their state and
// latest messages oldest first, those invited to without either, those
// left only when archived, and the user's account data, each room's with
// its room.
func TestAll(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		f := newFixture(t, db)
		joined := f.create(t, alice, roomserver.CreateRoomRequest{Visibility: "public"})
		for i := 0; i < 5; i++ {
			f.send(t, alice, joined, "m"+strconv.Itoa(i))
		}
		invited := f.create(t, bob, roomserver.CreateRoomRequest{Invite: []string{alice}})
		left := f.create(t, bob, roomserver.CreateRoomRequest{Visibility: "public"})
		f.send(t, bob, left, "before")
		if _, err := f.rooms.Join(ctx, alice, left, nil, nil); err != nil {
			t.Fatal(err)
		}
		f.send(t, bob, left, "while in")
		if err := f.rooms.Leave(ctx, alice, left, ""); err != nil {
			t.Fatal(err)
		}
		f.send(t, bob, left, "after")
		f.create(t, bob, roomserver.CreateRoomRequest{}) // alice is not in it
		for _, d := range []struct{ room, typ, content string }{
			{"", "m.direct", `{"x":1}`}, {joined, "m.tag", `{"tags":{}}`}, {left, "org.example", `{"y":2}`},
		} {
			if _, err := f.store.SetAccountData(ctx, alice, d.room, d.typ, []byte(d.content)); err != nil {
				t.Fatal(err)
			}
		}

		res, err := f.sync.All(ctx, alice, 3, false)
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Rooms) != 2 || len(res.AccountData) != 1 || res.AccountData[0].Type != "m.direct" || res.End == "" {
			t.Fatalf("%d rooms, account data %+v, end %q", len(res.Rooms), res.AccountData, res.End)
		}
		j := roomByID(t, res, joined)
		if j == nil || j.Membership != "join" || j.Visibility != "public" || len(j.AccountData) != 1 || j.AccountData[0].Type != "m.tag" {
			t.Fatalf("joined room %+v", j)
		}
		if got := messageBodies(j.Messages.Chunk); !slices.Equal(got, []string{"m2", "m3", "m4"}) {
			t.Fatalf("joined room's messages %q", got)
		}
		if !slices.ContainsFunc(j.State, func(ev json.RawMessage) bool { return strings.Contains(string(ev), `"type":"m.room.create"`) }) {
			t.Fatal("the joined room's state has no create event")
		}
		// Its start pages back from the first message shown.
		back, err := f.rooms.Messages(ctx, roomserver.MessagesRequest{UserID: alice, RoomID: joined, From: j.Messages.Start, Dir: "b", Limit: "2",
			Filter: `{"types":["m.room.message"]}`})
		if err != nil || !slices.Equal(messageBodies(back.Chunk), []string{"m1", "m0"}) {
			t.Fatalf("paging back from start %q %v", messageBodies(back.Chunk), err)
		}
		inv := roomByID(t, res, invited)
		if inv == nil || inv.Membership != "invite" || inv.Messages != nil || inv.State != nil || inv.Visibility != "private" {
			t.Fatalf("invited room %+v", inv)
		}
		if roomByID(t, res, left) != nil {
			t.Fatal("a room left without archived")
		}

		res, err = f.sync.All(ctx, alice, 10, true)
		if err != nil {
			t.Fatal(err)
		}
		l := roomByID(t, res, left)
		if l == nil || l.Membership != "leave" || len(l.AccountData) != 1 {
			t.Fatalf("archived room %+v", l)
		}
		// Shared history: one who left keeps what was sent while joined.
		if got := messageBodies(l.Messages.Chunk); !slices.Equal(got, []string{"while in"}) {
			t.Fatalf("the left room's messages %q", got)
		}
		if len(res.Rooms) != 3 {
			t.Fatalf("%d rooms with archived", len(res.Rooms))
		}

		// limit 0: no messages, start and end alike.
		res, _ = f.sync.All(ctx, alice, 0, false)
		if j := roomByID(t, res, joined); len(j.Messages.Chunk) != 0 || j.Messages.Start != j.Messages.End {
			t.Fatalf("limit 0: %+v", j.Messages)
		}
	})
}

// GET /rooms/{roomId}/initialSync: as the room server lets the user read
// the room.
func TestRoom(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		f := newFixture(t, db)
		priv := f.create(t, alice, roomserver.CreateRoomRequest{})
		f.send(t, alice, priv, "secret")
		r, err := f.sync.Room(ctx, alice, priv, 10)
		if err != nil || r.Membership != "join" || !slices.Equal(messageBodies(r.Messages.Chunk), []string{"secret"}) || len(r.State) == 0 {
			t.Fatalf("a member: %+v %v", r, err)
		}
		_, err = f.sync.Room(ctx, bob, priv, 10)
		wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN")
		_, err = f.sync.Room(ctx, bob, "!nowhere:local.test", 10)
		wantErr(t, err, http.StatusNotFound, "M_NOT_FOUND")

		readable := f.create(t, alice, roomserver.CreateRoomRequest{Visibility: "public", InitialState: []roomserver.StateEvent{
			{Type: "m.room.history_visibility", Content: json.RawMessage(`{"history_visibility":"world_readable"}`)}}})
		f.send(t, alice, readable, "open")
		r, err = f.sync.Room(ctx, bob, readable, 10)
		if err != nil || r.Membership != "leave" || !slices.Equal(messageBodies(r.Messages.Chunk), []string{"open"}) || r.Visibility != "public" {
			t.Fatalf("a world-readable room to a non-member: %+v %v", r, err)
		}
		for _, c := range []struct {
			in   string
			want int
			ok   bool
		}{{"", initialsync.DefaultLimit, true}, {"0", 0, true}, {"5000", roomserver.MaxMessagesLimit, true}, {"-1", 0, false}, {"x", 0, false}} {
			n, err := initialsync.ParseLimit(c.in)
			if (err == nil) != c.ok || (c.ok && n != c.want) {
				t.Fatalf("ParseLimit(%q) = %d, %v", c.in, n, err)
			}
		}
	})
}

func wantErr(t *testing.T, err error, status int, code string) {
	t.Helper()
	var me *mxerr.Error
	if !errors.As(err, &me) || me.Status != status || me.Code != code {
		t.Fatalf("got %v, want %d %s", err, status, code)
	}
}
