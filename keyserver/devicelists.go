package keyserver

import (
	"context"
	"time"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/streamtoken"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/syncnotify"
)

// ChangesResponse is the answer to /keys/changes.
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
	// "to" may lie beyond what has happened yet; it is only a bound.
	cur, err := s.db.CurrentPos(ctx)
	if err != nil {
		return ChangesResponse{}, err
	}
	toPos = min(toPos, cur)
	ch, err := s.db.DeviceListChanges(ctx, c.UserID, fromPos, toPos)
	if err != nil {
		return ChangesResponse{}, err
	}
	return ChangesResponse{Changed: ch.Changed, Left: ch.Left}, nil
}

// SyncResponse is the end-to-end part of /sync.
type SyncResponse struct {
	NextBatch                    string           `json:"next_batch"`
	DeviceLists                  *ChangesResponse `json:"device_lists,omitempty"`
	DeviceOneTimeKeysCount       map[string]int   `json:"device_one_time_keys_count"`
	DeviceUnusedFallbackKeyTypes []string         `json:"device_unused_fallback_key_types"`
	// AccountData is present when the service has an account data source.
	AccountData *AccountDataSection `json:"account_data,omitempty"`
	// ToDevice is present when the service keeps to-device messages.
	ToDevice *ToDeviceSection `json:"to_device,omitempty"`
	// Rooms is present when the service has rooms (see syncrooms.go).
	Rooms *roomserver.SyncRooms `json:"rooms,omitempty"`
}

// Sync answers /sync. Without since it returns the current state at once.
// With since it returns the device-list and account data changes after
// it (see accountdata.go), waiting up to timeout for one to happen if
// there is none yet; it also returns early when the caller's own key
// counts change (a key was claimed). It also delivers the device's
// to-device messages (see todevice.go), and ends the wait for them.
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
	filter          roomserver.Filter
	timeout         time.Duration
}

// syncBegin checks a /sync request and acknowledges the to-device
// messages its token says the device has.
func (s *Service) syncBegin(ctx context.Context, c matrixid.Caller, since string, timeout time.Duration, o SyncOptions) (syncParams, error) {
	var p syncParams
	var err error
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
			if err := s.opts.ToDevice.AckToDevice(ctx, c.UserID, c.DeviceID, p.acked); err != nil {
				return p, err
			}
		}
	}
	if since != "" {
		p.timeout = min(max(timeout, 0), s.opts.SyncMaxTimeout)
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
	filter          roomserver.Filter
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
func (s *Service) syncWait(ctx context.Context, c matrixid.Caller, sincePos, acked storage.StreamPos, timeout time.Duration, o SyncOptions, f roomserver.Filter) (SyncResponse, error) {
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
func (s *Service) syncAnswer(ctx context.Context, c matrixid.Caller, incremental bool, sincePos, acked storage.StreamPos, o SyncOptions, f roomserver.Filter) (SyncResponse, error) {
	res, _, err := s.syncRead(ctx, c, incremental, false, &sincePos, acked, o, f)
	return res, err
}

// syncRead reads the stream once and returns the answer with whether it
// has news for a waiting request: device-list changes, account data
// changes, room events, or to-device messages. With onlyNews the answer
// is built only when there is news (the request waits on otherwise).
// A since beyond the stream's position is moved back to it.
func (s *Service) syncRead(ctx context.Context, c matrixid.Caller, incremental, onlyNews bool, sincePos *storage.StreamPos, acked storage.StreamPos, o SyncOptions, f roomserver.Filter) (SyncResponse, bool, error) {
	d, err := s.db.SyncData(ctx, storage.SyncQuery{UserID: c.UserID, DeviceID: c.DeviceID, Since: *sincePos,
		ToDeviceAfter: acked, ToDeviceLimit: maxToDevicePerSync})
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
		(s.opts.AccountData != nil && s.accountDataNews(d)) ||
		(s.rooms != nil && len(d.RoomsWithEvents) > 0)
	if onlyNews && !news {
		return SyncResponse{}, false, nil
	}
	res, err := s.syncResponse(ctx, c, *sincePos, &d, o, f)
	return res, news, err
}

// syncResponse answers with what d holds: the changes in (from, d.Pos];
// from 0 (no since): the whole state; and the device's to-device
// messages.
func (s *Service) syncResponse(ctx context.Context, c matrixid.Caller, from storage.StreamPos, d *storage.SyncData, o SyncOptions, f roomserver.Filter) (SyncResponse, error) {
	toDevice, delivered := s.toDeviceSection(d.Pos, d.ToDevice)
	res := SyncResponse{
		NextBatch:                    s.syncToken(d.Pos, delivered),
		ToDevice:                     toDevice,
		DeviceLists:                  &ChangesResponse{Changed: d.DeviceLists.Changed, Left: d.DeviceLists.Left},
		DeviceOneTimeKeysCount:       withSignedCurve(d.OneTimeKeyCounts),
		DeviceUnusedFallbackKeyTypes: d.UnusedFallbackKeyTypes,
		AccountData:                  s.accountDataSection(d.AccountData),
	}
	var err error
	res.Rooms, err = s.roomsSection(ctx, c.UserID, from, d, o, f)
	return res, err
}

// SetMembership records that a user (local or remote) joined or left a
// room. Membership is fed by an administrator or a homeserver until rooms
// are ours; the device-list logic only reads it.
func (s *Service) SetMembership(ctx context.Context, roomID, userID, membership string) error {
	// One rule for room IDs everywhere: room version 12's have no
	// ":server" part.
	if !matrixid.ValidRoomID(roomID) {
		return mxerr.InvalidParam("%q is not a valid room ID", roomID)
	}
	if _, ok := matrixid.ParseUserID(userID); !ok {
		return mxerr.InvalidParam("%q is not a valid user ID", userID)
	}
	if membership != storage.MembershipJoin && membership != storage.MembershipLeave {
		return mxerr.InvalidParam("membership must be %q or %q", storage.MembershipJoin, storage.MembershipLeave)
	}
	res, err := s.db.SetMembership(ctx, roomID, userID, membership, s.nowMS())
	if err != nil {
		return err
	}
	s.membershipChanged(res.Change, res.NewlyStale)
	if res.DeviceUpdatesQueued && s.sender != nil {
		s.sender.Poke()
	}
	return nil
}

func (s *Service) membershipChanged(ch storage.Change, newlyStale []storage.StaleUser) {
	s.streamAdvanced(ch)
	if len(newlyStale) > 0 && s.updater != nil {
		s.updater.Wake()
	}
}
