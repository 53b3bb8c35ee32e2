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

// plainClient is a mautrix-go client of a user, syncing through the
// library's own syncer.
func plainClient(t *testing.T, n *testutil.Node, u *testutil.User) (*mautrix.Client, *mautrix.DefaultSyncer) {
	t.Helper()
	cli, err := mautrix.NewClient(n.URL, id.UserID(u.UserID), u.Token)
	if err != nil {
		t.Fatal(err)
	}
	cli.DeviceID = id.DeviceID(u.DeviceID)
	syncer := mautrix.NewDefaultSyncer()
	cli.Syncer = syncer
	return cli, syncer
}

// mautrix-go sees another user's typing and read receipt in its /sync,
// parsed by the library, and its room's unread count go back to 0 after
// its own receipt.
func TestRealClientSeesTypingReceiptsAndUnreadCounts(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		n := testutil.StartNode(t, db, nil)
		alice, bob := n.Register(t, "alice", "ALICEDEV"), n.Register(t, "bob", "BOBDEV")
		ac, _ := plainClient(t, n, alice)
		bc, bs := plainClient(t, n, bob)

		created, err := ac.CreateRoom(ctx, &mautrix.ReqCreateRoom{Preset: "public_chat"})
		if err != nil {
			t.Fatal(err)
		}
		room := created.RoomID
		if _, err := bc.JoinRoomByID(ctx, room); err != nil {
			t.Fatal(err)
		}
		if _, err := ac.SendText(ctx, room, "one"); err != nil {
			t.Fatal(err)
		}
		last, err := ac.SendText(ctx, room, "two")
		if err != nil {
			t.Fatal(err)
		}

		var typing []id.UserID
		aliceRead := false
		bs.OnEventType(event.EphemeralEventTyping, func(_ context.Context, evt *event.Event) {
			if evt.RoomID == room {
				typing = evt.Content.AsTyping().UserIDs
			}
		})
		bs.OnEventType(event.EphemeralEventReceipt, func(_ context.Context, evt *event.Event) {
			if evt.RoomID != room {
				return
			}
			if _, ok := (*evt.Content.AsReceipt())[last.EventID][event.ReceiptTypeRead][id.UserID(alice.UserID)]; ok {
				aliceRead = true
			}
		})
		unread := -1
		since := ""
		// syncUntil syncs bob's client, long-polling, until cond holds.
		syncUntil := func(what string, cond func() bool) {
			t.Helper()
			deadline := time.Now().Add(30 * time.Second)
			for !cond() {
				if time.Now().After(deadline) {
					t.Fatalf("bob's client never saw %s", what)
				}
				timeout := 5000
				if since == "" {
					timeout = 0
				}
				resp, err := bc.SyncRequest(ctx, timeout, since, "", false, event.PresenceOnline)
				if err != nil {
					t.Fatal(err)
				}
				if err := bs.ProcessResponse(ctx, resp, since); err != nil {
					t.Fatal(err)
				}
				if r := resp.Rooms.Join[room]; r != nil && r.UnreadNotifications != nil {
					unread = r.UnreadNotifications.NotificationCount
				}
				since = resp.NextBatch
			}
		}
		syncUntil("two unread messages", func() bool { return unread == 2 })

		if _, err := ac.UserTyping(ctx, room, true, 30*time.Second); err != nil {
			t.Fatal(err)
		}
		syncUntil("alice typing", func() bool { return len(typing) == 1 && typing[0] == id.UserID(alice.UserID) })
		if err := ac.MarkRead(ctx, room, last.EventID); err != nil {
			t.Fatal(err)
		}
		syncUntil("alice's read receipt", func() bool { return aliceRead })
		if _, err := ac.UserTyping(ctx, room, false, 0); err != nil {
			t.Fatal(err)
		}
		syncUntil("alice no longer typing", func() bool { return typing != nil && len(typing) == 0 })

		if unread != 2 {
			t.Fatalf("unread count %d before bob's receipt, want 2", unread)
		}
		if err := bc.MarkRead(ctx, room, last.EventID); err != nil {
			t.Fatal(err)
		}
		syncUntil("the unread count back to 0", func() bool { return unread == 0 })
	})
}
