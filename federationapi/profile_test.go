package federationapi_test

import (
	"net/url"
	"testing"

	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
)

// TestFederationProfiles: a client of one daemon reads the profile of a
// user of another over /query/profile, and a user who joins a room of
// another server brings their profile in their join.
func TestFederationProfiles(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a := testutil.StartNode(t, db, nil)
		b := testutil.StartNode(t, testutil.SQLite(t), nil)
		r := newFedRoom(t, a, "profiles")
		a.Must(t, "PUT", clientV3+"/profile/"+url.PathEscape(r.alice.UserID)+"/displayname", r.alice.Token, map[string]any{"displayname": "Alice"})
		a.Must(t, "PUT", clientV3+"/profile/"+url.PathEscape(r.alice.UserID)+"/avatar_url", r.alice.Token, map[string]any{"avatar_url": "mxc://a/1"})
		bob := b.Register(t, "bob", "")
		b.Must(t, "PUT", clientV3+"/profile/"+url.PathEscape(bob.UserID)+"/displayname", bob.Token, map[string]any{"displayname": "Bob"})

		// Through B's client API, asked of A.
		got := b.Must(t, "GET", clientV3+"/profile/"+url.PathEscape(r.alice.UserID), "", nil)
		if got["displayname"] != "Alice" || got["avatar_url"] != "mxc://a/1" || len(got) != 2 {
			t.Fatalf("alice's profile through B: %v", got)
		}
		if got := b.Must(t, "GET", clientV3+"/profile/"+url.PathEscape(r.alice.UserID)+"/displayname", "", nil); got["displayname"] != "Alice" || len(got) != 1 {
			t.Fatalf("alice's display name through B: %v", got)
		}
		r404 := b.Do(t, "GET", clientV3+"/profile/"+url.PathEscape("@nobody:"+a.ServerName), "", nil)
		if r404.Status != 404 || r404.Errcode() != "M_NOT_FOUND" {
			t.Fatalf("an unknown user of A through B: %d %s", r404.Status, r404.Raw)
		}

		// /query/profile as it is answered.
		peer := asNode(t, b)
		q := fedV1 + "/query/profile?user_id=" + url.QueryEscape(r.alice.UserID)
		if got := fedMust(t, a, peer, "GET", q+"&field=avatar_url", nil); got["avatar_url"] != "mxc://a/1" || len(got) != 1 {
			t.Fatalf("/query/profile avatar_url: %v", got)
		}
		expectFedError(t, a, peer, "GET", q+"&field=email", nil, 400, "M_INVALID_PARAM")
		expectFedError(t, a, peer, "GET", fedV1+"/query/profile", nil, 400, "M_MISSING_PARAM")
		// A server part that is no server name is a bad request, not an
		// unknown user.
		expectFedError(t, a, peer, "GET", fedV1+"/query/profile?user_id="+url.QueryEscape("@user1:localhost:http"), nil, 400, "M_INVALID_PARAM")
		expectFedError(t, a, peer, "GET", fedV1+"/query/profile?user_id="+url.QueryEscape(bob.UserID), nil, 404, "M_NOT_FOUND")

		// bob joins alice's room: his join, built by B, carries his name.
		r.joinFrom(t, b, bob, "#profiles:"+a.ServerName)
		evs, err := a.Store.RoomStateEvents(t.Context(), r.roomID, []storage.StateKey{{Type: spec.MRoomMember, StateKey: bob.UserID}})
		if err != nil || len(evs) != 1 {
			t.Fatalf("bob's member event on A: %v %v", evs, err)
		}
		if content := string(pdusOf(t, a, r.roomID, []any{mustEvent(t, a, peer, evs[0].EventID)})[0].Content()); content != `{"displayname":"Bob","membership":"join"}` {
			t.Fatalf("bob's join on A: %s", content)
		}

		// bob renames himself on B: his new member event reaches A's room.
		b.Must(t, "PUT", clientV3+"/profile/"+url.PathEscape(bob.UserID)+"/displayname", bob.Token, map[string]any{"displayname": "Robert"})
		testutil.Eventually(t, "bob's new name to reach A", func() bool {
			m := a.Must(t, "GET", r.path("/state/m.room.member/"+url.PathEscape(bob.UserID)), r.alice.Token, nil)
			return m["displayname"] == "Robert" && m["membership"] == "join"
		})
	})
}
