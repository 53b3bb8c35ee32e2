package clientapi_test

import (
	"encoding/json"
	"net/url"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

// Room behaviours clients and the homeserver test suites rely on, as
// Synapse answers them.
func TestRoomBehavioursClientsRelyOn(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "public_chat", "topic": "cakes"})

		// createRoom's topic carries the rich m.topic too.
		topic := srv.Must(t, "GET", roomPath(roomID, "/state/m.room.topic/"), alice.Token, nil)
		rich, _ := json.Marshal(topic["m.topic"])
		if topic["topic"] != "cakes" || string(rich) != `{"m.text":[{"body":"cakes","mimetype":"text/plain"}]}` {
			t.Fatalf("topic content %v", topic)
		}

		// format=event answers the whole event; without it, the content.
		ev := srv.Must(t, "GET", roomPath(roomID, "/state/m.room.topic/?format=event"), alice.Token, nil)
		if ev["type"] != "m.room.topic" || ev["state_key"] != "" || ev["sender"] != alice.UserID || ev["room_id"] != roomID ||
			ev["event_id"] == nil || ev["content"].(map[string]any)["topic"] != "cakes" {
			t.Fatalf("format=event: %v", ev)
		}
		if r := srv.Do(t, "GET", roomPath(roomID, "/state/m.room.name/?format=event"), alice.Token, nil); r.Status != 404 {
			t.Fatalf("absent state with format=event: %d %s", r.Status, r.Raw)
		}

		// The same state set again by its sender is the same event.
		first := srv.Must(t, "PUT", roomPath(roomID, "/state/m.room.name/"), alice.Token, map[string]any{"name": "Cakes", "x": []int{1, 2}})["event_id"]
		since := roomSync(t, srv, alice, nil)["next_batch"].(string)
		again := srv.Must(t, "PUT", roomPath(roomID, "/state/m.room.name/"), alice.Token, json.RawMessage(`{ "x": [1,2], "name": "Cakes" }`))["event_id"]
		if again != first {
			t.Fatalf("the same name twice: %v then %v", first, again)
		}
		if tl := section(t, roomSync(t, srv, alice, url.Values{"since": {since}, "timeout": {"0"}}), "join", roomID); tl != nil {
			t.Fatalf("setting the same state made an event: %v", tl)
		}
		if other := srv.Must(t, "PUT", roomPath(roomID, "/state/m.room.name/"), alice.Token, map[string]any{"name": "Pies"})["event_id"]; other == first {
			t.Fatal("other content answered the old event")
		}

		// Extra fields of /join (reason, a per-room name) reach the join.
		srv.Must(t, "POST", "/_matrix/client/v3/join/"+url.PathEscape(roomID), bob.Token,
			map[string]any{"reason": "hungry", "displayname": "Bob in cakes", "org.example.extra": 7})
		member := srv.Must(t, "GET", roomPath(roomID, "/state/m.room.member/"+url.PathEscape(bob.UserID)), bob.Token, nil)
		if member["membership"] != "join" || member["reason"] != "hungry" || member["displayname"] != "Bob in cakes" || member["org.example.extra"] != float64(7) {
			t.Fatalf("bob's join %v", member)
		}
		expectError(t, srv, "POST", "/_matrix/client/v3/rooms/"+url.PathEscape(roomID)+"/join", bob.Token, map[string]any{"reason": 5}, 400, "M_BAD_JSON")
		expectError(t, srv, "POST", "/_matrix/client/v3/join/"+url.PathEscape(roomID), bob.Token, map[string]any{"membership": "leave"}, 200, "")

		// joined_members is for joined members: one who left gets 403.
		if got := srv.Must(t, "GET", roomPath(roomID, "/joined_members"), bob.Token, nil)["joined"].(map[string]any); len(got) != 2 {
			t.Fatalf("joined members %v", got)
		}
		srv.Must(t, "POST", roomPath(roomID, "/leave"), bob.Token, map[string]any{})
		expectError(t, srv, "GET", roomPath(roomID, "/joined_members"), bob.Token, nil, 403, "M_FORBIDDEN")

		// An invite that cannot be made is the caller's error; the room is
		// made all the same.
		r := srv.Do(t, "POST", "/_matrix/client/v3/createRoom", alice.Token, map[string]any{"invite": []string{"@carol:elsewhere.example"}})
		if r.Status == 200 || r.Errcode() == "" {
			t.Fatalf("createRoom with an invite that failed: %d %s", r.Status, r.Raw)
		}
	})
}
