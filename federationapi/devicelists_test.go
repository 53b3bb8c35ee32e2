package federationapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

// fakeRemote is a remote server (an Origin) with one user whose device
// list the test controls: it answers /user/devices from it and sends
// m.device_list_update EDUs about it.
type fakeRemote struct {
	*testutil.Origin
	t       *testing.T
	user    string
	mu      sync.Mutex
	devices map[string]*testutil.User // device ID -> device (with its key)
	stream  int64
	resyncs atomic.Int32
	broken  atomic.Bool // /user/devices answers 500
	// hold, when set, keeps /user/devices from answering until closed.
	hold atomic.Pointer[chan struct{}]
	txn  int
}

func newFakeRemote(t *testing.T, localpart string) *fakeRemote {
	f := &fakeRemote{Origin: testutil.NewOrigin(t), t: t, devices: map[string]*testutil.User{}, stream: 5}
	f.user = "@" + localpart + ":" + f.Name
	f.Mux.HandleFunc("GET /_matrix/federation/v1/user/devices/{user}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("user") != f.user { // the ID went through the URL intact
			w.WriteHeader(http.StatusNotFound)
			return
		}
		f.resyncs.Add(1)
		if hold := f.hold.Load(); hold != nil {
			<-*hold
		}
		if f.broken.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		devices := []any{}
		for id, d := range f.devices {
			devices = append(devices, map[string]any{"device_id": id, "keys": d.DeviceKeys(t)})
		}
		writeJSON(w, map[string]any{"user_id": f.user, "stream_id": f.stream, "devices": devices})
	})
	return f
}

// addDevice adds a device and returns the EDU announcing it.
func (f *fakeRemote) addDevice(id string) map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := newRemoteUser(f.t, f.Origin, "", id)
	d.UserID = f.user
	f.devices[id] = d.User
	prev := f.stream
	f.stream++
	return map[string]any{"user_id": f.user, "device_id": id, "stream_id": f.stream, "prev_id": []int64{prev}, "keys": d.DeviceKeys(f.t)}
}

// deleteDevice deletes a device and returns the EDU announcing it.
func (f *fakeRemote) deleteDevice(id string) map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.devices, id)
	prev := f.stream
	f.stream++
	return map[string]any{"user_id": f.user, "device_id": id, "stream_id": f.stream, "prev_id": []int64{prev}, "deleted": true}
}

// send delivers EDUs to a node in one transaction and returns the answer.
func (f *fakeRemote) send(n *testutil.Node, txnID string, edus ...map[string]any) testutil.Response {
	f.t.Helper()
	list := []any{}
	for _, e := range edus {
		list = append(list, map[string]any{"edu_type": "m.device_list_update", "content": e})
	}
	body := map[string]any{"origin": f.Name, "origin_server_ts": time.Now().UnixMilli(), "pdus": []any{}, "edus": list}
	return testutil.SendTo(f.t, n, f.SignedRequest(f.t, "PUT", n.ServerName, f.SendPath(txnID), body, "", nil))
}

func (f *fakeRemote) nextTxn() string { f.txn++; return fmt.Sprintf("t%d", f.txn) }

func deviceIDs(t *testing.T, n *testutil.Node, u *testutil.User, remoteUser string) map[string]bool {
	t.Helper()
	r := query(t, n, u, map[string][]string{remoteUser: {}}, 10000)
	out := map[string]bool{}
	for id := range devicesOf(t, r, remoteUser) {
		out[id] = true
	}
	return out
}

func sameSet(got map[string]bool, want ...string) bool {
	if len(got) != len(want) {
		return false
	}
	for _, w := range want {
		if !got[w] {
			return false
		}
	}
	return true
}

func eventually(t *testing.T, what string, cond func() bool) { testutil.Eventually(t, what, cond) }

// firstFetch has viewer, a local user of n, ask for userID's keys: a
// remote list is fetched when a local client first needs it, and kept
// from then on. It returns once the list is cached.
func firstFetch(t *testing.T, n *testutil.Node, viewer *testutil.User, userID string) {
	t.Helper()
	query(t, n, viewer, map[string][]string{userID: {}}, 10000)
	eventually(t, "the first fetch of "+userID, func() bool { return notStale(n, userID) })
}

// queuesDrained waits until none of the nodes has anything queued for
// another server: the updates a join announced have been answered (an
// answer to /send comes once the receiver has applied or fetched what it
// was sent).
func queuesDrained(t *testing.T, nodes ...*testutil.Node) {
	t.Helper()
	eventually(t, "the outbound queues drained", func() bool {
		for _, n := range nodes {
			q, err := n.Store.OutboundQueue(context.Background())
			if err != nil || len(q) > 0 {
				return false
			}
		}
		return true
	})
}

// An incoming update is visible to /keys/query as soon as /send returns; a
// missed update (unknown prev_id) makes the receiver resync before
// answering; deletions apply; retried transactions are processed once;
// updates for users of other servers or users nobody shares a room with
// are dropped.
func TestIncomingUpdates(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a := testutil.StartNode(t, db, nil)
		alice := a.Register(t, "alice", "")
		carol := newFakeRemote(t, "carol")
		carol.addDevice("PHONE")
		a.Join(t, "!room:x", alice.UserID)
		a.Join(t, "!room:x", carol.user) // starts tracking; fetched when first asked for
		firstFetch(t, a, alice, carol.user)
		if got := deviceIDs(t, a, alice, carol.user); !sameSet(got, "PHONE") {
			t.Fatalf("cached list %v", got)
		}
		if n := carol.resyncs.Load(); n != 1 {
			t.Fatalf("%d resyncs", n)
		}

		// In sequence: applied, visible at once, no resync.
		since := syncToken(t, a, alice)
		r := carol.send(a, carol.nextTxn(), carol.addDevice("LAPTOP"))
		if r.Status != 200 {
			t.Fatalf("send: %d %s", r.Status, r.Raw)
		}
		if got := deviceIDs(t, a, alice, carol.user); !sameSet(got, "PHONE", "LAPTOP") {
			t.Fatalf("after /send: %v", got)
		}
		if n := carol.resyncs.Load(); n != 1 {
			t.Fatalf("an update in sequence caused a resync (%d)", n)
		}
		if changed := changedSince(t, a, alice, since); !changed[carol.user] {
			t.Fatalf("carol not in alice's changes: %v", changed)
		}

		// A missed update: the next one names an unknown prev_id.
		carol.addDevice("TABLET") // never sent
		r = carol.send(a, carol.nextTxn(), carol.addDevice("WATCH"))
		if r.Status != 200 {
			t.Fatalf("send: %d %s", r.Status, r.Raw)
		}
		if got := deviceIDs(t, a, alice, carol.user); !sameSet(got, "PHONE", "LAPTOP", "TABLET", "WATCH") {
			t.Fatalf("after a gap: %v", got)
		}
		if n := carol.resyncs.Load(); n != 2 {
			t.Fatalf("%d resyncs after a gap, want 2", n)
		}

		// Deletion, and a retried transaction processed once.
		txn := carol.nextTxn()
		del := carol.deleteDevice("TABLET")
		first := carol.send(a, txn, del)
		tok := syncToken(t, a, alice)
		again := carol.send(a, txn, del)
		if first.Status != 200 || again.Status != 200 || string(first.Raw) != string(again.Raw) {
			t.Fatalf("retry answered differently: %s / %s", first.Raw, again.Raw)
		}
		if syncToken(t, a, alice) != tok {
			t.Fatal("a retried transaction was processed again")
		}
		if got := deviceIDs(t, a, alice, carol.user); !sameSet(got, "PHONE", "LAPTOP", "WATCH") {
			t.Fatalf("after deletion: %v", got)
		}

		// Dropped: a user of another server, and a user nobody shares a room with.
		stranger := newFakeRemote(t, "dave")
		before := syncToken(t, a, alice)
		impostor := map[string]any{"user_id": stranger.user, "device_id": "X", "stream_id": 99, "keys": map[string]any{}}
		if r := carol.send(a, carol.nextTxn(), impostor); r.Status != 200 {
			t.Fatalf("send: %d %s", r.Status, r.Raw)
		}
		if r := stranger.send(a, stranger.nextTxn(), stranger.addDevice("D1")); r.Status != 200 {
			t.Fatalf("send: %d %s", r.Status, r.Raw)
		}
		if stranger.resyncs.Load() != 0 || syncToken(t, a, alice) != before {
			t.Fatal("an update about an untracked user was acted on")
		}
	})
}

// Users of other servers with historical IDs (upper case, and the other
// printable characters the old grammar allowed) are handled like any
// other: their lists are fetched, their updates applied, their keys
// queried and claimed.
func TestHistoricalUserIDs(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a := testutil.StartNode(t, db, nil)
		alice := a.Register(t, "alice", "")
		for _, localpart := range []string{"Alice", "x!#$%&'()*+,;<=>?@[\\]^_`{|}~\"/.-Z"} {
			remote := newFakeRemote(t, localpart)
			remote.addDevice("PHONE")
			remote.Mux.HandleFunc("POST /_matrix/federation/v1/user/keys/claim", func(w http.ResponseWriter, r *http.Request) {
				remote.mu.Lock()
				defer remote.mu.Unlock()
				writeJSON(w, map[string]any{"one_time_keys": map[string]any{remote.user: map[string]any{
					"PHONE": map[string]any{"signed_curve25519:K1": remote.devices["PHONE"].SignedKey(t, false)}}}})
			})
			room := "!room" + fmt.Sprint(len(localpart)) + ":x"
			a.Join(t, room, alice.UserID)
			a.Join(t, room, remote.user)
			firstFetch(t, a, alice, remote.user)
			if got := deviceIDs(t, a, alice, remote.user); !sameSet(got, "PHONE") {
				t.Fatalf("%s: cached list %v", remote.user, got)
			}

			// An update in sequence is applied as it comes, with no resync.
			since := syncToken(t, a, alice)
			if r := remote.send(a, remote.nextTxn(), remote.addDevice("LAPTOP")); r.Status != 200 {
				t.Fatalf("send: %d %s", r.Status, r.Raw)
			}
			if got := deviceIDs(t, a, alice, remote.user); !sameSet(got, "PHONE", "LAPTOP") {
				t.Fatalf("%s: after /send: %v", remote.user, got)
			}
			if n := remote.resyncs.Load(); n != 1 {
				t.Fatalf("%s: %d resyncs, want 1", remote.user, n)
			}
			if changed := changedSince(t, a, alice, since); !changed[remote.user] {
				t.Fatalf("%s not in alice's changes: %v", remote.user, changed)
			}
			// A deletion too.
			if r := remote.send(a, remote.nextTxn(), remote.deleteDevice("LAPTOP")); r.Status != 200 {
				t.Fatalf("send: %d %s", r.Status, r.Raw)
			}
			if got := deviceIDs(t, a, alice, remote.user); !sameSet(got, "PHONE") {
				t.Fatalf("%s: after a deletion: %v", remote.user, got)
			}

			// Claims reach the user's server and the key is passed on.
			c := a.Must(t, "POST", "/_matrix/client/v3/keys/claim", alice.Token, map[string]any{
				"one_time_keys": map[string]any{remote.user: map[string]string{"PHONE": "signed_curve25519"}}})
			keys, _ := c["one_time_keys"].(map[string]any)[remote.user].(map[string]any)["PHONE"].(map[string]any)
			if keys["signed_curve25519:K1"] == nil {
				t.Fatalf("%s: claim %v", remote.user, c)
			}
		}
	})
}

// notStale reports whether a node has a fresh cached list of the user.
func notStale(n *testutil.Node, userID string) bool {
	_, stale, err := n.Store.StaleEntry(context.Background(), userID)
	if err != nil || stale {
		return false
	}
	lists, err := n.Store.RemoteDeviceLists(context.Background(), []string{userID})
	return err == nil && lists[userID] != nil
}

func syncToken(t *testing.T, n *testutil.Node, u *testutil.User) string {
	t.Helper()
	return n.Must(t, "GET", "/_matrix/client/v3/sync", u.Token, nil)["next_batch"].(string)
}

func changedSince(t *testing.T, n *testutil.Node, u *testutil.User, since string) map[string]bool {
	t.Helper()
	r := n.Must(t, "GET", "/_matrix/client/v3/keys/changes?from="+since+"&to="+syncToken(t, n, u), u.Token, nil)
	out := map[string]bool{}
	for _, c := range r["changed"].([]any) {
		out[c.(string)] = true
	}
	return out
}

// /send answers within send_wait when the sender cannot be reached for a
// resync; the user stays stale and the updater catches up later.
func TestSendDoesNotHangOnFailedResync(t *testing.T) {
	a := testutil.StartNode(t, testutil.SQLite(t), func(c *config.Config) { c.Federation.SendWait = config.Duration(time.Second) })
	alice := a.Register(t, "alice", "")
	carol := newFakeRemote(t, "carol")
	carol.addDevice("PHONE")
	a.Join(t, "!room:x", alice.UserID)
	a.Join(t, "!room:x", carol.user)
	firstFetch(t, a, alice, carol.user)

	carol.broken.Store(true)
	carol.addDevice("MISSED")
	start := time.Now()
	r := carol.send(a, carol.nextTxn(), carol.addDevice("NEW"))
	if r.Status != 200 {
		t.Fatalf("send: %d %s", r.Status, r.Raw)
	}
	if elapsed := time.Since(start); elapsed > 15*time.Second {
		t.Fatalf("/send took %v with send_wait 1s", elapsed)
	}
	if _, stale, _ := a.Store.StaleEntry(context.Background(), carol.user); !stale {
		t.Fatal("user not left stale after a failed resync")
	}
	carol.broken.Store(false)
	eventually(t, "the updater to catch up", func() bool {
		_, stale, _ := a.Store.StaleEntry(context.Background(), carol.user)
		return !stale
	})
	if got := deviceIDs(t, a, alice, carol.user); !sameSet(got, "PHONE", "MISSED", "NEW") {
		t.Fatalf("after catching up: %v", got)
	}
}

func TestSendTransactionLimits(t *testing.T) {
	a := testutil.StartNode(t, testutil.SQLite(t), nil)
	o := testutil.NewOrigin(t)
	edus := []any{}
	for i := 0; i < 101; i++ {
		edus = append(edus, map[string]any{"edu_type": "m.typing", "content": map[string]any{}})
	}
	r := testutil.SendTo(t, a, o.SignedRequest(t, "PUT", a.ServerName, "/_matrix/federation/v1/send/big",
		map[string]any{"origin": o.Name, "origin_server_ts": 1, "pdus": []any{}, "edus": edus}, "", nil))
	if r.Status != 400 || r.Errcode() != "M_BAD_JSON" {
		t.Fatalf("101 EDUs: %d %s", r.Status, r.Raw)
	}
	// PDUs are not processed and say so; unknown EDUs are ignored.
	pdu := map[string]any{"event_id": "$abc", "type": "m.room.message", "room_id": "!r:x", "sender": "@u:" + o.Name, "content": map[string]any{}}
	r = testutil.SendTo(t, a, o.SignedRequest(t, "PUT", a.ServerName, "/_matrix/federation/v1/send/mixed",
		map[string]any{"origin": o.Name, "origin_server_ts": 1, "pdus": []any{pdu},
			"edus": []any{map[string]any{"edu_type": "m.presence", "content": map[string]any{"push": []any{}}}}}, "", nil))
	pdus, _ := r.Body["pdus"].(map[string]any)
	if r.Status != 200 || pdus["$abc"] == nil {
		t.Fatalf("mixed transaction: %d %s", r.Status, r.Raw)
	}
	raw, _ := json.Marshal(pdus["$abc"])
	if string(raw) == "{}" {
		t.Fatalf("PDU reported as processed: %s", raw)
	}
	// Unsigned /send is refused.
	req := o.SignedRequest(t, "PUT", a.ServerName, "/_matrix/federation/v1/send/x", map[string]any{"origin": o.Name, "pdus": []any{}}, "", nil)
	req.Header.Del("Authorization")
	if r := testutil.SendTo(t, a, req); r.Status != 401 {
		t.Fatalf("unsigned send: %d", r.Status)
	}
}

// Clients asking at once for a remote user whose list must be fetched
// share one fetch: the user's server gets one request, not one per query.
func TestConcurrentQueriesShareOneFetch(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		node := testutil.StartNode(t, db, nil)
		alice := node.Register(t, "alice", "")
		carol := newFakeRemote(t, "carol")
		carol.addDevice("D0")
		hold := make(chan struct{})
		carol.hold.Store(&hold)
		var once sync.Once
		release := func() { once.Do(func() { close(hold) }) }
		defer release()
		const queries = 10
		before := node.Store.StatementsSent()
		answers := make(chan int, queries)
		for range queries {
			go func() {
				answers <- loadRequest(node, "/_matrix/client/v3/keys/query", alice.Token,
					map[string]any{"device_keys": map[string]any{carol.user: []string{}}})
			}()
		}
		// Each query reads the cache before it fetches.
		eventually(t, "every query to have read the cache and the first fetch to start", func() bool {
			return node.Store.StatementsSent()-before >= queries && carol.resyncs.Load() >= 1
		})
		release()
		for range queries {
			if status := <-answers; status != http.StatusOK {
				t.Fatalf("query: %d", status)
			}
		}
		if n := carol.resyncs.Load(); n != 1 {
			t.Fatalf("%d concurrent queries fetched carol's list %d times, want once", queries, n)
		}
		if got := deviceIDs(t, node, alice, carol.user); !sameSet(got, "D0") {
			t.Fatalf("devices %v", got)
		}
	})
}
