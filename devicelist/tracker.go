package devicelist

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sync/singleflight"

	"github.com/keyserver/keyserver/crosssigning"
	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/internal/metrics"
	"github.com/keyserver/keyserver/internal/reqlog"
	"github.com/keyserver/keyserver/storage"
)

// MaxRemoteDevices caps what one remote user can make us store.
const MaxRemoteDevices = 1000

// Federation is what the tracker asks of other servers.
type Federation interface {
	UserDevices(ctx context.Context, server, userID string) (fedclient.UserDevices, error)
}

// TrackerStore is what the tracker uses of the database: the cache of
// remote device lists with its stale queue, and the memberships that say
// whether a user shares a room with a local one.
type TrackerStore interface {
	storage.RemoteDeviceLists
	storage.StaleQueue
	SharesRoomWithLocal(ctx context.Context, userID string) (bool, error)
}

// StaleLists is the updater as the tracker tells it of new work.
type StaleLists interface{ Wake() }

// TrackerOptions are the tracker's settings and what it tells of changes.
type TrackerOptions struct {
	// Federation reaches other servers; nil: every fetch fails.
	Federation Federation
	// SendWait bounds how long an incoming transaction waits for the
	// resyncs its device-list updates need (default 10 s).
	SendWait time.Duration
	// UntrackedCacheTTL is how long a remote device list is trusted when
	// no local user shares a room with its user (so no updates arrive;
	// default a minute).
	UntrackedCacheTTL time.Duration
	// Changed is told of each committed change of a cached list (the
	// server's change fan-out: it wakes the /sync requests concerned);
	// nil: nobody.
	Changed func(storage.Change)
	// StaleLists is the updater, woken when a resync is left to it; nil:
	// none.
	StaleLists StaleLists
	Logger     logrus.FieldLogger
	Now        func() time.Time // the clock; time.Now when nil
}

// Tracker keeps the cache of remote device lists.
type Tracker struct {
	db      TrackerStore
	fed     Federation
	updater StaleLists
	opts    TrackerOptions
	// resyncs shares one fetch of a remote user's list among the queries
	// that need it at once (see sharedResync).
	resyncs singleflight.Group
	log     logrus.FieldLogger
}

// NewTracker makes a Tracker.
func NewTracker(db TrackerStore, opts TrackerOptions) *Tracker {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = logrus.StandardLogger()
	}
	if opts.SendWait <= 0 {
		opts.SendWait = 10 * time.Second
	}
	if opts.UntrackedCacheTTL <= 0 {
		opts.UntrackedCacheTTL = time.Minute
	}
	return &Tracker{db: db, fed: opts.Federation, updater: opts.StaleLists, opts: opts, log: opts.Logger}
}

// ResyncStale fetches and stores a stale remote user's device list for
// the updater, unless another daemon holds the resync (it is due again if
// that one fails).
func (s *Tracker) ResyncStale(ctx context.Context, server, userID string) error {
	_, err := s.heldResync(ctx, server, userID, false)
	return err
}

var errNoFederation = errors.New("federation is not configured")

// logger is the logger of the request ctx belongs to (with its request
// ID), or the tracker's.
func (s *Tracker) logger(ctx context.Context) logrus.FieldLogger { return reqlog.From(ctx, s.log) }

func (s *Tracker) nowMS() int64 { return s.opts.Now().UnixMilli() }

// streamAdvanced passes on a committed change (Pos 0: nothing changed).
func (s *Tracker) streamAdvanced(ch storage.Change) {
	if ch.Pos > 0 && s.opts.Changed != nil {
		s.opts.Changed(ch)
	}
}

// Lists returns the device lists of users of one server: from
// the cache when it can be trusted, otherwise fetched (and cached). A list
// can be trusted when it is not marked stale and either the user shares a
// room with one of ours (so their server sends us every change) or it was
// fetched less than UntrackedCacheTTL ago. When fetching fails, a cached
// copy is still returned, with the error.
func (s *Tracker) Lists(ctx context.Context, server string, userIDs []string) (map[string]*storage.RemoteDeviceList, error) {
	now := s.nowMS() // before the read: a list fetched since is as new as a fetch of ours (sharedResync)
	cached, err := s.db.RemoteDeviceLists(ctx, userIDs)
	if err != nil {
		return nil, err
	}
	var fetch []string
	for _, u := range userIDs {
		l := cached[u]
		if l == nil || l.Stale || (!l.SharesRoom && now-l.FetchedTS > s.opts.UntrackedCacheTTL.Milliseconds()) {
			fetch = append(fetch, u)
		}
	}
	if len(fetch) == 0 {
		return cached, nil
	}
	if s.fed == nil {
		return cached, errNoFederation
	}
	// The protocol has no batch form of /user/devices; the client bounds
	// how many of these run against one server at once.
	type fetched struct {
		list *storage.RemoteDeviceList
		err  error
	}
	out := make([]fetched, len(fetch))
	var wg sync.WaitGroup
	for i, u := range fetch {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := s.sharedResync(ctx, server, u, cached[u] != nil && cached[u].Stale, now)
			out[i] = fetched{l, err}
		}()
	}
	wg.Wait()
	var firstErr error
	var got []string
	for i, u := range fetch {
		if out[i].err != nil {
			if firstErr == nil {
				firstErr = out[i].err
			}
			continue
		}
		cached[u] = out[i].list
		got = append(got, u)
	}
	if len(got) > 0 {
		// Read back what was stored: the lists as cached, with what is kept
		// beside them (local users' signatures on the master keys).
		if stored, err := s.db.RemoteDeviceLists(ctx, got); err == nil {
			for _, u := range got {
				if l := stored[u]; l != nil {
					cached[u] = l
				}
			}
		}
	}
	return cached, firstErr
}

// sharedResyncTimeout bounds a fetch shared by several queries, which
// goes on when the query that started it gives up.
const sharedResyncTimeout = 30 * time.Second

// resyncHold is how long a resync holds its stale user against the other
// daemons sharing the database (see storage.Database.HoldResync): longer
// than a fetch takes, so that a hold ends early only when its daemon
// stopped; and resyncPoll how often a daemon waiting for another's fetch
// looks whether it is over.
const (
	resyncHold = 15 * time.Second
	resyncPoll = 20 * time.Millisecond
)

// sharedResync is ResyncRemoteUser for queries: the queries that need a
// user's list while it is being fetched wait for that fetch instead of
// each sending their own, so that clients asking at once for a user whose
// list must be fetched make one request to the user's server. For a user
// marked stale (stale), the daemons sharing the database do the same: the
// fetch waits for one another daemon holds. A query whose read of the
// cache (at readMS) came before a fetch stored the list, and whose turn
// comes after that fetch ended, takes the stored list rather than fetching
// it again.
func (s *Tracker) sharedResync(ctx context.Context, server, userID string, stale bool, readMS int64) (*storage.RemoteDeviceList, error) {
	return s.joinResync(ctx, server, userID, false, stale, readMS)
}

// freshResync is the resync an incoming update needs: a fetch begun
// before the update arrived may miss it, so it starts one of its own, which
// the queries that come after it then share. The update's write marked the
// user stale and held it for this fetch.
func (s *Tracker) freshResync(ctx context.Context, server, userID string) (*storage.RemoteDeviceList, error) {
	return s.joinResync(ctx, server, userID, true, false, 0)
}

func (s *Tracker) joinResync(ctx context.Context, server, userID string, fresh, stale bool, readMS int64) (*storage.RemoteDeviceList, error) {
	if s.fed == nil {
		return nil, errNoFederation
	}
	if fresh {
		s.resyncs.Forget(userID)
	}
	ch := s.resyncs.DoChan(userID, func() (any, error) {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sharedResyncTimeout)
		defer cancel()
		var l *storage.RemoteDeviceList
		var err error
		if !fresh && !stale {
			if lists, err := s.db.RemoteDeviceLists(fctx, []string{userID}); err == nil {
				if have := lists[userID]; have != nil && !have.Stale && have.FetchedTS >= readMS {
					return have, nil // stored by the fetch before this one
				}
			}
		}
		switch {
		case stale:
			l, err = s.heldResync(fctx, server, userID, true)
		default:
			l, err = s.ResyncRemoteUser(fctx, server, userID)
			if err != nil && fresh {
				s.releaseResync(fctx, userID)
			}
		}
		return l, err
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		return r.Val.(*storage.RemoteDeviceList), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// heldResync resyncs a user marked stale once it holds the resync. When
// another daemon holds it, a query (wait) waits for that fetch and reads
// its result, or tries again once the hold ends; the updater (not wait)
// leaves the user to it. A user no longer marked was resynced meanwhile:
// the list cached is read back (nil for the updater, which needs nothing).
func (s *Tracker) heldResync(ctx context.Context, server, userID string, wait bool) (*storage.RemoteDeviceList, error) {
	for {
		now := s.nowMS()
		held, stale, err := s.db.HoldResync(ctx, userID, now, now+resyncHold.Milliseconds())
		if err != nil {
			return nil, err
		}
		if held {
			l, err := s.ResyncRemoteUser(ctx, server, userID)
			if err != nil {
				s.releaseResync(ctx, userID)
			}
			return l, err
		}
		if stale && !wait {
			return nil, nil
		}
		for stale {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(resyncPoll):
			}
			e, ok, err := s.db.StaleEntry(ctx, userID)
			if err != nil {
				return nil, err
			}
			if ok && e.ResyncUntil <= s.nowMS() {
				break // the hold ended without a result: try to take it
			}
			stale = ok
		}
		if stale {
			continue
		}
		if !wait {
			return nil, nil
		}
		lists, err := s.db.RemoteDeviceLists(ctx, []string{userID})
		if err != nil {
			return nil, err
		}
		l := lists[userID]
		if l == nil {
			// Its list was dropped meanwhile (no shared room left): fetch
			// it as for any user whose list is not kept.
			return s.ResyncRemoteUser(ctx, server, userID)
		}
		if !l.Stale {
			return l, nil
		}
		// Marked again meanwhile: go round, to hold it or wait again.
	}
}

// releaseResync gives up a hold after a failed fetch, so that the others
// need not wait for it to end; the updater, which waits for the hold's
// end to retry the user, looks again now.
func (s *Tracker) releaseResync(ctx context.Context, userID string) {
	if err := s.db.ReleaseResync(context.WithoutCancel(ctx), userID); err != nil {
		s.logger(ctx).WithFields(logrus.Fields{"user_id": userID, "error": err.Error()}).Warn("could not release a resync hold; it ends by itself")
		return
	}
	if s.updater != nil {
		s.updater.Wake()
	}
}

// ResyncRemoteUser fetches a remote user's whole device list, checks it,
// and stores it in place of the cached one (a change for local clients
// only if it differs).
func (s *Tracker) ResyncRemoteUser(ctx context.Context, server, userID string) (*storage.RemoteDeviceList, error) {
	if s.fed == nil {
		return nil, errNoFederation
	}
	metrics.Resyncs.WithLabelValues("started").Inc()
	resp, err := s.fed.UserDevices(ctx, server, userID)
	if err != nil {
		metrics.Resyncs.WithLabelValues("failed").Inc()
		return nil, err
	}
	list, err := s.checkUserDevices(ctx, server, userID, resp)
	if err != nil {
		metrics.Resyncs.WithLabelValues("failed").Inc()
		s.logger(ctx).WithFields(logrus.Fields{"server": server, "user_id": userID, "error": err.Error()}).
			Warn("rejected a remote device list")
		return nil, err
	}
	ch, err := s.db.ReplaceRemoteDeviceList(ctx, *list, server)
	if err != nil {
		metrics.Resyncs.WithLabelValues("failed").Inc()
		return nil, err
	}
	metrics.Resyncs.WithLabelValues("succeeded").Inc()
	s.streamAdvanced(ch)
	return list, nil
}

// checkUserDevices turns a /user/devices answer into a list to cache. The
// whole answer is refused when it is for another user, holds another
// user's device or names more than MaxRemoteDevices devices; single devices
// whose keys checkRemoteDeviceKeys refuses are left out. The keys are kept
// as the server sent them: their signatures are for clients to check.
func (s *Tracker) checkUserDevices(ctx context.Context, server, userID string, resp fedclient.UserDevices) (*storage.RemoteDeviceList, error) {
	if resp.UserID != userID {
		return nil, fmt.Errorf("%s answered for %q when asked for %q", server, resp.UserID, userID)
	}
	if len(resp.Devices) > MaxRemoteDevices {
		return nil, fmt.Errorf("%s lists %d devices for %s, more than the %d accepted", server, len(resp.Devices), userID, MaxRemoteDevices)
	}
	list := &storage.RemoteDeviceList{UserID: userID, StreamID: resp.StreamID, FetchedTS: s.nowMS()}
	seen := map[string]bool{}
	for _, d := range resp.Devices {
		var keys []byte
		var err error
		switch t := bytes.TrimSpace(d.Keys); {
		case d.DeviceID == "":
			err = errors.New("no device_id")
		case len(t) == 0 || string(t) == "null":
			continue // a device without keys is of no use to clients
		case seen[d.DeviceID]:
			err = errors.New("listed twice")
		default:
			keys, err = checkRemoteDeviceKeys(userID, d.DeviceID, d.Keys)
		}
		if errors.Is(err, errKeysOfOtherUser) {
			// Another user's device in the list: the answer cannot be trusted.
			return nil, fmt.Errorf("%s lists a device of another user among %s's: %w", server, userID, err)
		}
		if err != nil {
			s.logger(ctx).WithFields(logrus.Fields{"server": server, "user_id": userID, "device_id": d.DeviceID, "error": err.Error()}).
				Warn("ignored a remote device with bad keys")
			continue
		}
		seen[d.DeviceID] = true
		list.Devices = append(list.Devices, storage.RemoteDevice{DeviceID: d.DeviceID, DisplayName: d.DisplayName, KeyJSON: keys})
	}
	sort.Slice(list.Devices, func(i, j int) bool { return list.Devices[i].DeviceID < list.Devices[j].DeviceID })
	keys, err := checkRemoteCrossSigning(userID, nil, resp.MasterKey, resp.SelfSigningKey)
	if err != nil {
		// The devices are still good; the keys are left out, and asked
		// for again with the next fetch.
		s.logger(ctx).WithFields(logrus.Fields{"server": server, "user_id": userID, "error": err.Error()}).
			Warn("ignored a remote user's bad cross-signing keys")
	} else if len(keys) > 0 {
		list.CrossSigning = keys
	}
	return list, nil
}

// checkRemoteCrossSigning checks the master and self-signing keys another
// server gave for its user (either may be missing), as uploads are
// checked: the user's, in the right slot, one ed25519 key, the
// self-signing key signed by the master key sent along or else by
// cachedMaster. It returns them by usage as canonical JSON.
func checkRemoteCrossSigning(userID string, cachedMaster []byte, master, ssk json.RawMessage) (map[string][]byte, error) {
	present := func(raw json.RawMessage) bool {
		t := bytes.TrimSpace(raw)
		return len(t) > 0 && string(t) != "null"
	}
	out := map[string][]byte{}
	m := crosssigning.ParseStored(cachedMaster, storage.UsageMaster)
	if present(master) {
		k, err := crosssigning.Parse("master_key", master, storage.UsageMaster, userID)
		if err != nil {
			return nil, err
		}
		m = k
		out[storage.UsageMaster] = k.Canonical
	}
	if present(ssk) {
		k, err := crosssigning.Parse("self_signing_key", ssk, storage.UsageSelfSigning, userID)
		if err != nil {
			return nil, err
		}
		if m == nil {
			return nil, errors.New("a self-signing key without a master key")
		}
		if err := crosssigning.CheckSignedByMaster("self_signing_key", k, m); err != nil {
			return nil, err
		}
		out[storage.UsageSelfSigning] = k.Canonical
	}
	return out, nil
}
