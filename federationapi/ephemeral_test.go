package federationapi_test

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
)

// ephemeralIn returns the content of a room's ephemeral event of a type
// in a /sync answer (nil when there is none).
func ephemeralIn(sync map[string]any, roomID, typ string) map[string]any {
	join, _ := sync["rooms"].(map[string]any)["join"].(map[string]any)
	room, _ := join[roomID].(map[string]any)
	eph, _ := room["ephemeral"].(map[string]any)
	evs, _ := eph["events"].([]any)
	for _, e := range evs {
		if ev, _ := e.(map[string]any); ev["type"] == typ {
			c, _ := ev["content"].(map[string]any)
			return c
		}
	}
	return nil
}

// typingUsers returns the user_ids of an m.typing content; ok false
// without one.
func typingUsers(content map[string]any) (users []string, ok bool) {
	ids, ok := content["user_ids"].([]any)
	if !ok {
		return nil, false
	}
	users = []string{}
	for _, id := range ids {
		users = append(users, id.(string))
	}
	slices.Sort(users)
	return users, true
}

// hasReceipt reports whether an m.receipt content has a user's receipt of
// a type for an event.
func hasReceipt(content map[string]any, eventID, typ, userID string) bool {
	byType, _ := content[eventID].(map[string]any)
	users, _ := byType[typ].(map[string]any)
	_, ok := users[userID]
	return ok
}

// syncEphemeralUntil waits for u's /sync on n, from since, to show what ok looks
// for, following the answers' tokens; it returns the answer that did.
func syncEphemeralUntil(t *testing.T, n *testutil.Node, u *testutil.User, since, what string, ok func(map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		res := n.Must(t, "GET", clientV3+"/sync?timeout=2000&since="+url.QueryEscape(since), u.Token, nil)
		if ok(res) {
			return res
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s in %s's /sync on %s", what, u.UserID, n.ServerName)
		}
		since = res["next_batch"].(string)
	}
}

// Typing and public receipts travel as m.typing and m.receipt EDUs both
// ways between two daemons, and show in the other server's /sync; a
// private receipt stays home.
func TestFederationTypingAndReceipts(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a := testutil.StartNode(t, db, nil)
		b := testutil.StartNode(t, testutil.SQLite(t), nil)
		r := newFedRoom(t, a, "eph")
		bob := b.Register(t, "bob", "")
		r.joinFrom(t, b, bob, "#eph:"+a.ServerName)
		m1, m2 := r.send(t), r.send(t)
		ctx := context.Background()
		testutil.Eventually(t, "the messages to reach "+b.ServerName, func() bool {
			_, err := b.Store.RoomEvent(ctx, m2)
			return err == nil
		})
		typing := func(n *testutil.Node, u *testutil.User, on bool) {
			t.Helper()
			n.Must(t, "PUT", r.path("/typing/"+url.PathEscape(u.UserID)), u.Token, map[string]any{"typing": on, "timeout": 30000})
		}
		receipt := func(n *testutil.Node, u *testutil.User, typ, eventID string) {
			t.Helper()
			n.Must(t, "POST", r.path("/receipt/"+typ+"/"+url.PathEscape(eventID)), u.Token, map[string]any{})
		}

		// Alice (on A) types and reads: bob (on B) sees both.
		bobSince := syncToken(t, b, bob)
		typing(a, r.alice, true)
		syncEphemeralUntil(t, b, bob, bobSince, "alice typing", func(s map[string]any) bool {
			users, _ := typingUsers(ephemeralIn(s, r.roomID, "m.typing"))
			return slices.Equal(users, []string{r.alice.UserID})
		})
		receipt(a, r.alice, "m.read", m1)
		syncEphemeralUntil(t, b, bob, bobSince, "alice's receipt", func(s map[string]any) bool {
			return hasReceipt(ephemeralIn(s, r.roomID, "m.receipt"), m1, "m.read", r.alice.UserID)
		})
		typing(a, r.alice, false)
		bobSince = syncEphemeralUntil(t, b, bob, bobSince, "alice no longer typing", func(s map[string]any) bool {
			users, ok := typingUsers(ephemeralIn(s, r.roomID, "m.typing"))
			return ok && len(users) == 0
		})["next_batch"].(string)

		// A private receipt is not sent: the public one after it arrives
		// alone (the queue keeps the order of the EDUs).
		receipt(a, r.alice, "m.read.private", m2)
		receipt(a, r.alice, "m.read", m2)
		syncEphemeralUntil(t, b, bob, bobSince, "alice's second receipt", func(s map[string]any) bool {
			c := ephemeralIn(s, r.roomID, "m.receipt")
			if hasReceipt(c, m2, "m.read.private", r.alice.UserID) {
				t.Fatalf("bob sees alice's private receipt: %v", c)
			}
			return hasReceipt(c, m2, "m.read", r.alice.UserID)
		})
		stored, err := b.Store.RoomReceipts(ctx, r.roomID)
		if err != nil {
			t.Fatal(err)
		}
		for _, rc := range stored {
			if rc.Type == storage.ReceiptPrivate {
				t.Fatalf("%s holds a private receipt of another server's user: %+v", b.ServerName, rc)
			}
		}

		// Bob (on B) types and reads: alice (on A) sees both.
		aliceSince := syncToken(t, a, r.alice)
		typing(b, bob, true)
		receipt(b, bob, "m.read", m2)
		sawTyping, sawReceipt := false, false
		syncEphemeralUntil(t, a, r.alice, aliceSince, "bob typing and his receipt", func(s map[string]any) bool {
			users, _ := typingUsers(ephemeralIn(s, r.roomID, "m.typing"))
			sawTyping = sawTyping || slices.Equal(users, []string{bob.UserID})
			sawReceipt = sawReceipt || hasReceipt(ephemeralIn(s, r.roomID, "m.receipt"), m2, "m.read", bob.UserID)
			return sawTyping && sawReceipt
		})

		// A typing whose timeout runs out on A ends on B: A sends the stop
		// (B alone would keep it a minute).
		typers := func() []string {
			users, err := b.Store.RoomTyping(ctx, r.roomID, time.Now().UnixMilli())
			if err != nil {
				t.Fatal(err)
			}
			return users
		}
		typing(b, bob, false)
		a.Must(t, "PUT", r.path("/typing/"+url.PathEscape(r.alice.UserID)), r.alice.Token, map[string]any{"typing": true, "timeout": 3000})
		testutil.Eventually(t, "alice typing on "+b.ServerName, func() bool { return slices.Equal(typers(), []string{r.alice.UserID}) })
		testutil.Eventually(t, "alice's typing to end on "+b.ServerName, func() bool { return len(typers()) == 0 })
	})
}

// Incoming m.typing and m.receipt EDUs count only for users of their
// origin who are joined to the room; private receipts are not taken from
// other servers. Malformed EDUs are dropped without failing the
// transaction.
func TestIncomingTypingAndReceipts(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a := testutil.StartNode(t, db, nil)
		b := testutil.StartNode(t, testutil.SQLite(t), nil)
		r := newFedRoom(t, a, "edus")
		bob := b.Register(t, "bob", "")
		r.joinFrom(t, b, bob, "#edus:"+a.ServerName)
		m1 := r.send(t)
		fromB := asNode(t, b)
		txn := 0
		send := func(edus ...map[string]any) {
			t.Helper()
			txn++
			body := map[string]any{"origin": b.ServerName, "origin_server_ts": time.Now().UnixMilli(), "pdus": []any{}, "edus": edus}
			fedMust(t, a, fromB, "PUT", fmt.Sprintf("/_matrix/federation/v1/send/crafted%d", txn), body)
		}
		typingEDU := func(user string, on any) map[string]any {
			return map[string]any{"edu_type": "m.typing", "content": map[string]any{"room_id": r.roomID, "user_id": user, "typing": on}}
		}
		receiptEDU := func(typ, user string, eventIDs any) map[string]any {
			return map[string]any{"edu_type": "m.receipt", "content": map[string]any{r.roomID: map[string]any{typ: map[string]any{
				user: map[string]any{"event_ids": eventIDs, "data": map[string]any{"ts": 1234}}}}}}
		}
		ctx := context.Background()
		typers := func() []string {
			t.Helper()
			users, err := a.Store.RoomTyping(ctx, r.roomID, time.Now().UnixMilli())
			if err != nil {
				t.Fatal(err)
			}
			return users
		}
		receipts := func() []string {
			t.Helper()
			list, err := a.Store.RoomReceipts(ctx, r.roomID)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, rc := range list {
				out = append(out, rc.UserID+"|"+rc.Type+"|"+rc.EventID)
			}
			return out
		}

		send(
			typingEDU(r.alice.UserID, true),       // a user of A, not of the origin
			typingEDU("@zed:"+b.ServerName, true), // not in the room
			typingEDU(bob.UserID, "yes"),          // malformed
			receiptEDU("m.read", r.alice.UserID, []string{m1}),
			receiptEDU("m.read", "@zed:"+b.ServerName, []string{m1}),
			receiptEDU("m.read.private", bob.UserID, []string{m1}),
			receiptEDU("m.read", bob.UserID, "not a list"),
			map[string]any{"edu_type": "m.receipt", "content": "not an object"},
		)
		if got := typers(); len(got) != 0 {
			t.Fatalf("typing taken from refused EDUs: %v", got)
		}
		if got := receipts(); len(got) != 0 {
			t.Fatalf("receipts taken from refused EDUs: %v", got)
		}
		// Well-formed ones are taken; of several event IDs the latest known.
		m2 := r.send(t)
		send(typingEDU(bob.UserID, true), receiptEDU("m.read", bob.UserID, []string{m2, m1, "$unknown"}))
		if got := typers(); !slices.Equal(got, []string{bob.UserID}) {
			t.Fatalf("typing %v, want bob", got)
		}
		if got := receipts(); !slices.Equal(got, []string{bob.UserID + "|m.read|" + m2}) {
			t.Fatalf("receipts %v, want bob's for %s", got, m2)
		}
		send(typingEDU(bob.UserID, false))
		if got := typers(); len(got) != 0 {
			t.Fatalf("typing %v after bob stopped", got)
		}
	})
}
