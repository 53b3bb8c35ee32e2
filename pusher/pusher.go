// Package pusher is push notifications: users' pushers (the /pushers
// endpoints), the evaluation of every committed room event against the
// push rules of the local users joined to its room, the unread counts
// /sync shows from it, and the delivery of notifications to the push
// gateways of the users' pushers.
//
// Evaluation follows the /sync stream: a cursor in the database says up to
// which position events have been evaluated; the notifications of a range
// and the cursor's move are written in one transaction that only commits
// if the cursor is still where the range began, so the daemons sharing a
// database each evaluate a range once. A /sync answer first brings the
// cursor up to its own position, so its counts include its events.
// Deliveries run in the background, one queue per pusher, and are not
// kept across restarts.
package pusher

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/storage"
)

// Store is what the push side keeps and reads in the database (package
// sqlstore).
type Store interface {
	Pushers(ctx context.Context, userID string) ([]storage.Pusher, error)
	SetPusher(ctx context.Context, p storage.Pusher, appendPusher bool) error
	DeletePusher(ctx context.Context, userID, appID, pushkey string) error
	CurrentPos(ctx context.Context) (storage.StreamPos, error)
	PushCursor(ctx context.Context) (storage.StreamPos, error)
	PushEvents(ctx context.Context, after, upTo storage.StreamPos, limit int) ([]storage.PushEvent, error)
	PushRoomState(ctx context.Context, roomID string) (storage.PushRoomState, error)
	CommitPushes(ctx context.Context, from, to storage.StreamPos, notifications []storage.PushNotification, reads []storage.PushRead) (bool, error)
	UnreadCounts(ctx context.Context, userID string, upTo storage.StreamPos) (map[string]storage.UnreadCount, error)
	MarkPushRead(ctx context.Context, rd storage.PushRead) error
}

// Rules gives a user's push rules, read once and run against each event
// of a range (package pushrules, through the server's adapter).
type Rules interface {
	Rules(ctx context.Context, userID string) (RuleSet, error)
}

// RuleSet is one user's push rules.
type RuleSet interface {
	// Evaluate runs the rules against an event: what the first matching
	// enabled rule says of it.
	Evaluate(ev Event) Outcome
}

// Event is an event as push rules see it, for one receiving user.
type Event struct {
	// JSON is the event (the keys conditions name: type, content,
	// sender, state_key, room_id).
	JSON map[string]any
	// UserDisplayName is the receiving user's display name in the room
	// ("" when none).
	UserDisplayName string
	// MemberCount is the number of users joined to the room.
	MemberCount int
	// SenderPowerLevel is the sender's power level in the room.
	SenderPowerLevel int
	// NotificationLevels are the power levels the room requires to
	// notify (power_levels' notifications).
	NotificationLevels map[string]int
}

// Outcome is what a user's rules say of an event.
type Outcome struct {
	Notify    bool
	Highlight bool
	// Tweaks are the matching rule's set_tweak actions.
	Tweaks map[string]any
}

// Options configure the push side.
type Options struct {
	ServerName string
	Rules      Rules
	// AddressPolicy says which addresses gateways may be reached at (the
	// federation's); nil denies every non-public address.
	AddressPolicy *fedclient.AddressPolicy
	// MinBackoff is the first wait after a failed delivery, doubled after
	// each further failure (default 1 s); once it would pass MaxBackoff
	// (default 1 h) the notification is given up and the next one tried.
	MinBackoff, MaxBackoff time.Duration
	// Timeout bounds one request to a gateway (default 15 s).
	Timeout time.Duration
	// QueueLength bounds the notifications waiting per pusher; the oldest
	// go first (default 100).
	QueueLength int
	Logger      logrus.FieldLogger
	Now         func() time.Time
}

// batchSize is how many events one evaluation step reads.
const batchSize = 200

// Service is the push side of one daemon.
type Service struct {
	db     Store
	o      Options
	client *http.Client

	mu   sync.Mutex   // one evaluation at a time
	done atomic.Int64 // the cursor as last seen
	wake chan struct{}

	stop    context.Context
	cancel  context.CancelFunc
	wmu     sync.Mutex
	workers map[workerKey]*worker
	wg      sync.WaitGroup
}

// New makes the push side; Run evaluates and delivers in the background.
func New(db Store, o Options) *Service {
	if o.MinBackoff <= 0 {
		o.MinBackoff = time.Second
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = time.Hour
	}
	if o.Timeout <= 0 {
		o.Timeout = 15 * time.Second
	}
	if o.QueueLength <= 0 {
		o.QueueLength = 100
	}
	if o.Logger == nil {
		l := logrus.New()
		l.SetLevel(logrus.WarnLevel)
		o.Logger = l
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.AddressPolicy == nil {
		o.AddressPolicy = fedclient.DefaultAddressPolicy()
	}
	s := &Service{db: db, o: o, wake: make(chan struct{}, 1), workers: map[workerKey]*worker{}}
	s.stop, s.cancel = context.WithCancel(context.Background())
	s.client = gatewayClient(o.AddressPolicy, o.Timeout)
	return s
}

// gatewayClient reaches push gateways only at addresses the policy
// allows: the check is in the dialer, after name resolution, so it holds
// for every address a name leads to and for redirects.
func gatewayClient(policy *fedclient.AddressPolicy, timeout time.Duration) *http.Client {
	dialer := &net.Dialer{Timeout: 10 * time.Second, Control: func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil || !policy.Allowed(ap.Addr().Unmap()) {
			return fedclient.ErrDeniedAddress
		}
		return nil
	}}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.DialContext = dialer.DialContext
	return &http.Client{Transport: tr, Timeout: timeout}
}

// RoomWritten follows a committed room write: the evaluation catches up
// in the background.
func (s *Service) RoomWritten(storage.RoomWriteResult) {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run evaluates the events committed until ctx ends, then stops the
// deliveries.
func (s *Service) Run(ctx context.Context) {
	defer s.Close()
	for {
		pos, err := s.db.CurrentPos(ctx)
		if err == nil {
			err = s.catchUp(ctx, pos)
		}
		// After a failure, tried again after a while even if no room is
		// written to.
		retry := time.NewTimer(time.Hour)
		if err != nil && ctx.Err() == nil {
			s.o.Logger.WithError(err).Warn("push: evaluating room events failed")
			retry.Reset(5 * time.Second)
		}
		select {
		case <-ctx.Done():
			retry.Stop()
			return
		case <-s.wake:
		case <-retry.C:
		}
		retry.Stop()
	}
}

// Close stops the deliveries (Run does when it ends) and waits for them.
func (s *Service) Close() {
	// Under the workers' lock: a delivery is queued (and its worker
	// started) either before, and waited for, or not at all.
	s.wmu.Lock()
	s.cancel()
	s.wmu.Unlock()
	s.wg.Wait()
}

// UnreadCounts returns a user's unread notifications in the rooms named,
// counting the events up to the position upTo (a /sync answer's): the
// evaluation catches up to it first. A room without notifications has
// zero counts.
func (s *Service) UnreadCounts(ctx context.Context, userID string, roomIDs []string, upTo storage.StreamPos) (map[string]storage.UnreadCount, error) {
	if err := s.catchUp(ctx, upTo); err != nil {
		// Counts a little behind are better than no /sync.
		s.o.Logger.WithError(err).Warn("push: evaluating room events for a /sync answer failed")
	}
	counts, err := s.db.UnreadCounts(ctx, userID, upTo)
	if err != nil {
		return nil, err
	}
	out := make(map[string]storage.UnreadCount, len(roomIDs))
	for _, r := range roomIDs {
		out[r] = counts[r]
	}
	return out, nil
}

// MarkRead records that a user has read a room up to the event at
// position pos (a read receipt): the room's unread counts restart after
// it. A position before one already recorded changes nothing.
func (s *Service) MarkRead(ctx context.Context, userID, roomID string, pos storage.StreamPos) error {
	// Evaluated first, so the events up to pos are counted before they
	// are marked read, not after.
	if err := s.catchUp(ctx, pos); err != nil {
		return err
	}
	return s.db.MarkPushRead(ctx, storage.PushRead{UserID: userID, RoomID: roomID, Pos: pos})
}

// isLocal reports whether a user ID is of this server.
func (s *Service) isLocal(userID string) bool {
	return strings.HasSuffix(userID, ":"+s.o.ServerName)
}
