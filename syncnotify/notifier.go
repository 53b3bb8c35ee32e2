// Package syncnotify wakes the long-polling /sync requests when something
// they wait for happens, here or in another daemon sharing the database.
package syncnotify

import (
	"context"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
)

// Notifier wakes long-polling /sync requests. Two kinds of event matter: the
// stream advanced (a device list or membership changed: every waiter checks
// whether the change concerns it), and a user's own key counts changed (one
// of their one-time or fallback keys was claimed: only that user's waiters
// wake). Only users with a waiting request have an entry, so memory follows
// the number of open requests, not the number of users ever seen.
type Notifier struct {
	mu      sync.Mutex
	stream  chan struct{} // closed and replaced when the stream advances
	users   map[string]map[*Subscription]struct{}
	closing chan struct{}
	closed  bool
}

// New makes a notifier.
func New() *Notifier {
	return &Notifier{
		stream:  make(chan struct{}),
		users:   map[string]map[*Subscription]struct{}{},
		closing: make(chan struct{}),
	}
}

// Subscription is one waiting request's view of the notifier.
type Subscription struct {
	n      *Notifier
	userID string
	user   chan struct{}
}

// Subscribe starts listening for events concerning userID. Subscribe before
// reading the state to wait on, so that no event can fall in between.
func (n *Notifier) Subscribe(userID string) *Subscription {
	s := &Subscription{n: n, userID: userID, user: make(chan struct{}, 1)}
	n.mu.Lock()
	defer n.mu.Unlock()
	m := n.users[userID]
	if m == nil {
		m = map[*Subscription]struct{}{}
		n.users[userID] = m
	}
	m[s] = struct{}{}
	return s
}

// Stream returns a channel closed at the next stream advance.
func (s *Subscription) Stream() <-chan struct{} {
	s.n.mu.Lock()
	defer s.n.mu.Unlock()
	return s.n.stream
}

// User returns the channel that receives when the user's key counts change.
func (s *Subscription) User() <-chan struct{} { return s.user }

// Closing returns a channel closed when the server shuts down.
func (s *Subscription) Closing() <-chan struct{} { return s.n.closing }

// Close stops the subscription.
func (s *Subscription) Close() {
	s.n.mu.Lock()
	defer s.n.mu.Unlock()
	if m := s.n.users[s.userID]; m != nil {
		delete(m, s)
		if len(m) == 0 {
			delete(s.n.users, s.userID)
		}
	}
}

// StreamAdvanced wakes every waiter to re-check the stream.
func (n *Notifier) StreamAdvanced() {
	n.mu.Lock()
	defer n.mu.Unlock()
	close(n.stream)
	n.stream = make(chan struct{})
}

// UserKeysChanged wakes the waiters of the given users.
func (n *Notifier) UserKeysChanged(userIDs ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, u := range userIDs {
		for s := range n.users[u] {
			select {
			case s.user <- struct{}{}:
			default: // already woken
			}
		}
	}
}

// Close releases every waiter, for shutdown.
func (n *Notifier) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.closed {
		n.closed = true
		close(n.closing)
	}
}

// Waiting counts the users with open subscriptions.
func (n *Notifier) Waiting() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.users)
}

// StreamWatcher reports every advance of the stream, also those made by
// other daemons sharing the database.
type StreamWatcher interface {
	WatchStream(ctx context.Context, advanced func()) error
}

// Watch wakes the waiters at every advance w reports until ctx ends,
// watching again after a failure.
func (n *Notifier) Watch(ctx context.Context, w StreamWatcher, log logrus.FieldLogger) {
	for ctx.Err() == nil {
		if err := w.WatchStream(ctx, n.StreamAdvanced); err != nil && ctx.Err() == nil {
			log.WithError(err).Warn("cannot watch the database for other daemons' changes; retrying")
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
			}
		}
	}
}
