package devicelist_test

import (
	"context"
	"encoding/json"
	"io"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/devicelist"
	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// remoteServer answers /user/devices as another server would: its
// users' devices at a stream_id, with keys shaped as test tools send them
// (no signatures, placeholder values).
type remoteServer struct {
	mu       sync.Mutex
	streamID int64
	devices  map[string][]string // user -> device IDs
	fetches  atomic.Int64
	gate     chan struct{} // when set, each answer waits for it
}

func (r *remoteServer) UserDevices(ctx context.Context, server, userID string) (fedclient.UserDevices, error) {
	r.fetches.Add(1)
	if r.gate != nil {
		<-r.gate
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := fedclient.UserDevices{UserID: userID, StreamID: r.streamID}
	for _, id := range r.devices[userID] {
		keys, _ := json.Marshal(map[string]any{
			"user_id": userID, "device_id": id, "algorithms": []string{"m.olm.v1.curve25519-aes-sha2"},
			"keys": map[string]string{"ed25519:" + id: "placeholder-" + id},
		})
		out.Devices = append(out.Devices, fedclient.UserDevice{DeviceID: id, Keys: keys})
	}
	return out, nil
}

func (r *remoteServer) set(streamID int64, userID string, devices ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.streamID = streamID
	r.devices[userID] = devices
}

type changeLog struct {
	mu      sync.Mutex
	changes []storage.Change
}

func (c *changeLog) add(ch storage.Change) {
	c.mu.Lock()
	c.changes = append(c.changes, ch)
	c.mu.Unlock()
}
func (c *changeLog) count() int { c.mu.Lock(); defer c.mu.Unlock(); return len(c.changes) }

// newTracker is a tracker of server local.test on a fresh database, with
// alice (local) and bob (of remote.test) sharing a room.
func newTracker(t *testing.T, db testdb.Database) (*devicelist.Tracker, *sqlstore.Store, *remoteServer, *changeLog) {
	t.Helper()
	ctx := context.Background()
	store, err := sqlstore.Open(ctx, db.URI, "local.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	for _, u := range []string{"@alice:local.test", "@bob:remote.test"} {
		if _, err := store.SetMembership(ctx, "!room:local.test", u, storage.MembershipJoin, 1); err != nil {
			t.Fatal(err)
		}
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	remote := &remoteServer{devices: map[string][]string{}}
	changes := &changeLog{}
	tr := devicelist.NewTracker(store, devicelist.TrackerOptions{Federation: remote, Changed: changes.add, Logger: log})
	return tr, store, remote, changes
}

func deviceIDs(l *storage.RemoteDeviceList) string {
	var ids []string
	for _, d := range l.Devices {
		ids = append(ids, d.DeviceID)
	}
	return strings.Join(ids, ",")
}

// A list is fetched when first asked for and then answered from the
// cache, which the user's server keeps fresh with its updates.
func TestListsFetchedOnceThenKeptByUpdates(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		tr, _, remote, changes := newTracker(t, db)
		remote.set(5, "@bob:remote.test", "B1")
		for i := 0; i < 3; i++ {
			lists, err := tr.Lists(ctx, "remote.test", []string{"@bob:remote.test"})
			if err != nil || deviceIDs(lists["@bob:remote.test"]) != "B1" {
				t.Fatalf("Lists: %v, %v", lists, err)
			}
		}
		if n := remote.fetches.Load(); n != 1 {
			t.Fatalf("%d fetches for three queries, want 1", n)
		}
		// An update following the cached stream_id is applied without a fetch.
		upd := `{"user_id":"@bob:remote.test","device_id":"B2","stream_id":6,"prev_id":[5],"keys":{"keys":{"ed25519:B2":"x"}}}`
		before := changes.count()
		if user, err := tr.DeviceListUpdate(ctx, "remote.test", json.RawMessage(upd)); err != nil || user != "" {
			t.Fatalf("DeviceListUpdate: %q, %v", user, err)
		}
		lists, err := tr.Lists(ctx, "remote.test", []string{"@bob:remote.test"})
		if err != nil || deviceIDs(lists["@bob:remote.test"]) != "B1,B2" || remote.fetches.Load() != 1 {
			t.Fatalf("after the update: %v, %v, %d fetches", lists, err, remote.fetches.Load())
		}
		if changes.count() != before+1 {
			t.Fatalf("the update told of %d changes, want 1", changes.count()-before)
		}
		// The same update again is a duplicate: no change.
		if _, err := tr.DeviceListUpdate(ctx, "remote.test", json.RawMessage(upd)); err != nil || changes.count() != before+1 {
			t.Fatalf("a repeated update: %v, %d changes", err, changes.count()-before)
		}
	})
}

// An update whose prev_id the cache has not seen is a gap: the user is
// resynced (within the transaction's wait) rather than patched.
func TestUpdateAfterGapResyncs(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		tr, _, remote, _ := newTracker(t, db)
		remote.set(5, "@bob:remote.test", "B1")
		if _, err := tr.Lists(ctx, "remote.test", []string{"@bob:remote.test"}); err != nil {
			t.Fatal(err)
		}
		remote.set(9, "@bob:remote.test", "B1", "B2", "B3")
		upd := `{"user_id":"@bob:remote.test","device_id":"B3","stream_id":9,"prev_id":[8],"keys":{"keys":{}}}`
		user, err := tr.DeviceListUpdate(ctx, "remote.test", json.RawMessage(upd))
		if err != nil || user != "@bob:remote.test" {
			t.Fatalf("DeviceListUpdate after a gap: %q, %v", user, err)
		}
		tr.ResyncWithin(ctx, "remote.test", map[string]bool{user: true})
		if n := remote.fetches.Load(); n != 2 {
			t.Fatalf("%d fetches, want 2", n)
		}
		lists, err := tr.Lists(ctx, "remote.test", []string{"@bob:remote.test"})
		if err != nil || deviceIDs(lists["@bob:remote.test"]) != "B1,B2,B3" || lists["@bob:remote.test"].Stale {
			t.Fatalf("after the resync: %v, %v", lists, err)
		}
	})
}

// An update about a user whose list is not cached fetches nothing: it is
// a change for the local room-mates, whose clients then ask.
func TestUpdateOfUncachedListFetchesNothing(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		tr, _, remote, changes := newTracker(t, db)
		upd := `{"user_id":"@bob:remote.test","device_id":"B1","stream_id":3,"prev_id":[2],"keys":{"keys":{}}}`
		if user, err := tr.DeviceListUpdate(ctx, "remote.test", json.RawMessage(upd)); err != nil || user != "" {
			t.Fatalf("DeviceListUpdate: %q, %v", user, err)
		}
		if remote.fetches.Load() != 0 || changes.count() != 1 {
			t.Fatalf("%d fetches, %d changes; want 0 and 1", remote.fetches.Load(), changes.count())
		}
		// Updates about another server's user, or malformed, are dropped.
		for _, bad := range []string{
			`{"user_id":"@carol:elsewhere.test","device_id":"C1","stream_id":1}`,
			`{"user_id":"@bob:remote.test","stream_id":1}`,
			`{"user_id":"@bob:remote.test","device_id":"B1"}`,
			`[]`,
		} {
			if user, err := tr.DeviceListUpdate(ctx, "remote.test", json.RawMessage(bad)); err != nil || user != "" || changes.count() != 1 {
				t.Fatalf("%s: %q, %v, %d changes", bad, user, err, changes.count())
			}
		}
	})
}

// Queries asking at once for a list that must be fetched share one fetch.
func TestConcurrentQueriesShareOneFetch(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		tr, _, remote, _ := newTracker(t, db)
		remote.set(5, "@bob:remote.test", "B1")
		remote.gate = make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				lists, err := tr.Lists(ctx, "remote.test", []string{"@bob:remote.test"})
				if err == nil && deviceIDs(lists["@bob:remote.test"]) != "B1" {
					err = io.ErrUnexpectedEOF
				}
				errs <- err
			}()
		}
		// Let the one fetch through once it has started.
		deadline := time.Now().Add(10 * time.Second)
		for remote.fetches.Load() == 0 && time.Now().Before(deadline) {
			runtime.Gosched()
		}
		close(remote.gate)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if n := remote.fetches.Load(); n != 1 {
			t.Fatalf("%d fetches for 8 concurrent queries, want 1", n)
		}
	})
}
