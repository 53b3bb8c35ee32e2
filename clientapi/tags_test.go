package clientapi_test

import (
	"fmt"
	"net/url"
	"slices"
	"sync"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

func tagsPath(userID, roomID, tag string) string {
	p := "/_matrix/client/v3/user/" + url.PathEscape(userID) + "/rooms/" + url.PathEscape(roomID) + "/tags"
	if tag != "" {
		p += "/" + url.PathEscape(tag)
	}
	return p
}

func roomTagNames(t *testing.T, srv *testutil.Server, u *testutil.User, roomID string) []string {
	t.Helper()
	tags := srv.Must(t, "GET", tagsPath(u.UserID, roomID, ""), u.Token, nil)["tags"].(map[string]any)
	var names []string
	for k := range tags {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

func TestRoomTags(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		roomID := createRoom(t, srv, alice, map[string]any{"preset": "private_chat"})
		since := roomSync(t, srv, alice, nil)["next_batch"].(string)

		if got := roomTagNames(t, srv, alice, roomID); len(got) != 0 {
			t.Fatalf("a room with no tags: %q", got)
		}
		srv.Must(t, "PUT", tagsPath(alice.UserID, roomID, "m.favourite"), alice.Token, map[string]any{"order": 0.25})
		srv.Must(t, "PUT", tagsPath(alice.UserID, roomID, "u.work"), alice.Token, map[string]any{})
		tags := srv.Must(t, "GET", tagsPath(alice.UserID, roomID, ""), alice.Token, nil)["tags"].(map[string]any)
		if fav := tags["m.favourite"].(map[string]any); fav["order"] != 0.25 || len(tags) != 2 {
			t.Fatalf("tags %v", tags)
		}

		// The room's account data in /sync carries them.
		room := section(t, roomSync(t, srv, alice, url.Values{"since": {since}}), "join", roomID)
		var found bool
		for _, e := range room["account_data"].(map[string]any)["events"].([]any) {
			ev := e.(map[string]any)
			if ev["type"] == "m.tag" {
				found = len(ev["content"].(map[string]any)["tags"].(map[string]any)) == 2
			}
		}
		if !found {
			t.Fatalf("no m.tag with both tags in /sync: %v", room["account_data"])
		}

		srv.Must(t, "DELETE", tagsPath(alice.UserID, roomID, "u.work"), alice.Token, nil)
		srv.Must(t, "DELETE", tagsPath(alice.UserID, roomID, "u.never-set"), alice.Token, nil)
		expectEvents(t, "after a delete", roomTagNames(t, srv, alice, roomID), "m.favourite")

		// Tags set at once all stay.
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				srv.Must(t, "PUT", tagsPath(alice.UserID, roomID, fmt.Sprintf("u.t%d", i)), alice.Token, map[string]any{})
			}()
		}
		wg.Wait()
		expectEvents(t, "after concurrent sets", roomTagNames(t, srv, alice, roomID),
			"m.favourite", "u.t0", "u.t1", "u.t2", "u.t3", "u.t4", "u.t5", "u.t6", "u.t7")

		// Mistakes change nothing.
		for _, c := range []struct {
			method, path, token string
			body                any
			status              int
			errcode             string
		}{
			{"PUT", tagsPath(alice.UserID, roomID, "x"), bob.Token, map[string]any{}, 403, "M_FORBIDDEN"},
			{"GET", tagsPath(alice.UserID, roomID, ""), bob.Token, nil, 403, "M_FORBIDDEN"},
			{"DELETE", tagsPath(alice.UserID, roomID, "m.favourite"), bob.Token, nil, 403, "M_FORBIDDEN"},
			{"PUT", tagsPath(alice.UserID, roomID, "x"), alice.Token, map[string]any{"order": "first"}, 400, "M_BAD_JSON"},
			{"PUT", tagsPath(alice.UserID, roomID, "x"), alice.Token, "[1]", 400, "M_BAD_JSON"},
			{"PUT", tagsPath(alice.UserID, "not-a-room", "x"), alice.Token, map[string]any{}, 400, "M_INVALID_PARAM"},
		} {
			expectError(t, srv, c.method, c.path, c.token, c.body, c.status, c.errcode)
		}
		if got := roomTagNames(t, srv, alice, roomID); len(got) != 9 {
			t.Fatalf("tags after refused changes: %q", got)
		}
	})
}
