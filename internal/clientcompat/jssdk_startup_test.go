package clientcompat

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

// matrix-js-sdk's start-up, call by call, against a daemon. Followed:
// matrix-js-sdk's src/sync.ts as of its 2023 and later releases (the
// SyncApi.sync whose first /sync of a new store sends the filter inline;
// the exact release tag was not pinned), with MatrixClient.startClient
// and the Rust crypto around it: /versions (the features, and whether
// lazy loading is supported), /capabilities, the push rules
// (getPushRules), the upload of the sync filter (buildDefaultFilter with
// unread thread notifications, checkLazyLoadStatus adding lazy-loaded
// members), the initial /sync with that filter inline and the timeline
// limit of initialSyncLimit (8), then /sync with the filter's ID; the
// key backup check (/room_keys/version), /account/whoami, and the call
// handler's /voip/turnServer. Each answer must be one the library goes on
// with.
func TestMatrixJSSDKStartup(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, func(c *config.Config) {
			c.ClientAPI.TURN = config.TURNConfig{URIs: []string{"turn:turn.test.local:3478?transport=udp"}, SharedSecret: "s3cret", UserLifetime: config.Duration(time.Hour)}
		})
		alice := n.Register(t, "alice", "")
		bob := n.Register(t, "bob", "")
		carol := n.Register(t, "carol", "")
		// A room with history and members who do not speak, so that the
		// lazy loading and the limit show.
		roomID := n.Must(t, "POST", "/_matrix/client/v3/createRoom", bob.Token, map[string]any{"preset": "public_chat", "name": "Start-up"})["room_id"].(string)
		join := func(u *testutil.User) {
			n.Must(t, "POST", "/_matrix/client/v3/rooms/"+url.PathEscape(roomID)+"/join", u.Token, map[string]any{})
		}
		say := func(u *testutil.User, txn string) {
			n.Must(t, "PUT", "/_matrix/client/v3/rooms/"+url.PathEscape(roomID)+"/send/m.room.message/"+txn, u.Token,
				map[string]any{"msgtype": "m.text", "body": txn})
		}
		join(carol)
		join(alice)
		for i := range 10 {
			say(bob, fmt.Sprint("b", i))
		}

		// GET /versions: the spec versions; r0.5.0 (or the unstable
		// feature) is what doesServerSupportLazyLoading looks for.
		versions := n.Must(t, "GET", "/_matrix/client/versions", "", nil)
		vs, _ := versions["versions"].([]any)
		features, _ := versions["unstable_features"].(map[string]any)
		if !slices.Contains(vs, any("r0.5.0")) && features["m.lazy_load_members"] != true {
			t.Fatalf("/versions does not tell lazy loading apart: %v", versions)
		}
		if !slices.Contains(vs, any("v1.1")) {
			t.Fatalf("/versions: %v", versions)
		}

		// GET /capabilities: the room versions.
		caps := n.Must(t, "GET", "/_matrix/client/v3/capabilities", alice.Token, nil)
		rv, _ := caps["capabilities"].(map[string]any)["m.room_versions"].(map[string]any)
		if rv == nil || rv["default"] == nil || len(rv["available"].(map[string]any)) == 0 {
			t.Fatalf("/capabilities: %v", caps)
		}

		// GET /pushrules/: the server's defaults, in their kinds.
		rules := n.Must(t, "GET", "/_matrix/client/v3/pushrules/", alice.Token, nil)
		global, _ := rules["global"].(map[string]any)
		for kind, id := range map[string]string{"override": ".m.rule.master", "underride": ".m.rule.message", "content": ".m.rule.contains_user_name"} {
			var ids []any
			list, _ := global[kind].([]any)
			for _, r := range list {
				ids = append(ids, r.(map[string]any)["rule_id"])
			}
			if !slices.Contains(ids, any(id)) {
				t.Fatalf("push rules %s without %s: %v", kind, id, ids)
			}
		}

		// POST /user/{userId}/filter: the filter buildDefaultFilter and
		// checkLazyLoadStatus make.
		const filter = `{"room":{"state":{"lazy_load_members":true},"timeline":{"unread_thread_notifications":true}}}`
		r := n.Do(t, "POST", "/_matrix/client/v3/user/"+url.PathEscape(alice.UserID)+"/filter", alice.Token, rawJSON(filter))
		filterID, _ := r.Body["filter_id"].(string)
		if r.Status != http.StatusOK || filterID == "" {
			t.Fatalf("filter upload: %d %s", r.Status, r.Raw)
		}

		// The initial /sync: the filter inline with the timeline limit.
		const initialFilter = `{"room":{"state":{"lazy_load_members":true},"timeline":{"unread_thread_notifications":true,"limit":8}}}`
		first := n.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0&filter="+url.QueryEscape(initialFilter), alice.Token, nil)
		room := joinedRoom(t, first, roomID)
		tl := room["timeline"].(map[string]any)
		if evs := tl["events"].([]any); len(evs) != 8 || tl["limited"] != true || tl["prev_batch"] == nil {
			t.Fatalf("initial timeline: %d events, limited %v, prev_batch %v", len(evs), tl["limited"], tl["prev_batch"])
		}
		if got := memberKeys(room); !slices.Equal(got, []string{alice.UserID, bob.UserID}) {
			t.Fatalf("lazy-loaded members %v, want the sender's and the user's", got)
		}
		// prev_batch is where /messages (its lazy-loading filter, as the
		// library's timeline window sends it) pages back from.
		page := n.Must(t, "GET", "/_matrix/client/v3/rooms/"+url.PathEscape(roomID)+"/messages?dir=b&limit=30&from="+
			url.QueryEscape(tl["prev_batch"].(string))+"&filter="+url.QueryEscape(`{"lazy_load_members":true}`), alice.Token, nil)
		if chunk, _ := page["chunk"].([]any); len(chunk) == 0 || len(page["state"].([]any)) == 0 {
			t.Fatalf("/messages back from prev_batch: %v", page)
		}

		// The sync loop: the filter's ID; carol speaks, her member event
		// comes with it.
		say(carol, "c0")
		next := n.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0&filter="+filterID+"&since="+url.QueryEscape(first["next_batch"].(string)), alice.Token, nil)
		if got := memberKeys(joinedRoom(t, next, roomID)); !slices.Equal(got, []string{carol.UserID}) {
			t.Fatalf("the next sync's members %v, want carol's only", got)
		}
		// /members (not_membership=leave, at the sync token), as
		// loadMembersIfNeeded asks once the room is opened.
		members := n.Must(t, "GET", "/_matrix/client/v3/rooms/"+url.PathEscape(roomID)+"/members?not_membership=leave&at="+
			url.QueryEscape(next["next_batch"].(string)), alice.Token, nil)
		if chunk, _ := members["chunk"].([]any); len(chunk) != 3 {
			t.Fatalf("/members: %v", members)
		}

		// GET /room_keys/version: no backup yet is 404 M_NOT_FOUND (the
		// library reads it as "none"); once one is made, its version.
		if r := n.Do(t, "GET", "/_matrix/client/v3/room_keys/version", alice.Token, nil); r.Status != http.StatusNotFound || r.Errcode() != "M_NOT_FOUND" {
			t.Fatalf("backup version without a backup: %d %s", r.Status, r.Raw)
		}
		made := n.Must(t, "POST", "/_matrix/client/v3/room_keys/version", alice.Token, map[string]any{
			"algorithm": "m.megolm_backup.v1.curve25519-aes-sha2", "auth_data": map[string]any{"public_key": testutil.RandomKey()}})
		got := n.Must(t, "GET", "/_matrix/client/v3/room_keys/version", alice.Token, nil)
		if got["version"] != made["version"] || got["algorithm"] != "m.megolm_backup.v1.curve25519-aes-sha2" || got["etag"] == nil {
			t.Fatalf("backup version %v, made %v", got, made)
		}

		// GET /account/whoami and /voip/turnServer.
		who := n.Must(t, "GET", "/_matrix/client/v3/account/whoami", alice.Token, nil)
		if who["user_id"] != alice.UserID || who["device_id"] != alice.DeviceID {
			t.Fatalf("whoami: %v", who)
		}
		turn := n.Must(t, "GET", "/_matrix/client/v3/voip/turnServer", alice.Token, nil)
		if uris, _ := turn["uris"].([]any); len(uris) != 1 || turn["username"] == nil || turn["password"] == nil || turn["ttl"] == nil {
			t.Fatalf("turnServer: %v", turn)
		}
	})
}

// rawJSON is a request body sent as it is written.
type rawJSON string

func (r rawJSON) MarshalJSON() ([]byte, error) { return []byte(r), nil }

func joinedRoom(t *testing.T, sync map[string]any, roomID string) map[string]any {
	t.Helper()
	rooms, _ := sync["rooms"].(map[string]any)
	join, _ := rooms["join"].(map[string]any)
	room, _ := join[roomID].(map[string]any)
	if room == nil {
		t.Fatalf("no room %s in %v", roomID, sync)
	}
	return room
}

// memberKeys are the state keys of the m.room.member events of a /sync
// entry's state, sorted.
func memberKeys(room map[string]any) []string {
	var out []string
	for _, e := range room["state"].(map[string]any)["events"].([]any) {
		ev := e.(map[string]any)
		if ev["type"] == "m.room.member" {
			out = append(out, ev["state_key"].(string))
		}
	}
	slices.Sort(out)
	return out
}
