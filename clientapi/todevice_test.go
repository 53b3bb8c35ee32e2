package clientapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
)

func sendToDevicePath(eventType, txnID string) string {
	return "/_matrix/client/v3/sendToDevice/" + url.PathEscape(eventType) + "/" + url.PathEscape(txnID)
}

// toDeviceSync syncs (timeout 0) and returns the to-device events as
// canonical JSON and next_batch.
func toDeviceSync(t *testing.T, srv *testutil.Server, u *testutil.User, since string) (events []map[string]any, next string) {
	t.Helper()
	// The syncs leave presence alone (which would advance the stream):
	// tokens of answers with nothing new between them are compared.
	q := "?timeout=0&set_presence=offline"
	if since != "" {
		q += "&since=" + url.QueryEscape(since)
	}
	return toDeviceEvents(t, srv.Must(t, "GET", "/_matrix/client/v3/sync"+q, u.Token, nil))
}

func toDeviceEvents(t *testing.T, sync map[string]any) ([]map[string]any, string) {
	t.Helper()
	section, ok := sync["to_device"].(map[string]any)
	if !ok {
		t.Fatalf("no to_device in /sync: %v", sync)
	}
	raw, _ := json.Marshal(section["events"])
	var events []map[string]any
	if err := json.Unmarshal(raw, &events); err != nil || events == nil {
		t.Fatalf("to_device.events is not a list: %s", raw)
	}
	return events, sync["next_batch"].(string)
}

// contents lists the "n" of each event's content, with its sender and type.
func contents(events []map[string]any) []string {
	out := []string{}
	for _, e := range events {
		c, _ := e["content"].(map[string]any)
		out = append(out, fmt.Sprintf("%v/%v/%v", e["sender"], e["type"], c["n"]))
	}
	return out
}

func TestSendToDeviceLocal(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "ALICE1")
		alice2 := srv.Login(t, alice, "ALICE2")
		bob := srv.Register(t, "bob", "BOB1")
		bob2 := srv.Login(t, bob, "BOB2")
		msg := func(n int) map[string]any { return map[string]any{"n": n} }

		// One message to BOB1 alone, one to every device of bob, one to
		// both with BOB2 named apart.
		srv.Must(t, "PUT", sendToDevicePath("m.test", "t1"), alice.Token,
			map[string]any{"messages": map[string]any{bob.UserID: map[string]any{"BOB1": msg(1)}}})
		srv.Must(t, "PUT", sendToDevicePath("m.test", "t2"), alice.Token,
			map[string]any{"messages": map[string]any{bob.UserID: map[string]any{"*": msg(2)}}})
		srv.Must(t, "PUT", sendToDevicePath("m.other", "t3"), alice.Token,
			map[string]any{"messages": map[string]any{bob.UserID: map[string]any{"*": msg(3), "BOB2": msg(4)},
				// Unknown users and devices are skipped.
				"@nobody:test.local": map[string]any{"*": msg(9)}, alice.UserID: map[string]any{"NODEVICE": msg(9)}}})
		// A retry of the same send (same device, same txnId) stores nothing.
		srv.Must(t, "PUT", sendToDevicePath("m.test", "t2"), alice.Token,
			map[string]any{"messages": map[string]any{bob.UserID: map[string]any{"*": msg(2)}}})
		// The same txnId from another device is another send.
		srv.Must(t, "PUT", sendToDevicePath("m.test", "t2"), alice2.Token,
			map[string]any{"messages": map[string]any{bob.UserID: map[string]any{"BOB1": msg(5)}}})

		a := alice.UserID
		want1 := []string{a + "/m.test/1", a + "/m.test/2", a + "/m.other/3", a + "/m.test/5"}
		want2 := []string{a + "/m.test/2", a + "/m.other/4"}
		ev, next := toDeviceSync(t, srv, bob, "")
		if got := contents(ev); strings.Join(got, " ") != strings.Join(want1, " ") {
			t.Fatalf("BOB1 got %v, want %v", got, want1)
		}
		if ev, _ := toDeviceSync(t, srv, bob2, ""); strings.Join(contents(ev), " ") != strings.Join(want2, " ") {
			t.Fatalf("BOB2 got %v, want %v", contents(ev), want2)
		}
		if ev, _ := toDeviceSync(t, srv, alice, ""); len(ev) != 0 {
			t.Fatalf("alice got %v", contents(ev))
		}

		// The answer was lost: syncing from the old token (here none)
		// gives the messages again; syncing from its next_batch deletes
		// them, and the old token then finds them gone.
		ev, next2 := toDeviceSync(t, srv, bob, "")
		if len(ev) != 4 || next2 != next {
			t.Fatalf("resync got %v (%s, first %s)", contents(ev), next2, next)
		}
		ev, next3 := toDeviceSync(t, srv, bob, next)
		if len(ev) != 0 {
			t.Fatalf("after acknowledging: %v", contents(ev))
		}
		if ev, _ := toDeviceSync(t, srv, bob, next); len(ev) != 0 {
			t.Fatalf("delivered messages came back: %v", contents(ev))
		}
		// A lost answer with a since: a new message, its answer lost, the
		// same since again gives it again.
		srv.Must(t, "PUT", sendToDevicePath("m.test", "t4"), alice.Token,
			map[string]any{"messages": map[string]any{bob.UserID: map[string]any{"BOB1": msg(6)}}})
		ev1, _ := toDeviceSync(t, srv, bob, next3)
		ev2, next4 := toDeviceSync(t, srv, bob, next3)
		if strings.Join(contents(ev1), " ") != a+"/m.test/6" || strings.Join(contents(ev2), " ") != a+"/m.test/6" {
			t.Fatalf("lost answer: first %v, again %v", contents(ev1), contents(ev2))
		}
		if ev, _ := toDeviceSync(t, srv, bob, next4); len(ev) != 0 {
			t.Fatalf("after acknowledging: %v", contents(ev))
		}
		// BOB2's messages are still there: acknowledging is per device.
		if ev, _ := toDeviceSync(t, srv, bob2, ""); len(ev) != 2 {
			t.Fatalf("BOB2 after BOB1 acknowledged: %v", contents(ev))
		}
		// A token without the to-device part (older, or from
		// /keys/changes) acknowledges nothing.
		old, _, _ := strings.Cut(next4, "_")
		_, bobNext := toDeviceSync(t, srv, bob2, "")
		if ev, _ := toDeviceSync(t, srv, bob2, old); len(ev) != 2 {
			t.Fatalf("a token without its to-device part acknowledged: %v (%s)", contents(ev), bobNext)
		}
	})
}

// At most 100 messages per answer, in order; the rest in the next ones.
func TestSendToDeviceLimit(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "ALICE1")
		bob := srv.Register(t, "bob", "BOB1")
		const total = 230
		for i := 0; i < total; i++ {
			srv.Must(t, "PUT", sendToDevicePath("m.test", fmt.Sprint("t", i)), alice.Token,
				map[string]any{"messages": map[string]any{bob.UserID: map[string]any{"BOB1": map[string]any{"n": i}}}})
		}
		got := []string{}
		since := ""
		for _, want := range []int{100, 100, 30, 0} {
			ev, next := toDeviceSync(t, srv, bob, since)
			if len(ev) != want {
				t.Fatalf("an answer had %d messages, want %d", len(ev), want)
			}
			got = append(got, contents(ev)...)
			since = next
		}
		for i, c := range got {
			if want := fmt.Sprintf("%s/m.test/%d", alice.UserID, i); c != want {
				t.Fatalf("message %d is %s, want %s", i, c, want)
			}
		}
	})
}

// A waiting /sync wakes for a message to its device; the write concerns
// the recipient alone.
func TestSendToDeviceWakesSync(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "ALICE1")
		bob := srv.Register(t, "bob", "BOB1")
		_, since := toDeviceSync(t, srv, bob, "")
		type result struct {
			events []map[string]any
			took   time.Duration
		}
		done := make(chan result, 1)
		go func() {
			start := time.Now()
			r := srv.Do(t, "GET", "/_matrix/client/v3/sync?timeout=20000&set_presence=offline&since="+url.QueryEscape(since), bob.Token, nil)
			section, _ := r.Body["to_device"].(map[string]any)
			raw, _ := json.Marshal(section["events"])
			var ev []map[string]any
			_ = json.Unmarshal(raw, &ev)
			done <- result{ev, time.Since(start)}
		}()
		testutil.Eventually(t, "bob's /sync to wait", func() bool { return srv.Parts.Sync.WaitingSyncs() == 1 })
		srv.Must(t, "PUT", sendToDevicePath("m.test", "w1"), alice.Token,
			map[string]any{"messages": map[string]any{bob.UserID: map[string]any{"BOB1": map[string]any{"n": 1}}}})
		r := <-done
		if len(r.events) != 1 || r.took > 15*time.Second {
			t.Fatalf("waiting /sync: %v after %v", r.events, r.took)
		}
		// The stored change concerns bob alone, so no one else's /sync wakes.
		ch, dup, err := srv.Store.StoreToDevice(context.Background(), storage.ToDeviceSend{
			Origin: alice.UserID, DeviceID: "ALICE1", TxnID: "w2", Sender: alice.UserID, Type: "m.test", Now: 1,
			Local: map[string]map[string]json.RawMessage{bob.UserID: {"*": json.RawMessage(`{}`)}}})
		if err != nil || dup || ch.Pos == 0 || strings.Join(ch.Users, ",") != bob.UserID {
			t.Fatalf("change %+v dup %v err %v, want bob alone", ch, dup, err)
		}
	})
}

// Deleting a device, logging it out and deactivating the account delete
// the inboxes.
func TestSendToDeviceInboxDeleted(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "ALICE1")
		bob := srv.Register(t, "bob", "BOB1")
		bob2 := srv.Login(t, bob, "BOB2")
		bob3 := srv.Login(t, bob, "BOB3")
		inbox := func(userID string) int {
			t.Helper()
			var n int
			if err := srv.Store.DB().QueryRow(`SELECT COUNT(*) FROM to_device_inbox WHERE user_id = $1`, userID).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		send := func(txn string) {
			srv.Must(t, "PUT", sendToDevicePath("m.test", txn), alice.Token,
				map[string]any{"messages": map[string]any{bob.UserID: map[string]any{"*": map[string]any{"n": txn}}}})
		}
		send("a")
		if n := inbox(bob.UserID); n != 3 {
			t.Fatalf("%d messages stored, want 3", n)
		}
		// Logging BOB2 out deletes its inbox: logged in again, it has none.
		srv.Must(t, "POST", "/_matrix/client/v3/logout", bob2.Token, map[string]any{})
		bob2 = srv.Login(t, bob, "BOB2")
		if ev, _ := toDeviceSync(t, srv, bob2, ""); len(ev) != 0 {
			t.Fatalf("BOB2 logged in again has %v", contents(ev))
		}
		// Deleting BOB3 deletes its inbox.
		srv.Must(t, "DELETE", "/_matrix/client/v3/devices/BOB3", bob.Token, map[string]any{"auth": map[string]any{
			"type": "m.login.password", "identifier": map[string]any{"type": "m.id.user", "user": bob.UserID}, "password": bob.Password}})
		_ = bob3
		if n := inbox(bob.UserID); n != 1 {
			t.Fatalf("%d messages left, want BOB1's alone", n)
		}
		send("b")
		srv.Must(t, "POST", "/_matrix/client/v3/account/deactivate", bob.Token, map[string]any{"auth": map[string]any{
			"type": "m.login.password", "identifier": map[string]any{"type": "m.id.user", "user": bob.UserID}, "password": bob.Password}})
		if n := inbox(bob.UserID); n != 0 {
			t.Fatalf("%d messages left after deactivation", n)
		}
	})
}

// Bad input gets 400 (413 for a too large message) with the right
// errcode and stores nothing: the same txnId then still sends.
func TestSendToDeviceBadInput(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "ALICE1")
		bob := srv.Register(t, "bob", "BOB1")
		path := sendToDevicePath("m.test", "bad")
		big := strings.Repeat("x", 65536)
		for _, tc := range []struct {
			name    string
			path    string
			body    any
			status  int
			errcode string
		}{
			{"not JSON", path, "{", 400, "M_NOT_JSON"},
			{"no messages", path, map[string]any{}, 400, "M_MISSING_PARAM"},
			{"messages not an object", path, map[string]any{"messages": []any{}}, 400, "M_BAD_JSON"},
			{"devices not an object", path, map[string]any{"messages": map[string]any{bob.UserID: "x"}}, 400, "M_BAD_JSON"},
			{"content not an object", path, map[string]any{"messages": map[string]any{bob.UserID: map[string]any{"BOB1": "x"}}}, 400, "M_BAD_JSON"},
			{"content null", path, map[string]any{"messages": map[string]any{bob.UserID: map[string]any{"BOB1": nil}}}, 400, "M_BAD_JSON"},
			{"bad user ID", path, map[string]any{"messages": map[string]any{"bob": map[string]any{"BOB1": map[string]any{}}}}, 400, "M_INVALID_PARAM"},
			{"empty device ID", path, map[string]any{"messages": map[string]any{bob.UserID: map[string]any{"": map[string]any{}}}}, 400, "M_INVALID_PARAM"},
			{"too large", path, map[string]any{"messages": map[string]any{bob.UserID: map[string]any{
				"BOB1": map[string]any{"n": 1}, "*": map[string]any{"x": big}}}}, 413, "M_TOO_LARGE"},
			{"bad event type", sendToDevicePath("m.test\x01", "bad"), map[string]any{"messages": map[string]any{}}, 400, "M_INVALID_PARAM"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := srv.Do(t, "PUT", tc.path, alice.Token, tc.body)
				if r.Status != tc.status || r.Errcode() != tc.errcode {
					t.Fatalf("got %d %s, want %d %s", r.Status, r.Raw, tc.status, tc.errcode)
				}
			})
		}
		if ev, _ := toDeviceSync(t, srv, bob, ""); len(ev) != 0 {
			t.Fatalf("refused sends stored %v", contents(ev))
		}
		// Exactly 65536 bytes of content is accepted.
		fits := map[string]any{"x": big[:65536-len(`{"x":""}`)]}
		srv.Must(t, "PUT", path, alice.Token, map[string]any{"messages": map[string]any{bob.UserID: map[string]any{"BOB1": fits}}})
		if ev, _ := toDeviceSync(t, srv, bob, ""); len(ev) != 1 {
			t.Fatalf("the send after the refused ones stored %d messages", len(ev))
		}
		// Without a token: 401.
		if r := srv.Do(t, "PUT", path, "", map[string]any{"messages": map[string]any{}}); r.Status != 401 || r.Errcode() != "M_MISSING_TOKEN" {
			t.Fatalf("no token: %d %s", r.Status, r.Raw)
		}
	})
}

func TestSendToDeviceRateLimit(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{ToDevice: testutil.RateLimit{PerSecond: 0.001, Burst: 2}})
		alice := srv.Register(t, "alice", "ALICE1")
		alice2 := srv.Login(t, alice, "ALICE2")
		bob := srv.Register(t, "bob", "BOB1")
		body := map[string]any{"messages": map[string]any{bob.UserID: map[string]any{"BOB1": map[string]any{}}}}
		srv.Must(t, "PUT", sendToDevicePath("m.test", "1"), alice.Token, body)
		srv.Must(t, "PUT", sendToDevicePath("m.test", "2"), alice.Token, body)
		// Per user, whichever device sends.
		r := srv.Do(t, "PUT", sendToDevicePath("m.test", "3"), alice2.Token, body)
		if r.Status != http.StatusTooManyRequests || r.Errcode() != "M_LIMIT_EXCEEDED" {
			t.Fatalf("third send: %d %s", r.Status, r.Raw)
		}
		// Another sender is not held back.
		srv.Must(t, "PUT", sendToDevicePath("m.test", "1"), bob.Token,
			map[string]any{"messages": map[string]any{alice.UserID: map[string]any{"*": map[string]any{}}}})
		if ev, _ := toDeviceSync(t, srv, bob, ""); len(ev) != 2 {
			t.Fatalf("bob has %d messages, want 2", len(ev))
		}
	})
}
