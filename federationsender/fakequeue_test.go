package federationsender

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/keyserver/keyserver/internal/workertest"
	"github.com/keyserver/keyserver/storage"
)

// fakeQueue is an in-memory Store with the semantics of the SQL one, for
// tests that look at the sender's decisions alone.
type fakeQueue struct {
	mu      sync.Mutex
	pending map[string][]storage.OutboundUpdate // per destination, oldest first
	leases  map[string]fakeLease
	calls   map[string]int
	// hold makes calls of an operation wait until the channel is closed;
	// inside counts the calls waiting. PendingUpdates is named with its
	// limit ("PendingUpdates/1").
	hold   map[string]chan struct{}
	inside map[string]int
	// failing makes calls of an operation fail.
	failing map[string]bool
	retries map[string]storage.DestinationRetry
	// events receives what WatchOutbound would hear.
	events chan storage.OutboundEvent
	holds  []fakeHold
}

type fakeLease struct {
	owner   string
	expires int64
}

func newFakeQueue() *fakeQueue {
	return &fakeQueue{pending: map[string][]storage.OutboundUpdate{}, leases: map[string]fakeLease{},
		calls: map[string]int{}, hold: map[string]chan struct{}{}, inside: map[string]int{}, failing: map[string]bool{},
		retries: map[string]storage.DestinationRetry{}, events: make(chan storage.OutboundEvent, 16)}
}

// add queues n updates of distinct devices for dest.
func (f *fakeQueue) add(dest string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := 0; i < n; i++ {
		id := int64(len(f.pending[dest]) + 1)
		f.pending[dest] = append(f.pending[dest], storage.OutboundUpdate{
			UserID: "@alice:local.test", DeviceID: fmt.Sprintf("D%d", id), StreamID: id, KeyJSON: []byte(`{}`)})
	}
}

// addSigningKeys queues a signing-key update of userID for dest.
func (f *fakeQueue) addSigningKeys(dest, userID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending[dest] = append(f.pending[dest], storage.OutboundUpdate{UserID: userID,
		StreamID: int64(len(f.pending[dest]) + 1), SigningKeys: true, MasterKey: []byte(masterKey)})
}

func (f *fakeQueue) left(dest string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.pending[dest])
}

func (f *fakeQueue) lease(dest string) (fakeLease, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.leases[dest]
	return l, ok
}

func (f *fakeQueue) called(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

func (f *fakeQueue) blocked(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inside[op]
}

// enter counts a call of op and waits while op is held.
func (f *fakeQueue) enter(op string) {
	f.mu.Lock()
	f.calls[op]++
	hold := f.hold[op]
	f.inside[op]++
	f.mu.Unlock()
	if hold != nil {
		<-hold
	}
	f.mu.Lock()
	f.inside[op]--
	f.mu.Unlock()
}

func (f *fakeQueue) PendingDestinations(ctx context.Context) ([]string, error) {
	f.enter("PendingDestinations")
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for d, q := range f.pending {
		if len(q) > 0 {
			out = append(out, d)
		}
	}
	sort.Strings(out)
	return out, nil
}

func (f *fakeQueue) PendingUpdates(ctx context.Context, dest string, limit int) ([]storage.OutboundUpdate, error) {
	f.enter(fmt.Sprintf("PendingUpdates/%d", limit))
	f.mu.Lock()
	defer f.mu.Unlock()
	q := f.pending[dest]
	return append([]storage.OutboundUpdate(nil), q[:min(limit, len(q))]...), nil
}

func (f *fakeQueue) MarkUpdatesSent(ctx context.Context, dest string, sent []storage.OutboundUpdate) error {
	f.enter("MarkUpdatesSent")
	f.mu.Lock()
	defer f.mu.Unlock()
	done := map[int64]bool{}
	for _, u := range sent {
		done[u.StreamID] = true
	}
	var kept []storage.OutboundUpdate
	for _, u := range f.pending[dest] {
		if !done[u.StreamID] {
			kept = append(kept, u)
		}
	}
	f.pending[dest] = kept
	return nil
}

func (f *fakeQueue) AcquireDestination(ctx context.Context, dest, owner string, now, expires int64) (held, kept bool, err error) {
	f.enter("AcquireDestination")
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failing["AcquireDestination"] {
		return false, false, workertest.ErrDBDown
	}
	l, ok := f.leases[dest]
	if ok && l.owner != owner && l.expires >= now {
		return false, false, nil
	}
	f.leases[dest] = fakeLease{owner, expires}
	return true, ok && l.owner == owner, nil
}

func (f *fakeQueue) ReleaseDestination(ctx context.Context, dest, owner string) error {
	f.enter("ReleaseDestination")
	f.mu.Lock()
	defer f.mu.Unlock()
	if l, ok := f.leases[dest]; ok && l.owner == owner {
		delete(f.leases, dest)
	}
	return nil
}

func (f *fakeQueue) HandOverDestination(ctx context.Context, dest, owner string) error {
	f.enter("HandOverDestination")
	f.mu.Lock()
	defer f.mu.Unlock()
	if l, ok := f.leases[dest]; ok && l.owner == owner {
		delete(f.leases, dest)
	}
	return nil
}

func (f *fakeQueue) OutboundOwners(ctx context.Context) ([]int64, error) { return nil, nil }

func (f *fakeQueue) PauseDestination(ctx context.Context, dest, owner string) error {
	f.enter("PauseDestination")
	f.mu.Lock()
	defer f.mu.Unlock()
	if l, ok := f.leases[dest]; ok && l.owner == owner {
		f.leases[dest] = fakeLease{owner, 0}
	}
	return nil
}

func (f *fakeQueue) HoldOutboundOwner(ctx context.Context, owner string) (<-chan struct{}, error) {
	f.enter("HoldOutboundOwner")
	lost := make(chan struct{})
	f.mu.Lock()
	f.holds = append(f.holds, fakeHold{owner, lost})
	f.mu.Unlock()
	return lost, nil
}

// fakeHold is a hold the test may break by closing lost.
type fakeHold struct {
	owner string
	lost  chan struct{}
}

func (f *fakeQueue) holdsMade() []fakeHold {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeHold(nil), f.holds...)
}

func (f *fakeQueue) ReclaimDeadLeases(ctx context.Context) ([]string, error) {
	f.enter("ReclaimDeadLeases")
	return nil, nil
}

func (f *fakeQueue) DestinationRetries(ctx context.Context) ([]storage.DestinationRetry, error) {
	f.enter("DestinationRetries")
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []storage.DestinationRetry
	for _, r := range f.retries {
		out = append(out, r)
	}
	return out, nil
}

func (f *fakeQueue) DestinationRetryOf(ctx context.Context, dest string) (storage.DestinationRetry, bool, error) {
	f.enter("DestinationRetryOf")
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.retries[dest]
	return r, ok, nil
}

func (f *fakeQueue) RecordDestinationFailure(ctx context.Context, r storage.DestinationRetry) error {
	f.enter("RecordDestinationFailure")
	f.mu.Lock()
	defer f.mu.Unlock()
	f.retries[r.Destination] = r
	return nil
}

func (f *fakeQueue) ResetDestination(ctx context.Context, dest string, heardAt int64) (bool, error) {
	f.enter("ResetDestination")
	f.mu.Lock()
	defer f.mu.Unlock()
	r, had := f.retries[dest]
	if !had || r.RecordedAt > heardAt {
		return false, nil
	}
	delete(f.retries, dest)
	return true, nil
}

func (f *fakeQueue) WatchOutbound(ctx context.Context, fn func(storage.OutboundEvent)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-f.events:
			fn(ev)
		}
	}
}

func (f *fakeQueue) OutboundDestinations(ctx context.Context) ([]storage.OutboundDestination, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []storage.OutboundDestination
	for d, q := range f.pending {
		if len(q) > 0 || f.retries[d].Attempts > 0 {
			l := f.leases[d]
			out = append(out, storage.OutboundDestination{Destination: d, Updates: len(q), Retry: f.retries[d],
				LeaseOwner: l.owner, LeaseExpires: l.expires})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Destination < out[j].Destination })
	return out, nil
}
