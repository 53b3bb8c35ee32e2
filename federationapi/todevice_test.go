package federationapi_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/testutil"
)

// inbox returns a device's waiting to-device messages (an initial /sync,
// which deletes nothing) as "sender/type/n".
func inbox(t *testing.T, n *testutil.Node, u *testutil.User) []string {
	t.Helper()
	sync := n.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0", u.Token, nil)
	raw, _ := json.Marshal(sync["to_device"].(map[string]any)["events"])
	var events []struct {
		Sender, Type string
		Content      map[string]any
	}
	if err := json.Unmarshal(raw, &events); err != nil {
		t.Fatal(err)
	}
	out := []string{}
	for _, e := range events {
		out = append(out, fmt.Sprintf("%s/%s/%v", e.Sender, e.Type, e.Content["n"]))
	}
	return out
}

// allMessages pages through a device's waiting messages with /sync,
// following next_batch, which deletes the messages it passes.
func allMessages(t *testing.T, n *testutil.Node, u *testutil.User) []string {
	t.Helper()
	out := []string{}
	since := ""
	for {
		q := "?timeout=0"
		if since != "" {
			q += "&since=" + since
		}
		sync := n.Must(t, "GET", "/_matrix/client/v3/sync"+q, u.Token, nil)
		raw, _ := json.Marshal(sync["to_device"].(map[string]any)["events"])
		var events []struct {
			Sender, Type string
			Content      map[string]any
		}
		if err := json.Unmarshal(raw, &events); err != nil {
			t.Fatal(err)
		}
		if len(events) == 0 {
			return out
		}
		for _, e := range events {
			out = append(out, fmt.Sprintf("%s/%s/%v", e.Sender, e.Type, e.Content["n"]))
		}
		since = sync["next_batch"].(string)
	}
}

func sendToDevice(t *testing.T, n *testutil.Node, u *testutil.User, txnID string, messages map[string]any) {
	t.Helper()
	n.Must(t, "PUT", "/_matrix/client/v3/sendToDevice/m.test/"+txnID, u.Token, map[string]any{"messages": messages})
}

func sameList(got []string, want ...string) bool {
	return strings.Join(got, " ") == strings.Join(want, " ")
}

// Messages to another server's users travel as m.direct_to_device EDUs,
// both ways, once each even when the client retries.
func TestToDeviceBetweenServers(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a, b := testutil.StartNode(t, db, nil), testutil.StartNode(t, testutil.SQLite(t), nil)
		alice := a.Register(t, "alice", "ALICE1")
		carol := a.Register(t, "carol", "CAROL1")
		bob := b.Register(t, "bob", "BOB1")
		bob2 := b.Login(t, bob, "BOB2")

		msgs := map[string]any{
			bob.UserID:   map[string]any{"BOB1": map[string]any{"n": 1}, "*": map[string]any{"n": 2}, "NODEVICE": map[string]any{"n": 9}},
			carol.UserID: map[string]any{"*": map[string]any{"n": 3}},
		}
		sendToDevice(t, a, alice, "t1", msgs)
		sendToDevice(t, a, alice, "t1", msgs) // a retry
		sendToDevice(t, a, alice, "t2", map[string]any{bob.UserID: map[string]any{"BOB2": map[string]any{"n": 4}}})
		eventually(t, "the messages to reach B", func() bool { return len(inbox(t, b, bob2)) == 2 })
		if got := inbox(t, b, bob); !sameList(got, alice.UserID+"/m.test/1") {
			t.Fatalf("BOB1 got %v", got)
		}
		if got := inbox(t, b, bob2); !sameList(got, alice.UserID+"/m.test/2", alice.UserID+"/m.test/4") {
			t.Fatalf("BOB2 got %v", got)
		}
		if got := inbox(t, a, carol); !sameList(got, alice.UserID+"/m.test/3") {
			t.Fatalf("carol got %v", got)
		}
		eventually(t, "A's queue to empty", func() bool {
			d, err := a.Store.ToDeviceDestinations(context.Background())
			return err == nil && len(d) == 0
		})

		// The other way.
		sendToDevice(t, b, bob, "t1", map[string]any{alice.UserID: map[string]any{"*": map[string]any{"n": 5}}})
		eventually(t, "the message to reach A", func() bool { return len(inbox(t, a, alice)) == 1 })
		if got := inbox(t, a, alice); !sameList(got, bob.UserID+"/m.test/5") {
			t.Fatalf("alice got %v", got)
		}
		// The retry above was not delivered twice, now that everything is.
		if got := inbox(t, b, bob); len(got) != 1 {
			t.Fatalf("BOB1 got %v after the retry", got)
		}

		// More than a transaction holds: every message arrives, in order.
		const many = 130
		for i := 0; i < many; i++ {
			sendToDevice(t, a, carol, fmt.Sprint("m", i), map[string]any{bob.UserID: map[string]any{"BOB1": map[string]any{"n": i}}})
		}
		eventually(t, "the many messages to reach B", func() bool {
			var n int
			err := b.Store.DB().QueryRow(`SELECT COUNT(*) FROM to_device_inbox WHERE device_id = 'BOB1'`).Scan(&n)
			return err == nil && n == many+1
		})
		got := allMessages(t, b, bob)
		if len(got) != many+1 {
			t.Fatalf("%d messages, want %d", len(got), many+1)
		}
		for i, m := range got[1:] {
			if want := fmt.Sprintf("%s/m.test/%d", carol.UserID, i); m != want {
				t.Fatalf("message %d is %s, want %s", i, m, want)
			}
		}
	})
}

// Messages queued for a server that is down survive a restart of the
// sending daemon and are delivered once the server is back.
func TestToDeviceSurvivesRestart(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a, b := testutil.StartNode(t, db, nil), testutil.StartNode(t, testutil.SQLite(t), nil)
		alice := a.Register(t, "alice", "ALICE1")
		bob := b.Register(t, "bob", "BOB1")
		b.Stop()
		sendToDevice(t, a, alice, "t1", map[string]any{bob.UserID: map[string]any{"*": map[string]any{"n": 1}}})
		sendToDevice(t, a, alice, "t2", map[string]any{bob.UserID: map[string]any{"*": map[string]any{"n": 2}}})
		dests, err := a.Store.ToDeviceDestinations(context.Background())
		if err != nil || len(dests) != 1 || dests[0] != b.ServerName {
			t.Fatalf("queue while B is down: %v %v", dests, err)
		}
		a.Stop()
		a.Restart()
		b.Restart()
		eventually(t, "the queued messages to arrive", func() bool { return len(inbox(t, b, bob)) == 2 })
		if got := inbox(t, b, bob); !sameList(got, alice.UserID+"/m.test/1", alice.UserID+"/m.test/2") {
			t.Fatalf("bob got %v", got)
		}
		eventually(t, "A's queue to empty", func() bool {
			d, err := a.Store.ToDeviceDestinations(context.Background())
			return err == nil && len(d) == 0
		})
	})
}

// Incoming m.direct_to_device EDUs: the sender must be of the origin, a
// message_id is delivered once, and messages to unknown users or devices,
// or to other servers' users, are dropped. Malformed EDUs are dropped too,
// without failing the transaction.
func TestIncomingDirectToDevice(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, nil)
		bob := n.Register(t, "bob", "BOB1")
		bob2 := n.Login(t, bob, "BOB2")
		origin := testutil.NewOrigin(t)
		sender := "@eve:" + origin.Name
		txn := 0
		send := func(edus ...any) {
			t.Helper()
			txn++
			list := []any{}
			for _, e := range edus {
				list = append(list, map[string]any{"edu_type": "m.direct_to_device", "content": e})
			}
			body := map[string]any{"origin": origin.Name, "origin_server_ts": time.Now().UnixMilli(), "pdus": []any{}, "edus": list}
			r := testutil.SendTo(t, n, origin.SignedRequest(t, "PUT", n.ServerName, origin.SendPath(fmt.Sprintf("t%d", txn)), body, "", nil))
			if r.Status != 200 {
				t.Fatalf("send: %d %s", r.Status, r.Raw)
			}
		}
		edu := func(sender, messageID string, messages map[string]any) map[string]any {
			return map[string]any{"sender": sender, "type": "m.test", "message_id": messageID, "messages": messages}
		}
		msg := func(i int) map[string]any { return map[string]any{"n": i} }

		send(edu(sender, "m1", map[string]any{
			bob.UserID:                 map[string]any{"BOB1": msg(1), "*": msg(2), "NODEVICE": msg(9)},
			"@nobody:" + n.ServerName:  map[string]any{"*": msg(9)},
			"@other:elsewhere.example": map[string]any{"*": msg(9)},
		}),
			// From a user of another server than the origin.
			edu("@mallory:elsewhere.example", "m2", map[string]any{bob.UserID: map[string]any{"*": msg(9)}}),
			// Malformed: no message_id, messages of the wrong shape,
			// content not an object.
			edu(sender, "", map[string]any{bob.UserID: map[string]any{"*": msg(9)}}),
			map[string]any{"sender": sender, "type": "m.test", "message_id": "m3", "messages": "x"},
			edu(sender, "m4", map[string]any{bob.UserID: map[string]any{"BOB1": "x"}}),
		)
		if got := inbox(t, n, bob); !sameList(got, sender+"/m.test/1") {
			t.Fatalf("BOB1 got %v", got)
		}
		if got := inbox(t, n, bob2); !sameList(got, sender+"/m.test/2") {
			t.Fatalf("BOB2 got %v", got)
		}
		// The same message_id again, in another transaction: not delivered
		// twice. A new one is.
		send(edu(sender, "m1", map[string]any{bob.UserID: map[string]any{"BOB1": msg(1)}}),
			edu(sender, "m5", map[string]any{bob.UserID: map[string]any{"BOB1": msg(5)}}))
		got := inbox(t, n, bob)
		sort.Strings(got)
		if !sameList(got, sender+"/m.test/1", sender+"/m.test/5") {
			t.Fatalf("BOB1 after a repeated message_id: %v", got)
		}
	})
}

// A dehydrated device is a device to other servers too: queried with
// dehydrated: true, claimed, and sent messages that its owner reads back.
func TestDehydratedDeviceOverFederation(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a, b := testutil.StartNode(t, db, nil), testutil.StartNode(t, testutil.SQLite(t), nil)
		alice := a.Register(t, "alice", "ALICE1")
		bob := b.Register(t, "bob", "BOB1")
		_, priv, _ := ed25519.GenerateKey(rand.Reader)
		d := &testutil.User{UserID: alice.UserID, DeviceID: "DEHYDRATED", Key: priv}
		keys := testutil.Sign(t, map[string]any{
			"user_id": alice.UserID, "device_id": d.DeviceID, "dehydrated": true,
			"algorithms": []string{"m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"},
			"keys": map[string]string{
				"curve25519:" + d.DeviceID: testutil.RandomKey(),
				"ed25519:" + d.DeviceID:    testutil.B64(priv.Public().(ed25519.PublicKey)),
			},
		}, alice.UserID, d.DeviceID, priv)
		a.Must(t, "PUT", "/_matrix/client/unstable/org.matrix.msc3814.v1/dehydrated_device", alice.Token, map[string]any{
			"device_id": d.DeviceID, "device_data": map[string]any{"algorithm": "org.matrix.msc3814.v2"},
			"device_keys": keys, "fallback_keys": map[string]any{"signed_curve25519:F": d.SignedKey(t, true)}})

		got := query(t, b, bob, map[string][]string{alice.UserID: {}}, 10000)
		dev, _ := devicesOf(t, got, alice.UserID)[d.DeviceID].(map[string]any)
		if dev == nil || dev["dehydrated"] != true {
			t.Fatalf("B's /keys/query shows %v", got)
		}
		claim := b.Must(t, "POST", "/_matrix/client/v3/keys/claim", bob.Token, map[string]any{
			"one_time_keys": map[string]any{alice.UserID: map[string]any{d.DeviceID: "signed_curve25519"}}})
		if k, _ := claim["one_time_keys"].(map[string]any)[alice.UserID].(map[string]any)[d.DeviceID].(map[string]any); len(k) != 1 {
			t.Fatalf("claim of its fallback key: %v", claim)
		}
		sendToDevice(t, b, bob, "t1", map[string]any{alice.UserID: map[string]any{d.DeviceID: map[string]any{"n": 1}}})
		events := func() []any {
			r := a.Must(t, "POST", "/_matrix/client/unstable/org.matrix.msc3814.v1/dehydrated_device/DEHYDRATED/events", alice.Token, map[string]any{})
			ev, _ := r["events"].([]any)
			return ev
		}
		eventually(t, "the message to reach the dehydrated device", func() bool { return len(events()) == 1 })
	})
}
