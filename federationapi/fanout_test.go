package federationapi_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

// The fan-out harness: a user who shares a room with users on many other
// servers (in-process peers on loopback, each with its own TLS listener
// and signing key) logs in a new device, and every server must get the
// update. It reports how long the last one took, the most goroutines and
// heap seen meanwhile next to the idle level (peers included: they run
// in this process), the latency of /user/keys/query sent by another
// server (50 a second) while the fan-out runs, and how often requests and
// workers waited for a connection of the database pool meanwhile.
//
// The suite runs it with 20 peers; KEYSERVER_FANOUT_PEERS=1000 gives the
// figure: KEYSERVER_FANOUT_PEERS=1000 scripts/with-postgres.sh go test
// -run TestFanOut -v ./federationapi/ (KEYSERVER_FANOUT_WORKERS sets
// federation.sender_workers). KEYSERVER_FANOUT_DEAD makes that many of the
// peers dead once the room is set up (each /send is cut off before an
// answer): the others must get the update as fast.
func TestFanOut(t *testing.T) {
	peers := envInt(t, "KEYSERVER_FANOUT_PEERS", 20)
	workers := envInt(t, "KEYSERVER_FANOUT_WORKERS", config.Default().Federation.SenderWorkers)
	dead := 0
	if os.Getenv("KEYSERVER_FANOUT_DEAD") != "" {
		dead = min(envInt(t, "KEYSERVER_FANOUT_DEAD", 0), peers-1)
	}
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		node := testutil.StartNode(t, db, func(c *config.Config) { c.Federation.SenderWorkers = workers })
		alice := node.Register(t, "alice", "A1")
		const newDevice = "NEWDEVICE"
		received := make([]atomic.Int64, peers) // unix nanoseconds of the update's arrival
		var down atomic.Bool                    // the first dead peers are down
		room := "!fanout:" + node.ServerName
		node.Join(t, room, alice.UserID)
		for i := 0; i < peers; i++ {
			o := testutil.NewOrigin(t)
			o.Mux.HandleFunc("PUT /_matrix/federation/v1/send/{txn}", func(w http.ResponseWriter, r *http.Request) {
				if i < dead && down.Load() {
					panic(http.ErrAbortHandler) // the connection is cut
				}
				var txn struct {
					EDUs []struct {
						Type    string `json:"edu_type"`
						Content struct {
							UserID   string `json:"user_id"`
							DeviceID string `json:"device_id"`
						} `json:"content"`
					} `json:"edus"`
				}
				_ = json.NewDecoder(r.Body).Decode(&txn)
				for _, e := range txn.EDUs {
					if e.Type == "m.device_list_update" && e.Content.UserID == alice.UserID && e.Content.DeviceID == newDevice {
						received[i].CompareAndSwap(0, time.Now().UnixNano())
					}
				}
				_, _ = io.WriteString(w, `{"pdus":{}}`)
			})
			o.Mux.HandleFunc("GET /_matrix/federation/v1/user/devices/{userId}", func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprintf(w, `{"user_id":%q,"stream_id":1,"devices":[]}`, r.PathValue("userId"))
			})
			node.Join(t, room, "@user:"+o.Name)
		}
		// Settled: the resyncs the joins started are over.
		testutil.Eventually(t, "the remote users' device lists resynced", func() bool {
			n, err := node.Store.StaleCount(context.Background())
			return err == nil && n == 0
		})
		down.Store(true)
		var idle runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&idle)
		idleGoroutines := runtime.NumGoroutine()

		// Another server queries keys all along.
		prober := testutil.NewOrigin(t)
		stop := make(chan struct{})
		var lat []time.Duration
		var probes sync.WaitGroup
		probes.Add(1)
		warm := make(chan struct{})
		go func() {
			defer probes.Done()
			c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 30 * time.Second}
			// The first query opens the connection and has the node fetch
			// the prober's key: not counted. Then 50 a second, half the
			// federation rate limit of one server.
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for i := -1; ; i++ {
				if i == 0 {
					close(warm)
				}
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				req := prober.SignedRequest(t, "POST", node.ServerName, "/_matrix/federation/v1/user/keys/query",
					map[string]any{"device_keys": map[string]any{alice.UserID: []string{}}}, "", nil)
				req.URL.Scheme, req.URL.Host = "https", node.Config.Federation.Listen
				start := time.Now()
				resp, err := c.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Errorf("key query: %d", resp.StatusCode)
					return
				}
				if i >= 0 {
					lat = append(lat, time.Since(start))
				}
			}
		}()
		select {
		case <-warm:
		case <-time.After(time.Minute):
			t.Fatal("the first key query took over a minute")
		}

		pool0 := node.Store.DB().Stats()
		start := time.Now()
		node.Login(t, alice, newDevice)
		maxGoroutines, maxHeap := 0, uint64(0)
		var ms runtime.MemStats
		deadline := time.Now().Add(2 * time.Minute)
		got := 0
		for {
			maxGoroutines = max(maxGoroutines, runtime.NumGoroutine())
			runtime.ReadMemStats(&ms)
			maxHeap = max(maxHeap, ms.HeapInuse)
			got = 0
			for i := dead; i < peers; i++ {
				if received[i].Load() != 0 {
					got++
				}
			}
			if got == peers-dead || time.Now().After(deadline) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		close(stop)
		probes.Wait()
		pool1 := node.Store.DB().Stats()
		if got != peers-dead {
			t.Fatalf("%d of %d live servers got the new device within 2 minutes", got, peers-dead)
		}
		var last int64
		for i := dead; i < peers; i++ {
			last = max(last, received[i].Load())
		}
		slices.Sort(lat)
		p99 := time.Duration(0)
		if len(lat) > 0 {
			p99 = lat[min(len(lat)-1, len(lat)*99/100)]
		}
		t.Logf("fan-out to %d servers, %d of them dead (%d sender workers): the last live one had the update after %s; goroutines %d idle, at most %d during; "+
			"heap in use %.1f MB idle, at most %.1f MB during; /user/keys/query from another server meanwhile: %d, p99 %s; "+
			"waits for a database connection meanwhile: %d (%s)",
			peers, dead, workers, time.Duration(last-start.UnixNano()).Round(time.Millisecond), idleGoroutines, maxGoroutines,
			float64(idle.HeapInuse)/(1<<20), float64(maxHeap)/(1<<20), len(lat), p99.Round(time.Microsecond),
			pool1.WaitCount-pool0.WaitCount, (pool1.WaitDuration - pool0.WaitDuration).Round(time.Millisecond))
	})
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}
