package federationapi_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

// sameServer starts another daemon of first's server on db: same name,
// same signing key.
func sameServer(t *testing.T, db testutil.Database, first *testutil.Node) *testutil.Node {
	t.Helper()
	key, err := os.ReadFile(first.Config.SigningKeyFile())
	if err != nil {
		t.Fatal(err)
	}
	keyPath := filepath.Join(t.TempDir(), "signing.key")
	if err := os.WriteFile(keyPath, key, 0o600); err != nil {
		t.Fatal(err)
	}
	return testutil.StartNode(t, db, func(c *config.Config) {
		c.ServerName = first.ServerName
		c.SigningKeyPath = keyPath
	})
}

// receivedUpdates records the device-list updates a remote server is
// sent, and the transactions they came in.
type receivedUpdates struct {
	mu      sync.Mutex
	updates map[string]int    // "user stream_id" -> times received
	devices map[string]bool   // device IDs announced
	txns    map[string]string // transaction ID -> its EDUs
	reused  []string          // transaction IDs seen again with other EDUs
}

func recordUpdates(o *testutil.Origin) *receivedUpdates {
	r := &receivedUpdates{updates: map[string]int{}, devices: map[string]bool{}, txns: map[string]string{}}
	o.Mux.HandleFunc("PUT /_matrix/federation/v1/send/{txn}", func(w http.ResponseWriter, req *http.Request) {
		var txn struct {
			EDUs []struct {
				Type    string          `json:"edu_type"`
				Content json.RawMessage `json:"content"`
			} `json:"edus"`
		}
		_ = json.NewDecoder(req.Body).Decode(&txn)
		edus, _ := json.Marshal(txn.EDUs)
		r.mu.Lock()
		defer r.mu.Unlock()
		id := req.PathValue("txn")
		if prev, ok := r.txns[id]; ok {
			if prev != string(edus) {
				r.reused = append(r.reused, id)
			}
			// A retry: the first delivery counts.
			writeJSON(w, map[string]any{"pdus": map[string]any{}})
			return
		}
		r.txns[id] = string(edus)
		for _, e := range txn.EDUs {
			var u struct {
				UserID   string `json:"user_id"`
				DeviceID string `json:"device_id"`
				StreamID int64  `json:"stream_id"`
			}
			if e.Type == "m.device_list_update" && json.Unmarshal(e.Content, &u) == nil {
				r.updates[fmt.Sprint(u.UserID, " ", u.StreamID)]++
				r.devices[u.DeviceID] = true
			}
		}
		writeJSON(w, map[string]any{"pdus": map[string]any{}})
	})
	return r
}

// Three daemons of one server on one PostgreSQL database, under a steady
// load of key queries and uploads spread over them, keep what a shared
// database promises: an update /send delivers to one is visible on every
// one when /send returns; a remote user who joins is fetched once,
// whichever daemons learn of it, and a gap in a user's updates costs one
// fetch however many queries ask for the user on any daemon meanwhile;
// and each local change reaches a remote server once, in transactions
// whose IDs none of the daemons reuses.
func TestSharedDatabaseGuaranteesUnderLoad(t *testing.T) {
	db := testutil.Postgres(t)
	first := testutil.StartNode(t, db, nil)
	daemons := []*testutil.Node{first, sameServer(t, db, first), sameServer(t, db, first)}
	alice := first.Register(t, "alice", "A0")
	first.Upload(t, alice, map[string]any{"device_keys": alice.DeviceKeys(t)})
	const room = "!load:x"
	first.Join(t, room, alice.UserID)

	carol := newFakeRemote(t, "carol") // sends us updates
	carol.addDevice("D0")
	dave := newFakeRemote(t, "dave") // is sent ours
	received := recordUpdates(dave.Origin)
	first.Join(t, room, carol.user)
	first.Join(t, room, dave.user)
	firstFetch(t, first, alice, carol.user)
	firstFetch(t, first, alice, dave.user)
	for _, d := range daemons {
		eventually(t, "the remote lists cached", func() bool { return notStale(d, carol.user) && notStale(d, dave.user) })
	}

	// The load: clients of their own querying keys and uploading one-time
	// keys, each request to the next daemon.
	var loaders []*testutil.User
	for i := range 6 {
		u := first.Register(t, fmt.Sprint("loader", i), "L")
		first.Upload(t, u, map[string]any{"device_keys": u.DeviceKeys(t)})
		loaders = append(loaders, u)
	}
	stop := make(chan struct{})
	var load sync.WaitGroup
	var requests atomic.Int64
	for i, u := range loaders {
		load.Add(1)
		go func() {
			defer load.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				d := daemons[(i+n)%len(daemons)]
				var body map[string]any
				path := "/_matrix/client/v3/keys/query"
				if n%4 == 3 {
					path = "/_matrix/client/v3/keys/upload"
					body = map[string]any{"one_time_keys": u.OneTimeKeys(t, fmt.Sprint("k", n, "_"), 5)}
				} else {
					body = map[string]any{"device_keys": map[string]any{alice.UserID: []string{}, carol.user: []string{}}}
				}
				if status := loadRequest(d, path, u.Token, body); status != http.StatusOK {
					t.Errorf("load: %s on daemon %d: %d", path, (i+n)%len(daemons), status)
					return
				}
				requests.Add(1)
			}
		}()
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		load.Wait()
	}()

	// Local changes through every daemon at once: new devices of alice.
	var logins sync.WaitGroup
	var newDevices []string
	for i := range 9 {
		id := fmt.Sprint("N", i)
		newDevices = append(newDevices, id)
		logins.Add(1)
		go func() {
			defer logins.Done()
			body := map[string]any{"type": "m.login.password", "identifier": map[string]any{"type": "m.id.user", "user": alice.UserID},
				"password": alice.Password, "device_id": id}
			if status := loadRequest(daemons[i%len(daemons)], "/_matrix/client/v3/login", "", body); status != http.StatusOK {
				t.Errorf("login %s: %d", id, status)
			}
		}()
	}

	// Remote users joining at once, each known to every daemon.
	var joiners []*fakeRemote
	for i := range 4 {
		r := newFakeRemote(t, fmt.Sprint("joiner", i))
		r.addDevice("J0")
		joiners = append(joiners, r)
		first.Join(t, room, r.user)
	}

	// Updates from carol through each daemon in turn, now and then after
	// a gap that needs a resync first; every daemon must see each at once.
	want, gaps := []string{"D0"}, 0
	for i := 1; i <= 15; i++ {
		id := fmt.Sprint("C", i)
		edus := []map[string]any{carol.addDevice(id)}
		if i%5 == 0 {
			gap := "G" + id
			carol.addDevice(gap)
			want = append(want, gap)
			edus = []map[string]any{carol.addDevice(id)}
			gaps++
		}
		want = append(want, id)
		if r := carol.send(daemons[i%len(daemons)], carol.nextTxn(), edus...); r.Status != http.StatusOK {
			t.Fatalf("send %d: %d %s", i, r.Status, r.Raw)
		}
		for j, d := range daemons {
			if got := deviceIDs(t, d, alice, carol.user); !sameSet(got, want...) {
				t.Fatalf("update %d, sent to daemon %d: daemon %d sees %v, want %v", i, i%len(daemons), j, got, want)
			}
		}
	}

	logins.Wait()
	eventually(t, "dave's server to have every new device", func() bool {
		received.mu.Lock()
		defer received.mu.Unlock()
		for _, id := range newDevices {
			if !received.devices[id] {
				return false
			}
		}
		return true
	})
	// The joiners' lists are fetched when a client first asks, once: the
	// other daemons read what the first stored.
	for _, d := range daemons {
		for _, r := range joiners {
			if got := deviceIDs(t, d, alice, r.user); !sameSet(got, "J0") {
				t.Fatalf("%s's devices: %v", r.user, got)
			}
		}
	}
	close(stop)
	load.Wait()
	if requests.Load() == 0 {
		t.Fatal("no load was applied")
	}

	received.mu.Lock()
	for k, n := range received.updates {
		if n != 1 {
			t.Errorf("update %s reached dave's server %d times", k, n)
		}
	}
	if len(received.reused) > 0 {
		t.Errorf("transaction IDs used again for other updates: %v", received.reused)
	}
	received.mu.Unlock()
	// A gap is resynced by the daemon it reached; the queries for carol
	// that any daemon answers meanwhile wait for that fetch.
	if n := carol.resyncs.Load(); int(n) != 1+gaps {
		t.Errorf("carol's list fetched %d times, want %d (the first, and once per gap)", n, 1+gaps)
	}
	for _, r := range joiners {
		if n := r.resyncs.Load(); n != 1 {
			t.Errorf("%s's list fetched %d times by three daemons, want once", r.user, n)
		}
	}
	t.Logf("%d load requests over the three daemons meanwhile; carol's list fetched %d times for %d gaps",
		requests.Load(), carol.resyncs.Load(), gaps)
}

// loadRequest sends a JSON request from a goroutine of its own (which may
// not stop the test) and returns the status, 0 when it could not be sent.
func loadRequest(n *testutil.Node, path, token string, body any) int {
	js, _ := json.Marshal(body)
	req, err := http.NewRequest(http.MethodPost, n.URL+path, bytes.NewReader(js))
	if err != nil {
		return 0
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}
