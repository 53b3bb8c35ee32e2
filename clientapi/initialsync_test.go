package clientapi_test

import (
	"fmt"
	"net/url"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

func bodies(t *testing.T, chunk any) []string {
	t.Helper()
	var out []string
	for _, e := range chunk.([]any) {
		if c, ok := e.(map[string]any)["content"].(map[string]any)["body"].(string); ok {
			out = append(out, c)
		}
	}
	return out
}

func TestInitialSync(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "public_chat", "visibility": "public", "name": "talk"})
		for i := range 5 {
			srv.Must(t, "PUT", roomPath(roomID, fmt.Sprintf("/send/m.room.message/t%d", i)), alice.Token, map[string]any{"msgtype": "m.text", "body": fmt.Sprint("m", i)})
		}
		srv.Must(t, "PUT", "/_matrix/client/v3/user/"+url.PathEscape(alice.UserID)+"/account_data/org.example.x", alice.Token, map[string]any{"a": 1})
		srv.Must(t, "PUT", "/_matrix/client/v3/user/"+url.PathEscape(alice.UserID)+"/rooms/"+url.PathEscape(roomID)+"/account_data/org.example.y", alice.Token, map[string]any{"b": 2})
		invited := createRoom(t, srv, bob, map[string]any{"preset": "private_chat", "invite": []string{alice.UserID}})

		all := srv.Must(t, "GET", "/_matrix/client/v3/initialSync?limit=3", alice.Token, nil)
		if all["end"] == nil || len(all["account_data"].([]any)) != 1 || all["presence"] == nil {
			t.Fatalf("initialSync %v", all)
		}
		var joined, invite map[string]any
		for _, r := range all["rooms"].([]any) {
			room := r.(map[string]any)
			switch room["room_id"] {
			case roomID:
				joined = room
			case invited:
				invite = room
			}
		}
		if joined == nil || joined["membership"] != "join" || joined["visibility"] != "public" {
			t.Fatalf("the joined room %v", joined)
		}
		msgs := joined["messages"].(map[string]any)
		if got := bodies(t, msgs["chunk"]); fmt.Sprint(got) != "[m2 m3 m4]" || msgs["start"] == nil || msgs["end"] == nil {
			t.Fatalf("messages %v", msgs)
		}
		if len(joined["state"].([]any)) < 5 || len(joined["account_data"].([]any)) != 1 {
			t.Fatalf("state %d, account data %v", len(joined["state"].([]any)), joined["account_data"])
		}
		if invite == nil || invite["membership"] != "invite" {
			t.Fatalf("the invite %v", invite)
		}
		// Paging back from start continues the messages.
		back := srv.Must(t, "GET", roomPath(roomID, "/messages?dir=b&limit=2&from="+url.QueryEscape(msgs["start"].(string))), alice.Token, nil)
		if got := bodies(t, back["chunk"]); fmt.Sprint(got) != "[m1 m0]" {
			t.Fatalf("paging back from start: %v", got)
		}

		// One room; a left room only with archived, and up to the leave.
		one := srv.Must(t, "GET", roomPath(roomID, "/initialSync"), alice.Token, nil)
		if one["room_id"] != roomID || one["membership"] != "join" || len(bodies(t, one["messages"].(map[string]any)["chunk"])) != 5 {
			t.Fatalf("room initialSync %v", one)
		}
		srv.Must(t, "POST", roomPath(roomID, "/join"), bob.Token, map[string]any{})
		srv.Must(t, "POST", roomPath(roomID, "/leave"), bob.Token, map[string]any{})
		srv.Must(t, "PUT", roomPath(roomID, "/send/m.room.message/after"), alice.Token, map[string]any{"msgtype": "m.text", "body": "after bob"})
		for _, r := range srv.Must(t, "GET", "/_matrix/client/v3/initialSync", bob.Token, nil)["rooms"].([]any) {
			if r.(map[string]any)["room_id"] == roomID {
				t.Fatal("a left room without archived")
			}
		}
		left := srv.Must(t, "GET", roomPath(roomID, "/initialSync"), bob.Token, nil)
		for _, b := range bodies(t, left["messages"].(map[string]any)["chunk"]) {
			if b == "after bob" {
				t.Fatal("a message after bob's leave")
			}
		}
		if left["membership"] != "leave" {
			t.Fatalf("bob's membership %v", left["membership"])
		}
		// Mistakes.
		expectError(t, srv, "GET", roomPath("!nowhere:"+srv.ServerName, "/initialSync"), alice.Token, nil, 404, "M_NOT_FOUND")
		expectError(t, srv, "GET", "/_matrix/client/v3/initialSync?limit=x", alice.Token, nil, 400, "M_INVALID_PARAM")
		private := createRoom(t, srv, bob, map[string]any{"preset": "private_chat"})
		expectError(t, srv, "GET", roomPath(private, "/initialSync"), alice.Token, nil, 403, "M_FORBIDDEN")
	})
}

// Anyone may read a world-readable room's state and peek with its
// initialSync.
func TestWorldReadableStateForAnyone(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		carol := srv.Register(t, "carol", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "public_chat", "name": "open",
			"initial_state": []any{map[string]any{"type": "m.room.history_visibility", "state_key": "", "content": map[string]any{"history_visibility": "world_readable"}}}})
		if name := srv.Must(t, "GET", roomPath(roomID, "/state/m.room.name/"), carol.Token, nil); name["name"] != "open" {
			t.Fatalf("the name %v", name)
		}
		peek := srv.Must(t, "GET", roomPath(roomID, "/initialSync"), carol.Token, nil)
		if peek["membership"] != "leave" || len(peek["state"].([]any)) == 0 {
			t.Fatalf("peek %v", peek)
		}
	})
}
