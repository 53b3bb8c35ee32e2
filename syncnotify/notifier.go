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
// stream advanced (a device list, cross-signing keys, a membership or
// account data changed: the waiters of the users the change concerns, as
// the write reported them, check what it brings them), and a user's own
// key counts changed (one of their one-time or fallback keys was claimed).
// Either wakes only the waiters of the users named, so a change costs work
// in proportion to the users it concerns, not to every waiting request.
// Only users with a waiting request have an entry, so memory follows the
// number of open requests, not the number of users ever seen.
type Notifier struct {
	mu      sync.Mutex
	users   map[string]map[*Subscription]struct{}
	closing chan struct{}
	closed  bool
}

// New makes a notifier.
func New() *Notifier {
	return &Notifier{
		users:   map[string]map[*Subscription]struct{}{},
		closing: make(chan struct{}),
	}
}

// Subscription is one waiting request's view of the notifier.
type Subscription struct {
	n      *Notifier
	userID string
	stream chan struct{}
	user   chan struct{}
	// wake replaces the channels for a waiter without a goroutine of its
	// own (see SubscribeFunc).
	wake func(Event)
}

// Event is what woke a subscription made with SubscribeFunc.
type Event int

const (
	// StreamEvent: the stream advanced in a way that may concern the user.
	StreamEvent Event = iota
	// UserEvent: the user's key counts changed.
	UserEvent
	// ClosingEvent: the server shuts down.
	ClosingEvent
)

// Subscribe starts listening for events concerning userID. Subscribe before
// reading the state to wait on, so that no event can fall in between.
func (n *Notifier) Subscribe(userID string) *Subscription {
	s := &Subscription{n: n, userID: userID, stream: make(chan struct{}, 1), user: make(chan struct{}, 1)}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.add(s)
	return s
}

// add registers s under its user, with n.mu held.
func (n *Notifier) add(s *Subscription) {
	m := n.users[s.userID]
	if m == nil {
		m = map[*Subscription]struct{}{}
		n.users[s.userID] = m
	}
	m[s] = struct{}{}
}

// SubscribeFunc is Subscribe for a waiter that has no goroutine to
// receive from channels: wake is called for each event instead, with the
// notifier's lock held, so it must not block nor call the notifier. After
// Close of the notifier it is called with ClosingEvent at once.
func (n *Notifier) SubscribeFunc(userID string, wake func(Event)) *Subscription {
	s := &Subscription{n: n, userID: userID, wake: wake}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		wake(ClosingEvent)
	}
	n.add(s)
	return s
}

// Stream returns the channel that receives when the stream advanced in a
// way that may concern the user. Advances merge while one is pending, and
// one that came before the state was read may still be pending: the
// waiter then reads again and finds nothing new, which is harmless.
func (s *Subscription) Stream() <-chan struct{} { return s.stream }

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

// StreamAdvanced wakes the waiters of the given users to re-check the
// stream; nil wakes every waiter (the change may concern anyone).
func (n *Notifier) StreamAdvanced(userIDs []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if userIDs == nil {
		for _, subs := range n.users {
			signal(subs, StreamEvent)
		}
		return
	}
	for _, u := range userIDs {
		signal(n.users[u], StreamEvent)
	}
}

// signal sends on the channel of each subscription the event is for,
// unless a send is already pending there, or calls its wake function.
func signal(subs map[*Subscription]struct{}, e Event) {
	for s := range subs {
		if s.wake != nil {
			s.wake(e)
			continue
		}
		ch := s.stream
		if e == UserEvent {
			ch = s.user
		}
		select {
		case ch <- struct{}{}:
		default: // already woken
		}
	}
}

// UserKeysChanged wakes the waiters of the given users.
func (n *Notifier) UserKeysChanged(userIDs ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, u := range userIDs {
		signal(n.users[u], UserEvent)
	}
}

// Close releases every waiter, for shutdown.
func (n *Notifier) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.closed {
		n.closed = true
		close(n.closing)
		for _, subs := range n.users {
			for s := range subs {
				if s.wake != nil {
					s.wake(ClosingEvent)
				}
			}
		}
	}
}

// Waiting counts the users with open subscriptions.
func (n *Notifier) Waiting() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.users)
}

// StreamWatcher reports every advance of the stream, also those made by
// other daemons sharing the database, with the local users it concerns
// (nil: anyone).
type StreamWatcher interface {
	WatchStream(ctx context.Context, advanced func(users []string)) error
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
