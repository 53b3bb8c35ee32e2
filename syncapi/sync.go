// Package syncapi assembles /sync and answers /keys/changes: it reads the
// stream once per answer, puts the parts together from narrow sources
// declared here (the keys domain's device lists and key counts, the
// to-device inbox, account data, rooms with their ephemeral events and
// unread counts), hands out and reads back the stream tokens, and lets
// requests with nothing to answer yet wait for news (package syncnotify
// wakes them).
package syncapi

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/streamtoken"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/syncnotify"
)

// Store is the read of the stream (package sqlstore): one statement per
// answer, so that every part comes from the same snapshot.
type Store interface {
	SyncData(ctx context.Context, q storage.SyncQuery) (storage.SyncData, error)
}

// KeyStream is the keys domain's part of /sync and /keys/changes
// (keyserver.Service).
type KeyStream interface {
	// DeviceListChanges returns whose device lists changed in (from, to],
	// to capped at the stream's position, among the users userID shares a
	// room with.
	DeviceListChanges(ctx context.Context, userID string, from, to storage.StreamPos) (storage.DeviceListChanges, error)
	// SyncKeys returns the device_lists, device_one_time_keys_count and
	// device_unused_fallback_key_types parts of an answer from what d
	// holds.
	SyncKeys(d *storage.SyncData) (lists storage.DeviceListChanges, oneTimeKeyCounts map[string]int, unusedFallbackKeyTypes []string)
}

// ToDevice is the to-device part of /sync (todevice.Service).
type ToDevice interface {
	// SyncLimit is the most messages one answer carries.
	SyncLimit() int
	// SyncSection returns the to_device part of an answer at pos made of
	// msgs, and the position up to which it delivers them.
	SyncSection(pos storage.StreamPos, msgs []storage.ToDeviceMessage) (section any, delivered storage.StreamPos)
	// AckDelivered deletes the device's messages at or before upTo.
	AckDelivered(ctx context.Context, userID, deviceID string, upTo storage.StreamPos) error
}

// AccountData is the account-data part of /sync (accountdata.Service).
type AccountData interface {
	// SyncSection returns the account_data part of an answer from the
	// changes of its range.
	SyncSection(changes []storage.AccountData) any
	// SyncNews reports whether d holds account data news for a waiting
	// request, room account data counting when /sync shows rooms.
	SyncNews(d *storage.SyncData, withRooms bool) bool
}

// Presence is the presence part of /sync (presence.Service).
type Presence interface {
	// Syncing records a /sync request that may wait up to wait, with its
	// set_presence ("": the default).
	Syncing(ctx context.Context, c matrixid.Caller, setPresence string, wait time.Duration) error
	// SyncSection returns the presence part of an answer for (from, to]
	// (from 0: an initial sync), and whether the range holds changes.
	SyncSection(ctx context.Context, userID string, from, to storage.StreamPos) (section any, news bool, err error)
}

// Options are the sources and settings of /sync.
type Options struct {
	// Keys gives the device lists and key counts; required.
	Keys KeyStream
	// Notifier wakes waiting requests; nil: one of the service's own. The
	// server shares one with the domains that write the stream.
	Notifier *syncnotify.Notifier
	// MaxTimeout caps a /sync long-poll (default a minute).
	MaxTimeout time.Duration
	// AccountData gives the account_data section; nil: none.
	AccountData AccountData
	// ToDevice gives the to_device section; nil: none.
	ToDevice ToDevice
	// Rooms gives the rooms section; nil: none.
	Rooms RoomsSource
	// Unread gives the joined rooms' unread notification counts; nil:
	// none are shown.
	Unread UnreadCounter
	// Presence gives the presence section and hears of set_presence; nil:
	// none (presence is off).
	Presence Presence
	// Ephemeral give the joined rooms' ephemeral events (typing,
	// receipts); shown only with rooms.
	Ephemeral []Ephemeral
}

// Service assembles /sync and answers /keys/changes.
type Service struct {
	db       Store
	opts     Options
	keys     KeyStream
	notifier *syncnotify.Notifier
	rooms    RoomsSource // nil: /sync has no rooms part
}

// New makes a Service.
func New(db Store, opts Options) *Service {
	if opts.MaxTimeout <= 0 {
		opts.MaxTimeout = time.Minute
	}
	s := &Service{db: db, opts: opts, keys: opts.Keys, notifier: opts.Notifier, rooms: opts.Rooms}
	if s.notifier == nil {
		s.notifier = syncnotify.New()
	}
	return s
}

// SyncMaxWait is the longest a /sync request waits for news.
func (s *Service) SyncMaxWait() time.Duration { return s.opts.MaxTimeout }

// WaitingSyncs counts the users with a /sync request waiting for news.
func (s *Service) WaitingSyncs() int { return s.notifier.Waiting() }

// ChangesResponse is the answer to /keys/changes, and the device_lists
// part of /sync.
type ChangesResponse struct {
	Changed []string `json:"changed"`
	Left    []string `json:"left"`
}

// KeyChanges answers /keys/changes: whose device lists changed between two
// tokens, among the users the caller shares a room with.
func (s *Service) KeyChanges(ctx context.Context, c matrixid.Caller, from, to string) (ChangesResponse, error) {
	if from == "" {
		return ChangesResponse{}, mxerr.MissingParam("from is required")
	}
	if to == "" {
		return ChangesResponse{}, mxerr.MissingParam("to is required")
	}
	fromPos, err := streamtoken.Parse("from", from)
	if err != nil {
		return ChangesResponse{}, err
	}
	toPos, err := streamtoken.Parse("to", to)
	if err != nil {
		return ChangesResponse{}, err
	}
	ch, err := s.keys.DeviceListChanges(ctx, c.UserID, fromPos, toPos)
	if err != nil {
		return ChangesResponse{}, err
	}
	return ChangesResponse{Changed: ch.Changed, Left: ch.Left}, nil
}

// SyncResponse is a /sync answer.
type SyncResponse struct {
	NextBatch                    string           `json:"next_batch"`
	DeviceLists                  *ChangesResponse `json:"device_lists,omitempty"`
	DeviceOneTimeKeysCount       map[string]int   `json:"device_one_time_keys_count"`
	DeviceUnusedFallbackKeyTypes []string         `json:"device_unused_fallback_key_types"`
	// AccountData is present when the service has an account data source.
	AccountData any `json:"account_data,omitempty"`
	// ToDevice is present when the service keeps to-device messages.
	ToDevice any `json:"to_device,omitempty"`
	// Rooms is present when the service has rooms (see rooms.go).
	Rooms RoomsSection `json:"rooms,omitempty"`
	// Presence is present when presence is on.
	Presence any `json:"presence,omitempty"`
}

// Sync answers /sync. Without since it returns the current state at once.
// With since it returns the device-list and account data changes after
// it, waiting up to timeout for one to happen if there is none yet; it
// also returns early when the caller's own key counts change (a key was
// claimed). It also delivers the device's to-device messages, and ends
// the wait for them.
// Waiting is driven by the notifier: the database is read again only
// when something was written. Each read is one statement (SyncData),
// which has every part of the answer but the rooms' timelines: a woken
// request that has news answers with what it read.
func (s *Service) Sync(ctx context.Context, c matrixid.Caller, since string, timeout time.Duration, o SyncOptions) (SyncResponse, error) {
	p, err := s.syncBegin(ctx, c, since, timeout, o)
	if err != nil {
		return SyncResponse{}, err
	}
	if p.timeout == 0 {
		return s.syncAnswer(ctx, c, since != "", p.sincePos, p.acked, o, p.filter)
	}
	return s.syncWait(ctx, c, p.sincePos, p.acked, p.timeout, o, p.filter)
}

// syncParams are what a /sync request asks, checked: the positions, the
// filter, and how long it may wait (0: it answers at once).
type syncParams struct {
	sincePos, acked storage.StreamPos
	filter          RoomFilter
	timeout         time.Duration
}

// syncBegin checks a /sync request and acknowledges the to-device
// messages its token says the device has.
func (s *Service) syncBegin(ctx context.Context, c matrixid.Caller, since string, timeout time.Duration, o SyncOptions) (syncParams, error) {
	var p syncParams
	var err error
	switch o.SetPresence {
	case "", "online", "unavailable", "offline":
	default:
		return p, mxerr.InvalidParam("set_presence must be one of online, unavailable and offline")
	}
	if p.filter, err = s.syncFilter(ctx, c.UserID, o); err != nil {
		return p, err
	}
	if since != "" {
		if p.sincePos, err = streamtoken.Parse("since", since); err != nil {
			return p, err
		}
		if p.acked, err = parseToDeviceAck(since); err != nil {
			return p, err
		}
		// The token says the device got its messages up to acked: they go.
		if p.acked = min(p.acked, p.sincePos); p.acked > 0 && s.opts.ToDevice != nil {
			if err := s.opts.ToDevice.AckDelivered(ctx, c.UserID, c.DeviceID, p.acked); err != nil {
				return p, err
			}
		}
	}
	if since != "" {
		p.timeout = min(max(timeout, 0), s.opts.MaxTimeout)
	}
	if s.opts.Presence != nil {
		if err := s.opts.Presence.Syncing(ctx, c, o.SetPresence, p.timeout); err != nil {
			return p, err
		}
	}
	return p, nil
}

// SyncWaiter is an incremental /sync request that had nothing to answer
// yet and waits without a goroutine of its own: the notifier calls the
// wake function given to SyncOrWait, and whoever owns the waiter then
// calls Poll (after a StreamEvent) or Answer (after any other event, or
// at the end of the wait, which is the owner's to keep: the request's
// timeout, capped by SyncMaxWait), and Close once done. It holds only the
// parameters of the answer and its subscription.
type SyncWaiter struct {
	s               *Service
	c               matrixid.Caller
	o               SyncOptions
	sincePos, acked storage.StreamPos
	filter          RoomFilter
	sub             *syncnotify.Subscription
}

// SyncOrWait is Sync for callers that wait themselves: when the request
// would wait for news (it has since and a timeout, and there is nothing
// yet) it returns a SyncWaiter, subscribed before the stream was read so
// that no change is missed; otherwise the answer.
func (s *Service) SyncOrWait(ctx context.Context, c matrixid.Caller, since string, timeout time.Duration, o SyncOptions, wake func(syncnotify.Event)) (SyncResponse, *SyncWaiter, error) {
	p, err := s.syncBegin(ctx, c, since, timeout, o)
	if err != nil {
		return SyncResponse{}, nil, err
	}
	if p.timeout == 0 {
		res, err := s.syncAnswer(ctx, c, since != "", p.sincePos, p.acked, o, p.filter)
		return res, nil, err
	}
	w := &SyncWaiter{s: s, c: c, o: o, sincePos: p.sincePos, acked: p.acked, filter: p.filter}
	w.sub = s.notifier.SubscribeFunc(c.UserID, wake)
	res, news, err := w.Poll(ctx)
	if err != nil || news {
		w.Close()
		return res, nil, err
	}
	return SyncResponse{}, w, nil
}

// Poll reads the stream again after a StreamEvent: news is true when the
// request has something to answer, in res.
func (w *SyncWaiter) Poll(ctx context.Context) (res SyncResponse, news bool, err error) {
	return w.s.syncRead(ctx, w.c, true, true, &w.sincePos, w.acked, w.o, w.filter)
}

// Answer reads the stream once and answers with what it holds, news or
// not: at the end of the wait, or when the user's key counts changed.
func (w *SyncWaiter) Answer(ctx context.Context) (SyncResponse, error) {
	return w.s.syncAnswer(ctx, w.c, true, w.sincePos, w.acked, w.o, w.filter)
}

// Close ends the waiter's subscription.
func (w *SyncWaiter) Close() { w.sub.Close() }

// syncWait answers an incremental /sync once it has news, or at the end
// of the wait. It is kept apart from Sync, and reads into values it drops
// before waiting, so that what a waiting request holds is small: its
// subscription, its timer and the parameters of the answer.
func (s *Service) syncWait(ctx context.Context, c matrixid.Caller, sincePos, acked storage.StreamPos, timeout time.Duration, o SyncOptions, f RoomFilter) (SyncResponse, error) {
	sub := s.notifier.Subscribe(c.UserID)
	defer sub.Close()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		res, news, err := s.syncRead(ctx, c, true, true, &sincePos, acked, o, f)
		if err != nil || news {
			return res, err
		}
		select {
		case <-sub.Stream():
			continue
		case <-sub.User():
		case <-timer.C:
		case <-sub.Closing():
		case <-ctx.Done():
			return SyncResponse{}, ctx.Err()
		}
		return s.syncAnswer(ctx, c, true, sincePos, acked, o, f)
	}
}

// syncAnswer reads the stream once and answers with what it holds.
func (s *Service) syncAnswer(ctx context.Context, c matrixid.Caller, incremental bool, sincePos, acked storage.StreamPos, o SyncOptions, f RoomFilter) (SyncResponse, error) {
	res, _, err := s.syncRead(ctx, c, incremental, false, &sincePos, acked, o, f)
	return res, err
}

// syncRead reads the stream once and returns the answer with whether it
// has news for a waiting request: device-list changes, account data
// changes, room events, to-device messages, or ephemeral events (typing,
// receipts) of rooms the filter lets in. With onlyNews the answer
// is built only when there is news (the request waits on otherwise).
// A since beyond the stream's position is moved back to it.
func (s *Service) syncRead(ctx context.Context, c matrixid.Caller, incremental, onlyNews bool, sincePos *storage.StreamPos, acked storage.StreamPos, o SyncOptions, f RoomFilter) (SyncResponse, bool, error) {
	q := storage.SyncQuery{UserID: c.UserID, DeviceID: c.DeviceID, Since: *sincePos, ToDeviceAfter: acked}
	if s.opts.ToDevice != nil {
		q.ToDeviceLimit = s.opts.ToDevice.SyncLimit()
	}
	d, err := s.db.SyncData(ctx, q)
	if err != nil {
		return SyncResponse{}, false, err
	}
	if incremental && *sincePos > d.Pos {
		// A token from the future (another database?): start again from
		// now rather than miss everything until then. Nothing is in the
		// range (since, now], so what was read stands.
		*sincePos = d.Pos
	}
	news := len(d.DeviceLists.Changed)+len(d.DeviceLists.Left) > 0 ||
		(s.opts.ToDevice != nil && len(d.ToDevice) > 0) ||
		(s.opts.AccountData != nil && s.opts.AccountData.SyncNews(&d, s.rooms != nil)) ||
		(s.rooms != nil && len(d.RoomsWithEvents) > 0)
	var presence any
	if s.opts.Presence != nil {
		var presenceNews bool
		if presence, presenceNews, err = s.opts.Presence.SyncSection(ctx, c.UserID, *sincePos, d.Pos); err != nil {
			return SyncResponse{}, false, err
		}
		news = news || presenceNews
	}
	var eph map[string][]json.RawMessage
	if s.rooms != nil {
		eph = s.ephemeral(c.UserID, &d, f)
		news = news || len(eph) > 0
	}
	if onlyNews && !news {
		return SyncResponse{}, false, nil
	}
	res, err := s.syncResponse(ctx, c, *sincePos, &d, eph, o, f)
	res.Presence = presence
	return res, news, err
}

// syncResponse answers with what d holds: the changes in (from, d.Pos];
// from 0 (no since): the whole state; and the device's to-device
// messages.
func (s *Service) syncResponse(ctx context.Context, c matrixid.Caller, from storage.StreamPos, d *storage.SyncData, eph map[string][]json.RawMessage, o SyncOptions, f RoomFilter) (SyncResponse, error) {
	var res SyncResponse
	var delivered storage.StreamPos
	if s.opts.ToDevice != nil {
		res.ToDevice, delivered = s.opts.ToDevice.SyncSection(d.Pos, d.ToDevice)
	}
	res.NextBatch = s.syncToken(d.Pos, delivered)
	lists, counts, fallback := s.keys.SyncKeys(d)
	res.DeviceLists = &ChangesResponse{Changed: lists.Changed, Left: lists.Left}
	res.DeviceOneTimeKeysCount, res.DeviceUnusedFallbackKeyTypes = counts, fallback
	if s.opts.AccountData != nil {
		res.AccountData = s.opts.AccountData.SyncSection(d.AccountData)
	}
	var err error
	res.Rooms, err = s.roomsSection(ctx, c.UserID, c.DeviceID, from, d, eph, o, f)
	return res, err
}

// Tokens.
//
// A /sync token is "s<pos>" (package streamtoken), every change up to pos,
// followed when the server keeps to-device messages by "_d<acked>": every
// to-device message at or before acked was in this answer or an earlier
// one (see package todevice). Tokens without that part (older ones,
// /keys/changes') acknowledge nothing.

// syncToken is a /sync token: the stream position and, when the service
// keeps to-device messages, the position up to which the device received
// them.
func (s *Service) syncToken(pos, acked storage.StreamPos) string {
	tok := streamtoken.Format(pos)
	if s.opts.ToDevice != nil {
		tok += "_d" + strconv.FormatInt(int64(acked), 10)
	}
	return tok
}

// parseToDeviceAck reads the to-device part of a token; 0 when absent.
func parseToDeviceAck(tok string) (storage.StreamPos, error) {
	_, rest, _ := strings.Cut(tok, "_")
	for _, part := range strings.Split(rest, "_") {
		if num, ok := strings.CutPrefix(part, "d"); ok {
			n, err := strconv.ParseInt(num, 10, 64)
			if err != nil || n < 0 {
				return 0, mxerr.InvalidParam("since is not a valid stream token")
			}
			return storage.StreamPos(n), nil
		}
	}
	return 0, nil
}
