package federationapi_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// flakyPeer is a remote server whose /send fails (503) while down, and
// records the devices announced to it when up.
type flakyPeer struct {
	*fakeRemote
	down     atomic.Bool
	attempts atomic.Int64
	mu       sync.Mutex
	devices  map[string]bool
}

func newFlakyPeer(t *testing.T) *flakyPeer {
	p := &flakyPeer{fakeRemote: newFakeRemote(t, "bob"), devices: map[string]bool{}}
	p.addDevice("B0")
	p.Mux.HandleFunc("PUT /_matrix/federation/v1/send/{txn}", func(w http.ResponseWriter, r *http.Request) {
		p.attempts.Add(1)
		if p.down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		var txn struct {
			EDUs []struct {
				Type    string `json:"edu_type"`
				Content struct {
					DeviceID string `json:"device_id"`
				} `json:"content"`
			} `json:"edus"`
		}
		_ = json.NewDecoder(r.Body).Decode(&txn)
		p.mu.Lock()
		for _, e := range txn.EDUs {
			if e.Type == "m.device_list_update" {
				p.devices[e.Content.DeviceID] = true
			}
		}
		p.mu.Unlock()
		writeJSON(w, map[string]any{"pdus": map[string]any{}})
	})
	return p
}

func (p *flakyPeer) got(device string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.devices[device]
}

// signOfLife makes an authenticated request of the peer to n.
func (p *flakyPeer) signOfLife(t *testing.T, n *testutil.Node, userID string) {
	t.Helper()
	req := p.SignedRequest(t, "GET", n.ServerName, "/_matrix/federation/v1/user/devices/"+userID, nil, "", nil)
	if r := testutil.SendTo(t, n, req); r.Status != http.StatusOK {
		t.Fatalf("the peer's request: %d", r.Status)
	}
}

// attemptsStored is the failed attempts n's database holds for dest.
func attemptsStored(n *testutil.Node, dest string) int {
	r, _, err := n.Store.DestinationRetryOf(context.Background(), dest)
	if err != nil {
		return -1
	}
	return r.Attempts
}

// setUpPeer starts a daemon whose user alice shares a room with the
// peer's user, once the peer's list is fetched.
func setUpPeer(t *testing.T, n *testutil.Node) (*testutil.User, *flakyPeer) {
	alice := n.Register(t, "alice", "A0")
	peer := newFlakyPeer(t)
	n.Join(t, "!r:x", alice.UserID)
	n.Join(t, "!r:x", peer.user)
	firstFetch(t, n, alice, peer.user)
	return alice, peer
}

// While a server cannot be reached, any authenticated request from it
// zeroes its failures and has the update retried at once (the failures
// count again from one), and once it is up the next sign of life has it
// delivered at once, its failures forgotten.
func TestSignOfLifeResetsOutboundBackoff(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := testutil.StartNode(t, db, nil)
		alice, peer := setUpPeer(t, n)
		peer.down.Store(true)
		n.Login(t, alice, "NEW")
		eventually(t, "four failed attempts", func() bool { return attemptsStored(n, peer.Name) >= 4 })
		// A daemon forgets the stored failures on a sign of life once it
		// knows of them (its own, or read within the second).
		eventually(t, "the daemon to know the peer is failing", func() bool { return n.Parts.Sender.KnowsFailing(peer.Name) })
		before := peer.attempts.Load()
		peer.signOfLife(t, n, alice.UserID)
		// The next wait would be 1.6 s (200 ms doubled per failure): a
		// retry at once, counted from one, shows the reset.
		eventually(t, "a retry at once, counted from one", func() bool {
			a := attemptsStored(n, peer.Name)
			return peer.attempts.Load() > before && a >= 1 && a < 4
		})
		peer.down.Store(false)
		peer.signOfLife(t, n, alice.UserID)
		eventually(t, "delivery", func() bool { return peer.got("NEW") })
		eventually(t, "the failures forgotten", func() bool { return attemptsStored(n, peer.Name) == 0 })
	})
}

// A daemon killed with updates pending, leaving a lease under its name
// and a retry time an hour away, sends them as soon as it is started
// again: the lease of a process that is gone keeps nobody out, and a
// daemon tries each destination once before it heeds a stored retry time.
func TestRestartedDaemonResumesAtOnce(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		n := testutil.StartNode(t, db, nil)
		alice, peer := setUpPeer(t, n)
		peer.down.Store(true)
		n.Login(t, alice, "NEW")
		eventually(t, "a failed attempt", func() bool { return attemptsStored(n, peer.Name) >= 1 })
		n.Stop()
		// What a kill -9 leaves: the lease under the dead process's name
		// (it never gave it back) and its retry time.
		store, err := sqlstore.Open(ctx, db.URI, n.ServerName)
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		now := time.Now()
		b := make([]byte, 8)
		_, _ = rand.Read(b)
		if held, _, err := store.AcquireDestination(ctx, peer.Name, "killed-"+hex.EncodeToString(b), now.UnixMilli(),
			now.Add(time.Hour).UnixMilli()); err != nil || !held {
			t.Fatalf("lease: %v %v", held, err)
		}
		if err := store.RecordDestinationFailure(ctx, storage.DestinationRetry{Destination: peer.Name, Attempts: 9,
			FailingSince: now.Add(-time.Minute).UnixMilli(), RetryAt: now.Add(time.Hour).UnixMilli()}); err != nil {
			t.Fatal(err)
		}
		peer.down.Store(false)
		start := time.Now()
		n.Restart()
		eventually(t, "delivery after the restart", func() bool { return peer.got("NEW") })
		took := time.Since(start)
		t.Logf("pending update delivered %s after the restart began", took.Round(time.Millisecond))
		// Old daemons waited for the lease to expire (2 minutes) and their
		// sweep (1 minute).
		if took > 10*time.Second {
			t.Fatalf("delivered %s after the restart", took)
		}
	})
}

// Two daemons of one server on one PostgreSQL database: a sign of life
// received by either ends the backoff whichever sends; when the one
// sending stops, the other takes its destinations over at once; when a
// daemon's session with the database ends without a word (as when it is
// killed), the other takes over within its next look (a second).
func TestInstancesTakeOverFromEachOther(t *testing.T) {
	db := testutil.Postgres(t)
	ctx := context.Background()
	first := testutil.StartNode(t, db, nil)
	second := sameServer(t, db, first)
	alice, peer := setUpPeer(t, first)
	eventually(t, "the peer's list fetched on the second", func() bool { return notStale(second, peer.user) })
	peer.down.Store(true)
	first.Login(t, alice, "NEW")
	for _, n := range []*testutil.Node{second, first, second} {
		eventually(t, "four failed attempts", func() bool { return attemptsStored(first, peer.Name) >= 4 })
		// A daemon forgets the stored failures on a sign of life once it
		// knows of them (its own, or read within the second).
		eventually(t, "the daemon to know the peer is failing", func() bool { return n.Parts.Sender.KnowsFailing(peer.Name) })
		before := peer.attempts.Load()
		peer.signOfLife(t, n, alice.UserID)
		eventually(t, "a retry at once, counted from one", func() bool {
			a := attemptsStored(first, peer.Name)
			return peer.attempts.Load() > before && a >= 1 && a < 4
		})
	}

	// The one that sends stops (its lease paused or held): the other
	// takes over, told by the database, well before any sweep.
	first.Stop()
	peer.down.Store(false)
	peer.signOfLife(t, second, alice.UserID)
	eventually(t, "delivery by the second", func() bool { return peer.got("NEW") })

	// A daemon whose session ends without a word: a lease it held keeps
	// the survivor out only until its next look.
	peer.down.Store(true)
	second.Login(t, alice, "NEWER")
	eventually(t, "a failed attempt", func() bool { return attemptsStored(second, peer.Name) >= 1 })
	other, err := sqlstore.Open(ctx, db.URI, second.ServerName)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	octx, kill := context.WithCancel(ctx)
	defer kill()
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	owner := "sibling-" + hex.EncodeToString(b)
	lost, err := other.HoldOutboundOwner(octx, owner)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	eventually(t, "the sibling to take the paused lease", func() bool {
		held, _, err := other.AcquireDestination(ctx, peer.Name, owner, now.UnixMilli(), now.Add(time.Hour).UnixMilli())
		return err == nil && held
	})
	// The survivor's failures are forgotten (an operator's retry): it
	// would send now, but the sibling holds the lease.
	if _, err := other.ResetDestination(ctx, peer.Name, math.MaxInt64); err != nil {
		t.Fatal(err)
	}
	peer.down.Store(false)
	kill()
	<-lost
	start := time.Now()
	eventually(t, "delivery by the survivor", func() bool { return peer.got("NEWER") })
	took := time.Since(start)
	t.Logf("the survivor delivered %s after the sibling's session ended", took.Round(time.Millisecond))
	if took > 10*time.Second {
		t.Fatalf("delivered %s after the sibling's session ended", took)
	}
}
