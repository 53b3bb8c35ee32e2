package federationapi_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/testutil"
)

// Joining a room shared with users on many servers (in-process peers on
// loopback, each with its own TLS listener and signing key) fetches none
// of their device lists: a list is fetched when a local client first
// needs it, once, and then kept. The join is announced instead: every
// server of the room, none of which shared a room with the joining user
// before, is sent the user's devices with their keys.
//
// The suite runs it with 20 peers; KEYSERVER_JOINROOM_PEERS=1000 gives
// the figure in docs/benchmarks.md: KEYSERVER_JOINROOM_PEERS=1000
// scripts/with-postgres.sh go test -run TestJoinRoomOfManyServers -v
// ./federationapi/
func TestJoinRoomOfManyServers(t *testing.T) {
	peers := envInt(t, "KEYSERVER_JOINROOM_PEERS", 20)
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		node := testutil.StartNode(t, db, nil)
		alice := node.Register(t, "alice", "A1")
		node.Upload(t, alice, map[string]any{"device_keys": alice.DeviceKeys(t)})
		room := "!many:" + node.ServerName
		var fetches atomic.Int64
		var sends atomic.Int64
		announced := make([]atomic.Bool, peers)
		var remote []string
		for i := 0; i < peers; i++ {
			o := testutil.NewOrigin(t)
			o.Mux.HandleFunc("PUT /_matrix/federation/v1/send/{txn}", func(w http.ResponseWriter, r *http.Request) {
				sends.Add(1)
				var txn struct {
					EDUs []struct {
						Type    string `json:"edu_type"`
						Content struct {
							UserID   string          `json:"user_id"`
							DeviceID string          `json:"device_id"`
							Keys     json.RawMessage `json:"keys"`
						} `json:"content"`
					} `json:"edus"`
				}
				_ = json.NewDecoder(r.Body).Decode(&txn)
				for _, e := range txn.EDUs {
					if e.Type == "m.device_list_update" && e.Content.UserID == alice.UserID && e.Content.DeviceID == alice.DeviceID {
						var keys struct {
							DeviceID string `json:"device_id"`
						}
						if json.Unmarshal(e.Content.Keys, &keys) != nil || keys.DeviceID != alice.DeviceID {
							t.Errorf("alice's device announced to peer %d with keys %s", i, e.Content.Keys)
						}
						announced[i].Store(true)
					}
				}
				_, _ = io.WriteString(w, `{"pdus":{}}`)
			})
			o.Mux.HandleFunc("GET /_matrix/federation/v1/user/devices/{userId}", func(w http.ResponseWriter, r *http.Request) {
				fetches.Add(1)
				u := r.PathValue("userId")
				fmt.Fprintf(w, `{"user_id":%q,"stream_id":1,"devices":[{"device_id":"R","keys":{"user_id":%q,"device_id":"R","algorithms":[],"keys":{"ed25519:R":"placeholder"}}}]}`, u, u)
			})
			u := "@user:" + o.Name
			remote = append(remote, u)
			node.Join(t, room, u)
		}

		start := time.Now()
		node.Join(t, room, alice.UserID)
		joined := time.Since(start)
		testutil.Eventually(t, "every server of the room told of alice's devices", func() bool {
			for i := range announced {
				if !announced[i].Load() {
					return false
				}
			}
			return true
		})
		told := time.Since(start)
		if n := fetches.Load(); n != 0 {
			t.Fatalf("the join fetched %d device lists; none is needed yet", n)
		}
		t.Logf("%d servers: join %v, all told of alice's devices after %v, %d transactions sent, %d device lists fetched",
			peers, joined.Round(time.Millisecond), told.Round(time.Millisecond), sends.Load(), fetches.Load())

		// Alice's client needs three of them: each is fetched then, once.
		query := map[string]any{"device_keys": map[string]any{remote[0]: []string{}, remote[1]: []string{}, remote[2]: []string{}}}
		for round := 0; round < 2; round++ {
			r := node.Must(t, "POST", "/_matrix/client/v3/keys/query", alice.Token, query)
			keys, _ := r["device_keys"].(map[string]any)
			for _, u := range remote[:3] {
				if devices, _ := keys[u].(map[string]any); devices["R"] == nil {
					t.Fatalf("round %d: %s's device missing from %v", round, u, r)
				}
			}
			if n := fetches.Load(); n != 3 {
				t.Fatalf("round %d: %d device lists fetched, want the 3 asked for", round, n)
			}
		}
	})
}
