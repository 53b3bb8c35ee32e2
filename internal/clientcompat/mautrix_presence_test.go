//go:build goolm

package clientcompat

import (
	"context"
	"testing"
	"time"

	"maunium.net/go/mautrix"
	"maunium.net/go/mautrix/event"
	"maunium.net/go/mautrix/id"

	"github.com/keyserver/keyserver/internal/testutil"
)

// presenceClient is a mautrix-go client of a registered user.
func presenceClient(t *testing.T, n *testutil.Node, u *testutil.User) *mautrix.Client {
	t.Helper()
	cli, err := mautrix.NewClient(n.URL, id.UserID(u.UserID), u.Token)
	if err != nil {
		t.Fatal(err)
	}
	cli.DeviceID = id.DeviceID(u.DeviceID)
	return cli
}

// mautrix-go on two federated daemons: alice sets her presence with a
// status message through her client; bob's client, in a room with her,
// receives it as an m.presence event of its sync (the library's own
// syncer parses and dispatches it) and reads it with GET /presence.
func TestRealClientSeesPresence(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		a := testutil.StartNode(t, db, nil)
		b := testutil.StartNode(t, testutil.SQLite(t), nil)
		alice, bob := presenceClient(t, a, a.Register(t, "alice", "ALICEDEV")), presenceClient(t, b, b.Register(t, "bob", "BOBDEV"))

		room, err := alice.CreateRoom(ctx, &mautrix.ReqCreateRoom{Preset: "private_chat", Invite: []id.UserID{bob.UserID}})
		if err != nil {
			t.Fatalf("alice creates the room: %v", err)
		}
		testutil.Eventually(t, "bob to join through alice's invite", func() bool {
			_, err := bob.JoinRoomByID(ctx, room.RoomID)
			return err == nil
		})
		testutil.Eventually(t, "alice's server to see bob joined", func() bool {
			m, err := alice.JoinedMembers(ctx, room.RoomID)
			return err == nil && len(m.Joined) == 2
		})

		// bob's client syncs as clients do, its syncer dispatching events.
		var seen *event.PresenceEventContent
		syncer := bob.Syncer.(*mautrix.DefaultSyncer)
		syncer.OnEventType(event.EphemeralEventPresence, func(_ context.Context, evt *event.Event) {
			if evt.Sender == alice.UserID && evt.Content.AsPresence().StatusMessage == "writing tests" {
				seen = evt.Content.AsPresence()
			}
		})
		resp, err := bob.SyncRequest(ctx, 0, "", "", false, event.PresenceOnline)
		if err != nil {
			t.Fatal(err)
		}
		since := resp.NextBatch
		if err := syncer.ProcessResponse(ctx, resp, ""); err != nil {
			t.Fatal(err)
		}

		if err := alice.SetPresence(ctx, mautrix.ReqPresence{Presence: event.PresenceUnavailable, StatusMsg: "writing tests"}); err != nil {
			t.Fatalf("alice sets her presence: %v", err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for seen == nil {
			if time.Now().After(deadline) {
				t.Fatal("bob's client never saw alice's presence")
			}
			resp, err := bob.SyncRequest(ctx, 5000, since, "", false, event.PresenceOnline)
			if err != nil {
				t.Fatal(err)
			}
			if err := syncer.ProcessResponse(ctx, resp, since); err != nil {
				t.Fatal(err)
			}
			since = resp.NextBatch
		}
		if seen.Presence != event.PresenceUnavailable || seen.CurrentlyActive {
			t.Fatalf("bob's client saw %+v", seen)
		}
		got, err := bob.GetPresence(ctx, alice.UserID)
		if err != nil || got.Presence != event.PresenceUnavailable || got.StatusMsg != "writing tests" {
			t.Fatalf("bob's GET of alice: %+v %v", got, err)
		}
	})
}
