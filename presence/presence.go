// Package presence keeps the users' presence: what they set
// (/presence/{userId}/status), what their /sync requests say
// (set_presence), the timeouts that make them idle or offline, the
// m.presence EDUs to and from other servers, and the presence section of
// /sync.
//
// The state lives in the database (storage.PresenceStore), so daemons
// sharing one see and change the same presence: each change clients are
// told of takes a stream position, which wakes the /sync requests of the
// users joined to a room with the user on every daemon, and /sync reads
// the changes of its range by position. A change of a local user is
// queued for the other servers with a user joined to a room with them,
// in the same transaction; the federation sender delivers it.
//
// The rules are Synapse's (synapse/handlers/presence.py): which changes
// are worth telling (shouldNotify), what a /sync or a PUT does to the
// state (the user's state, not one per device), and the timeouts
// (handleTimeout, with Synapse's constants below). Synapse knows which
// users are in a /sync request at the moment; here a /sync records when
// it ends at the latest (its start plus the time it may wait), so that
// every daemon's timeout pass sees a user in a long poll as syncing
// without being told when it ends.
package presence

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// The presence states.
const (
	Online      = "online"
	Unavailable = "unavailable"
	Offline     = "offline"
)

// Synapse's timeouts (synapse/handlers/presence.py).
const (
	// LastActiveGranularity: a user active this recently is
	// currently_active, and younger activity is not news.
	LastActiveGranularity = 60 * time.Second
	// SyncOnlineTimeout: a local user neither syncing nor active for this
	// long goes offline.
	SyncOnlineTimeout = 30 * time.Second
	// IdleTimer: an online local user not active for this long becomes
	// unavailable.
	IdleTimer = 5 * time.Minute
	// FederationTimeout: a remote user whose server sent nothing for this
	// long goes offline.
	FederationTimeout = 30 * time.Minute
	// FederationPingInterval: a local user's presence that is not offline
	// is sent again to other servers this often, so that they do not time
	// it out.
	FederationPingInterval = 25 * time.Minute
	// TimeoutInterval is how often the timeouts are checked (Synapse's
	// timer wheel turns every 5 s).
	TimeoutInterval = 5 * time.Second
)

// syncSlack is how much further a /sync's recorded end is put than its
// wait, and how much activity may age before it is written again: a user
// who syncs continuously costs a write every syncSlack, not one per
// /sync, and is never seen as gone while syncing.
const syncSlack = 10 * time.Second

// timeoutBatch bounds the users one timeout pass looks at.
const timeoutBatch = 500

// Store is what presence keeps in the database.
type Store interface {
	storage.PresenceStore
	// AccountExists reports whether a local user has an account.
	AccountExists(ctx context.Context, userID string) (bool, error)
	// RoomJoinedServers returns the servers with a user joined to a room.
	RoomJoinedServers(ctx context.Context, roomID string) ([]string, error)
	// CurrentPos returns the stream's newest position.
	CurrentPos(ctx context.Context) (storage.StreamPos, error)
}

// Options configure the Service.
type Options struct {
	ServerName string
	// Enabled keeps and shares presence; off, nothing is stored or sent,
	// other servers' presence is ignored and the endpoints answer as
	// Synapse does with presence off.
	Enabled bool
	// Changed wakes the /sync requests a committed change concerns.
	Changed func(storage.Change)
	// Queued says EDUs were queued for other servers; nil: nothing is
	// sent (no federation).
	Queued func()
	Logger logrus.FieldLogger
	Now    func() time.Time // the clock; time.Now when nil
}

// Service keeps presence.
type Service struct {
	db Store
	o  Options
	// joins are the positions of room writes to look at for joins (see
	// joins.go).
	joins chan storage.StreamPos
}

// New makes a Service.
func New(db Store, o Options) *Service {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = logrus.StandardLogger()
	}
	if o.Changed == nil {
		o.Changed = func(storage.Change) {}
	}
	return &Service{db: db, o: o, joins: make(chan storage.StreamPos, joinsBacklog)}
}

// Enabled reports whether presence is kept.
func (s *Service) Enabled() bool { return s.o.Enabled }

// ValidState reports whether state is a presence state clients may set.
func ValidState(state string) bool {
	return state == Online || state == Unavailable || state == Offline
}

// SetRequest is the body of PUT /presence/{userId}/status.
type SetRequest struct {
	Presence string
	// StatusMsg is the new status message; nil: none (a PUT without one
	// clears it, as in Synapse).
	StatusMsg *string
}

// SetStatus sets the caller's presence (PUT /presence/{userId}/status):
// only one's own. With presence off it is accepted and nothing is stored.
func (s *Service) SetStatus(ctx context.Context, c matrixid.Caller, userID string, r SetRequest) error {
	if _, ok := matrixid.ParseUserID(userID); !ok {
		return mxerr.InvalidParam("%q is not a valid user ID", userID)
	}
	if userID != c.UserID {
		return mxerr.Forbidden("you can only set your own presence state")
	}
	if !s.o.Enabled {
		return nil
	}
	if !ValidState(r.Presence) {
		return mxerr.InvalidParam("presence must be one of %q, %q and %q", Online, Unavailable, Offline)
	}
	msg := ""
	if r.StatusMsg != nil {
		msg = *r.StatusMsg
	}
	now := s.o.Now().UnixMilli()
	return s.update(ctx, userID, func(prev storage.Presence) (storage.Presence, bool) {
		next := prev
		next.State, next.StatusMsg = r.Presence, msg
		if r.Presence == Online {
			next.LastActiveTS = now
		}
		// The client was there now: as in Synapse, where a PUT makes its
		// device active, the user goes offline SyncOnlineTimeout after it
		// unless they sync.
		next.LastUserSyncTS = max(prev.LastUserSyncTS, now)
		return next, true
	})
}

// Status is the answer of GET /presence/{userId}/status.
type Status struct {
	Presence        string `json:"presence"`
	LastActiveAgo   *int64 `json:"last_active_ago,omitempty"`
	StatusMsg       string `json:"status_msg,omitempty"`
	CurrentlyActive *bool  `json:"currently_active,omitempty"`
}

// Status answers GET /presence/{userId}/status: one's own presence, or
// that of a user one is joined to a room with (403 otherwise; 404 for a
// local user without an account). With presence off every user is
// offline, as in Synapse.
func (s *Service) Status(ctx context.Context, c matrixid.Caller, userID string) (Status, error) {
	if _, ok := matrixid.ParseUserID(userID); !ok {
		return Status{}, mxerr.InvalidParam("%q is not a valid user ID", userID)
	}
	if !s.o.Enabled {
		return Status{Presence: Offline}, nil
	}
	if userID != c.UserID {
		if matrixid.Server(userID) == s.o.ServerName {
			exists, err := s.db.AccountExists(ctx, userID)
			if err != nil {
				return Status{}, err
			}
			if !exists {
				return Status{}, mxerr.NotFound("there is no user %s", userID)
			}
		}
		shared, err := s.db.ShareJoinedRoom(ctx, c.UserID, userID)
		if err != nil {
			return Status{}, err
		}
		if !shared {
			return Status{}, mxerr.Forbidden("you are not allowed to see their presence")
		}
	}
	stored, err := s.db.Presence(ctx, []string{userID})
	if err != nil {
		return Status{}, err
	}
	p, ok := stored[userID]
	if !ok {
		p = storage.Presence{UserID: userID, State: Offline}
	}
	return format(p, s.o.Now().UnixMilli()), nil
}

// format is a presence as clients and other servers see it (Synapse's
// format_user_presence_state, without the user ID).
func format(p storage.Presence, now int64) Status {
	st := Status{Presence: p.State, StatusMsg: p.StatusMsg}
	if p.LastActiveTS != 0 {
		ago := max(now-p.LastActiveTS, 0)
		st.LastActiveAgo = &ago
	}
	if p.State == Online {
		active := p.CurrentlyActive
		st.CurrentlyActive = &active
	}
	return st
}

// Syncing records a /sync request of the caller's that may wait up to
// wait, with its set_presence ("" for the default, online): it marks the
// user online (or unavailable) as Synapse does, and records that the user
// syncs until the request ends. set_presence offline leaves presence
// alone. The caller checks setPresence (ValidState).
func (s *Service) Syncing(ctx context.Context, c matrixid.Caller, setPresence string, wait time.Duration) error {
	if !s.o.Enabled || setPresence == Offline {
		return nil
	}
	if setPresence == "" {
		setPresence = Online
	}
	now := s.o.Now()
	nowMS, until := now.UnixMilli(), now.Add(wait).UnixMilli()
	return s.update(ctx, c.UserID, func(prev storage.Presence) (storage.Presence, bool) {
		next := prev
		next.State = setPresence
		write := prev.State != setPresence
		if setPresence == Online && nowMS-prev.LastActiveTS >= syncSlack.Milliseconds() {
			next.LastActiveTS, write = nowMS, true
		}
		if until > prev.LastUserSyncTS {
			next.LastUserSyncTS, write = until+syncSlack.Milliseconds(), true
		}
		return next, write
	})
}

// update applies a change of a local user's presence, then Synapse's
// handle_update: change makes the new state from the stored one and says
// whether anything is worth writing. It reads first, and writes (deciding
// again on the row it holds) only when something changes.
func (s *Service) update(ctx context.Context, userID string, change func(prev storage.Presence) (storage.Presence, bool)) error {
	now := s.o.Now().UnixMilli()
	decide := func(prev storage.Presence, _ bool) storage.PresenceWrite {
		next, write := change(prev)
		next, notify, ping := handleUpdate(prev, next, true, now)
		w := storage.PresenceWrite{Presence: next, Write: write || notify || ping, Notify: notify}
		if (notify || ping) && s.o.Queued != nil {
			w.Federate = pushEntry(next, now)
		}
		return w
	}
	stored, err := s.db.Presence(ctx, []string{userID})
	if err != nil {
		return err
	}
	prev, ok := stored[userID]
	if !ok {
		prev = storage.Presence{UserID: userID, State: Offline}
	}
	if !decide(prev, ok).Write {
		return nil
	}
	return s.write(ctx, userID, decide)
}

// write runs one decision in the database and passes the change on.
func (s *Service) write(ctx context.Context, userID string, decide func(storage.Presence, bool) storage.PresenceWrite) error {
	ch, queued, err := s.db.UpdatePresence(ctx, userID, decide)
	if err != nil {
		return err
	}
	s.o.Changed(ch)
	if queued && s.o.Queued != nil {
		s.o.Queued()
	}
	return nil
}

// pushEntry is a local user's entry of an m.presence EDU's push list.
func pushEntry(p storage.Presence, now int64) json.RawMessage {
	st := format(p, now)
	entry := map[string]any{"user_id": p.UserID, "presence": st.Presence}
	if st.LastActiveAgo != nil {
		entry["last_active_ago"] = *st.LastActiveAgo
	}
	if st.StatusMsg != "" {
		entry["status_msg"] = st.StatusMsg
	}
	if st.CurrentlyActive != nil {
		entry["currently_active"] = *st.CurrentlyActive
	}
	b, _ := json.Marshal(entry) // strings, numbers and booleans always marshal
	return b
}

// handleUpdate is Synapse's handle_update: the state to keep, whether
// clients (and other servers) are told (notify), and whether other
// servers are sent it again although nothing changed (ping).
func handleUpdate(prev, next storage.Presence, local bool, now int64) (_ storage.Presence, notify, ping bool) {
	if local {
		// Only an online user is currently active.
		next.CurrentlyActive = next.State == Online && now-next.LastActiveTS < LastActiveGranularity.Milliseconds()
		if next.State != Offline && now-next.LastFederationUpdateTS > FederationPingInterval.Milliseconds() {
			next.LastFederationUpdateTS, ping = now, true
		}
	}
	if shouldNotify(prev, next) {
		if local {
			next.LastFederationUpdateTS = now
		}
		notify = true
	}
	return next, notify, ping
}

// shouldNotify is Synapse's should_notify: whether a change of state is
// worth telling.
func shouldNotify(prev, next storage.Presence) bool {
	switch {
	case prev.StatusMsg != next.StatusMsg, prev.State != next.State:
		return true
	case prev.State == Online:
		if prev.CurrentlyActive != next.CurrentlyActive {
			return true
		}
		return next.LastActiveTS-prev.LastActiveTS > LastActiveGranularity.Milliseconds() && !next.CurrentlyActive
	default:
		return next.LastActiveTS-prev.LastActiveTS > LastActiveGranularity.Milliseconds()
	}
}

// handleTimeout is Synapse's handle_timeout for one user (one state per
// user): the state after the timers that ran out, and whether it is
// worth looking at (then handleUpdate decides what is written).
func handleTimeout(p storage.Presence, local bool, now int64) (storage.Presence, bool) {
	if p.State == Offline {
		return p, false
	}
	changed := false
	if local {
		if p.State == Online && now-p.LastActiveTS > IdleTimer.Milliseconds() {
			p.State, changed = Unavailable, true
		}
		if now-max(p.LastUserSyncTS, p.LastActiveTS) > SyncOnlineTimeout.Milliseconds() {
			p.State, changed = Offline, true
		}
		if now-p.LastActiveTS > LastActiveGranularity.Milliseconds() && p.CurrentlyActive {
			changed = true
		}
		if now-p.LastFederationUpdateTS > FederationPingInterval.Milliseconds() {
			changed = true
		}
	} else if now-p.LastFederationUpdateTS > FederationTimeout.Milliseconds() {
		p.State, changed = Offline, true
	}
	return p, changed
}

// HandleTimeouts runs one pass of the timeouts: users who stopped syncing
// go offline, idle ones unavailable, remote users whose server went quiet
// offline, and local presence is sent again to other servers when due.
// Daemons sharing the database may run it at once: each user's decision
// is taken on the row the database holds for it.
func (s *Service) HandleTimeouts(ctx context.Context) error {
	if !s.o.Enabled {
		return nil
	}
	now := s.o.Now().UnixMilli()
	due := storage.PresenceDue{
		SyncBefore:   now - SyncOnlineTimeout.Milliseconds(),
		IdleBefore:   now - IdleTimer.Milliseconds(),
		ActiveBefore: now - LastActiveGranularity.Milliseconds(),
		PingBefore:   now - FederationPingInterval.Milliseconds(),
		RemoteBefore: now - FederationTimeout.Milliseconds(),
	}
	users, err := s.db.DuePresence(ctx, due, timeoutBatch)
	if err != nil {
		return err
	}
	var errs []error
	for _, u := range users {
		local := matrixid.Server(u) == s.o.ServerName
		errs = append(errs, s.write(ctx, u, func(prev storage.Presence, _ bool) storage.PresenceWrite {
			next, changed := handleTimeout(prev, local, now)
			if !changed {
				return storage.PresenceWrite{}
			}
			next, notify, ping := handleUpdate(prev, next, local, now)
			w := storage.PresenceWrite{Presence: next, Write: true, Notify: notify}
			if local && (notify || ping) && s.o.Queued != nil {
				w.Federate = pushEntry(next, now)
			}
			return w
		}))
	}
	return errors.Join(errs...)
}

// Run checks the timeouts every TimeoutInterval, and sends presence to
// the servers that room writes make share a room, until ctx ends.
func (s *Service) Run(ctx context.Context) {
	if !s.o.Enabled {
		return
	}
	t := time.NewTicker(TimeoutInterval)
	defer t.Stop()
	// The joins looked at are those after the position at the start.
	looked, err := s.db.CurrentPos(ctx)
	if err != nil {
		s.o.Logger.WithError(err).Warn("presence: cannot read the stream's position")
	}
	for {
		select {
		case <-ctx.Done():
			return
		case pos := <-s.joins:
			if looked == 0 {
				looked = pos - 1
			}
			if pos <= looked {
				continue
			}
			if err := s.announceJoins(ctx, looked, pos); err != nil && ctx.Err() == nil {
				s.o.Logger.WithError(err).Warn("presence for servers joining rooms")
			}
			looked = pos
		case <-t.C:
			if err := s.HandleTimeouts(ctx); err != nil && ctx.Err() == nil {
				s.o.Logger.WithError(err).Warn("presence timeouts")
			}
		}
	}
}
