// Package typing is who is typing in which room: PUT
// /rooms/{roomId}/typing/{userId} for the local users, m.typing EDUs for
// other servers' users, and the m.typing events of the rooms' ephemeral
// part of /sync.
//
// Typing lives in the database, not in the memory of one daemon: daemons
// sharing a database serve one server, and a client's /sync may land on
// another daemon than its typing request. Each change of who is typing in
// a room takes a stream position, so that /sync tokens cover it and the
// waiting /sync requests of the room's local members wake, on every
// daemon. A typing ends when its timeout runs out: Run ends the typings
// due (any daemon may, each ending counted once), and /sync never shows
// a typing that has ended even before then.
//
// As Synapse does, a local user's timeout defaults to 30 s and is capped
// at 2 minutes; another server's user types until it says otherwise or
// for 60 s after its last EDU; a local user's start and stop go to the
// room's other servers as m.typing EDUs (a stop also when the timeout
// ends), a running typing again every 40 s; starting again while typing
// changes nothing anyone sees.
package typing

import (
	"context"
	"encoding/json"
	"sort"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/clock"
	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/reqlog"
	"github.com/keyserver/keyserver/storage"
)

// EDUType is the type of the events and EDUs of typing.
const EDUType = "m.typing"

// The timeouts, as Synapse has them.
const (
	// DefaultTimeout is a local typing's timeout when the request names
	// none; MaxTimeout caps the one it names.
	DefaultTimeout = 30 * time.Second
	MaxTimeout     = 2 * time.Minute
	// RemoteTimeout is how long another server's user types after its
	// last m.typing EDU; KeepAlive how often a local user's running
	// typing is sent again, so that other servers keep it.
	RemoteTimeout = time.Minute
	KeepAlive     = 40 * time.Second
	// recheck is the longest the ender of typings sleeps: typings started
	// by another daemon of the database end here too if it is gone.
	recheck = time.Minute
)

// Store is what typing keeps in the database (package sqlstore).
type Store interface {
	storage.Typing
	// RoomMembership returns a user's membership of a room ("" when none).
	RoomMembership(ctx context.Context, roomID, userID string) (string, error)
}

// Options configure a Service.
type Options struct {
	ServerName string
	// Federated sends the local users' typing to the rooms' other
	// servers; without, nothing is sent.
	Federated bool
	// Changed is told of each committed change, to wake the waiting
	// /sync requests it concerns; Queued when EDUs were queued for other
	// servers. Either may be nil.
	Changed func(storage.Change)
	Queued  func()
	Logger  logrus.FieldLogger
	Clock   clock.Clock
}

// Service keeps who is typing.
type Service struct {
	db   Store
	o    Options
	wake chan struct{}
}

// New makes a Service.
func New(db Store, o Options) *Service {
	if o.Changed == nil {
		o.Changed = func(storage.Change) {}
	}
	if o.Queued == nil {
		o.Queued = func() {}
	}
	if o.Logger == nil {
		o.Logger = logrus.StandardLogger()
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	return &Service{db: db, o: o, wake: make(chan struct{}, 1)}
}

// edu is the content of an m.typing EDU.
type edu struct {
	RoomID string `json:"room_id"`
	UserID string `json:"user_id"`
	Typing bool   `json:"typing"`
}

// Set answers PUT /rooms/{roomId}/typing/{userId}: body is
// {"typing": true, "timeout": ms} or {"typing": false}. Only the caller's
// own typing can be set (400 M_FORBIDDEN otherwise, as in Synapse), only
// in a room the caller is joined to (403 M_FORBIDDEN).
func (s *Service) Set(ctx context.Context, c matrixid.Caller, roomID, userID string, body map[string]json.RawMessage) error {
	if !matrixid.ValidRoomID(roomID) {
		return mxerr.InvalidParam("%q is not a valid room ID", roomID)
	}
	if server, ok := matrixid.ParseUserID(userID); !ok {
		return mxerr.InvalidParam("%q is not a valid user ID", userID)
	} else if server != s.o.ServerName {
		return mxerr.InvalidParam("user %s is not of this server", userID)
	}
	if userID != c.UserID {
		return mxerr.New(400, "M_FORBIDDEN", "cannot set another user's typing state")
	}
	raw, ok := body["typing"]
	if !ok || string(raw) == "null" {
		return mxerr.MissingParam("typing is required")
	}
	var typing bool
	if json.Unmarshal(raw, &typing) != nil {
		return mxerr.InvalidParam("typing must be a boolean")
	}
	timeout := DefaultTimeout
	if raw, ok := body["timeout"]; ok && typing && string(raw) != "null" {
		var ms int64
		if json.Unmarshal(raw, &ms) != nil || ms < 0 {
			return mxerr.InvalidParam("timeout must be a non-negative integer of milliseconds")
		}
		timeout = time.Duration(min(ms, MaxTimeout.Milliseconds())) * time.Millisecond
	}
	membership, err := s.db.RoomMembership(ctx, roomID, userID)
	if err != nil {
		return err
	}
	if membership != "join" {
		return mxerr.Forbidden("user %s is not in room %s", userID, roomID)
	}
	now := s.o.Clock.Now()
	u := storage.TypingUpdate{RoomID: roomID, UserID: userID, Typing: typing, Now: now.UnixMilli(),
		ExpiresTS: now.Add(timeout).UnixMilli()}
	if s.o.Federated {
		if u.EDU, err = json.Marshal(edu{RoomID: roomID, UserID: userID, Typing: typing}); err != nil {
			return err
		}
		u.ResendAfter = KeepAlive.Milliseconds()
	}
	if err := s.apply(ctx, u); err != nil {
		return err
	}
	if typing {
		s.poke()
	}
	return nil
}

// apply writes an update and passes its change on.
func (s *Service) apply(ctx context.Context, u storage.TypingUpdate) error {
	ch, queued, err := s.db.SetTyping(ctx, u)
	if err != nil {
		return err
	}
	s.o.Changed(ch)
	if queued {
		s.o.Queued()
	}
	return nil
}

// ReceiveTyping takes an m.typing EDU from origin (authenticated): the
// typing of one of origin's users who is joined to the room. Any other
// EDU is dropped without an error.
func (s *Service) ReceiveTyping(ctx context.Context, origin string, content json.RawMessage) error {
	var e struct {
		RoomID string `json:"room_id"`
		UserID string `json:"user_id"`
		Typing *bool  `json:"typing"`
	}
	log := reqlog.From(ctx, s.o.Logger).WithField("origin", origin)
	if json.Unmarshal(content, &e) != nil || e.Typing == nil || !matrixid.ValidRoomID(e.RoomID) {
		log.Debug("dropped a malformed m.typing")
		return nil
	}
	if server, ok := matrixid.ParseUserID(e.UserID); !ok || server != origin {
		log.WithField("user_id", e.UserID).Debug("dropped an m.typing of a user not on its origin")
		return nil
	}
	membership, err := s.db.RoomMembership(ctx, e.RoomID, e.UserID)
	if err != nil {
		return err
	}
	if membership != "join" {
		log.WithFields(logrus.Fields{"user_id": e.UserID, "room_id": e.RoomID}).Debug("dropped an m.typing of a user not in the room")
		return nil
	}
	now := s.o.Clock.Now()
	if err := s.apply(ctx, storage.TypingUpdate{RoomID: e.RoomID, UserID: e.UserID, Typing: *e.Typing,
		Now: now.UnixMilli(), ExpiresTS: now.Add(RemoteTimeout).UnixMilli()}); err != nil {
		return err
	}
	if *e.Typing {
		s.poke()
	}
	return nil
}

// RoomTyping returns who is typing in a room now.
func (s *Service) RoomTyping(ctx context.Context, roomID string) ([]string, error) {
	return s.db.RoomTyping(ctx, roomID, s.o.Clock.Now().UnixMilli())
}

// poke tells Run that a typing started, which may end before the one it
// waits for.
func (s *Service) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run ends the typings whose timeout ran out, and sends the local users'
// running typings again every KeepAlive, until ctx ends.
func (s *Service) Run(ctx context.Context) {
	for {
		wait := s.EndDue(ctx)
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-s.o.Clock.After(wait):
		}
	}
}

// EndDue ends the typings whose timeout ran out, sends again the running
// typings whose EDU was sent KeepAlive ago, and returns how long until
// the next of either is due (at most a minute).
func (s *Service) EndDue(ctx context.Context) time.Duration {
	now := s.o.Clock.Now()
	due, err := s.db.ExpiredTyping(ctx, now.UnixMilli())
	if err != nil && ctx.Err() == nil {
		s.o.Logger.WithError(err).Warn("typing: reading the typings to end failed")
		return time.Second
	}
	for _, t := range due {
		u := storage.TypingUpdate{RoomID: t.RoomID, UserID: t.UserID, Now: now.UnixMilli(), ExpiredBy: now.UnixMilli()}
		if s.o.Federated && matrixid.Server(t.UserID) == s.o.ServerName {
			u.EDU, _ = json.Marshal(edu{RoomID: t.RoomID, UserID: t.UserID, Typing: false})
		}
		if err := s.apply(ctx, u); err != nil {
			if ctx.Err() == nil {
				s.o.Logger.WithError(err).Warn("typing: ending a typing failed")
			}
			return time.Second
		}
	}
	if s.o.Federated {
		again, err := s.db.TypingToResend(ctx, now.Add(-KeepAlive).UnixMilli(), now.UnixMilli())
		if err != nil {
			if ctx.Err() == nil {
				s.o.Logger.WithError(err).Warn("typing: reading the typings to send again failed")
			}
			return time.Second
		}
		for _, t := range again {
			u := storage.TypingUpdate{RoomID: t.RoomID, UserID: t.UserID, Typing: true, ExpiresTS: t.ExpiresTS,
				Now: now.UnixMilli(), ResendAfter: KeepAlive.Milliseconds()}
			u.EDU, _ = json.Marshal(edu{RoomID: t.RoomID, UserID: t.UserID, Typing: true})
			if err := s.apply(ctx, u); err != nil {
				if ctx.Err() == nil {
					s.o.Logger.WithError(err).Warn("typing: sending a typing again failed")
				}
				return time.Second
			}
		}
	}
	at, ok, err := s.db.NextTypingWork(ctx, KeepAlive.Milliseconds())
	if err != nil || !ok {
		return recheck
	}
	return min(max(time.UnixMilli(at).Sub(s.o.Clock.Now()), time.Millisecond), recheck)
}

// SyncEphemeral returns the m.typing events of the rooms whose typing d
// holds (those the user is joined to whose typing changed in its range),
// by room: who is typing at the time of the answer.
func (s *Service) SyncEphemeral(userID string, d *storage.SyncData) map[string][]json.RawMessage {
	if len(d.TypingRooms) == 0 {
		return nil
	}
	now := s.o.Clock.Now().UnixMilli()
	users := map[string][]string{}
	for _, t := range d.Typing {
		if t.ExpiresTS > now {
			users[t.RoomID] = append(users[t.RoomID], t.UserID)
		}
	}
	out := make(map[string][]json.RawMessage, len(d.TypingRooms))
	for _, room := range d.TypingRooms {
		ids := users[room]
		if ids == nil {
			ids = []string{}
		}
		sort.Strings(ids)
		ev, err := json.Marshal(map[string]any{"type": EDUType, "content": map[string]any{"user_ids": ids}})
		if err != nil {
			continue
		}
		out[room] = append(out[room], ev)
	}
	return out
}
