package devicelist

import (
	"context"
	"sort"
	"sync"

	"github.com/keyserver/keyserver/storage"
)

// fakeStore is an in-memory Store with the semantics of the SQL one, for
// tests that look at the updater's decisions alone.
type fakeStore struct {
	mu    sync.Mutex
	users map[string]storage.StaleUser
	calls map[string]int
	// block, when set, holds RetryServerNow until it is closed.
	block chan struct{}
}

func newFakeStore() *fakeStore {
	return &fakeStore{users: map[string]storage.StaleUser{}, calls: map[string]int{}}
}

func (f *fakeStore) mark(userID, server string, retryAt int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.users[userID] = storage.StaleUser{UserID: userID, ServerName: server, RetryAtTS: retryAt}
}

func (f *fakeStore) remove(userID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.users, userID)
}

func (f *fakeStore) entry(userID string) (storage.StaleUser, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	u, ok := f.users[userID]
	return u, ok
}

func (f *fakeStore) called(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

func (f *fakeStore) DueStaleUsers(ctx context.Context, now int64, limit int) ([]storage.StaleUser, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["DueStaleUsers"]++
	var out []storage.StaleUser
	for _, u := range f.users {
		if u.RetryAtTS <= now {
			out = append(out, u)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].RetryAtTS != out[j].RetryAtTS {
			return out[i].RetryAtTS < out[j].RetryAtTS
		}
		return out[i].UserID < out[j].UserID
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

func (f *fakeStore) StaleEntry(ctx context.Context, userID string) (storage.StaleUser, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["StaleEntry"]++
	u, ok := f.users[userID]
	return u, ok, nil
}

func (f *fakeStore) NextStaleRetry(ctx context.Context) (int64, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["NextStaleRetry"]++
	var at int64
	ok := false
	for _, u := range f.users {
		if !ok || u.RetryAtTS < at {
			at, ok = u.RetryAtTS, true
		}
	}
	return at, ok, nil
}

func (f *fakeStore) RescheduleStale(ctx context.Context, userID string, attempts int, retryAt int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["RescheduleStale"]++
	if u, ok := f.users[userID]; ok {
		u.Attempts, u.RetryAtTS = attempts, retryAt
		f.users[userID] = u
	}
	return nil
}

func (f *fakeStore) DeferServer(ctx context.Context, serverName string, until int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls["DeferServer"]++
	for id, u := range f.users {
		if u.ServerName == serverName && u.RetryAtTS < until {
			u.RetryAtTS = until
			f.users[id] = u
		}
	}
	return nil
}

func (f *fakeStore) RetryServerNow(ctx context.Context, serverName string) error {
	f.mu.Lock()
	block := f.block
	f.calls["RetryServerNow"]++
	f.mu.Unlock()
	if block != nil {
		<-block
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, u := range f.users {
		if u.ServerName == serverName && u.RetryAtTS > 0 {
			u.RetryAtTS = 0
			f.users[id] = u
		}
	}
	return nil
}
