package devicelist

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/storage"
)

// The device-list and signing-key EDUs of other servers' transactions
// (package fedrouter routes them here).
//
// A device-list update is checked (its user must belong to the sending
// server and share a room with one of ours, its keys must pass
// checkRemoteDeviceKeys: they are kept as sent, unverified) and applied to
// the cached list in one transaction that also checks its prev_ids; a gap
// marks the user stale, persisted before anything else, and the user is
// resynced (ResyncWithin). The transaction is answered only once what it
// carries is in the database, and so visible to /keys/query on any daemon
// sharing it, or once SendWait has passed: a resync that cannot finish in
// time leaves the user stale for the updater to retry.

// DeviceListUpdate handles one m.device_list_update from origin
// (authenticated); it returns the user when a resync is needed. Updates that are malformed, about users of
// another server or about users nobody here shares a room with are dropped.
func (s *Tracker) DeviceListUpdate(ctx context.Context, origin string, content json.RawMessage) (string, error) {
	var c struct {
		UserID      string          `json:"user_id"`
		DeviceID    string          `json:"device_id"`
		StreamID    *int64          `json:"stream_id"`
		PrevID      []int64         `json:"prev_id"`
		Deleted     bool            `json:"deleted"`
		Keys        json.RawMessage `json:"keys"`
		DisplayName *string         `json:"device_display_name"`
	}
	log := s.logger(ctx).WithField("origin", origin)
	if err := json.Unmarshal(content, &c); err != nil || c.StreamID == nil || c.DeviceID == "" {
		log.WithField("content", string(content)).Debug("dropped a malformed m.device_list_update")
		return "", nil
	}
	// Historical user IDs (upper case and the other characters the old
	// grammar allowed) are accepted, as the spec requires of IDs other
	// servers made: dropping their updates would leave their lists stale
	// while /keys/query and the admin API accept the same users.
	if server, ok := matrixid.ParseUserID(c.UserID); !ok || server != origin {
		log.WithField("user_id", c.UserID).Debug("dropped an m.device_list_update for a user not on its origin")
		return "", nil
	}
	tracked, err := s.db.SharesRoomWithLocal(ctx, c.UserID)
	if err != nil || !tracked {
		return "", err
	}
	upd := storage.RemoteDeviceUpdate{UserID: c.UserID, DeviceID: c.DeviceID, StreamID: *c.StreamID,
		PrevIDs: c.PrevID, Deleted: c.Deleted, DisplayName: c.DisplayName}
	if !c.Deleted && len(c.Keys) > 0 && string(c.Keys) != "null" {
		keys, err := checkRemoteDeviceKeys(c.UserID, c.DeviceID, c.Keys)
		if err != nil {
			// The sender's copy is odd: ask for the whole list instead.
			log.WithFields(logrus.Fields{"user_id": c.UserID, "device_id": c.DeviceID, "error": err.Error()}).
				Warn("m.device_list_update with bad keys; resyncing the user")
			return c.UserID, s.db.MarkRemoteStale(ctx, c.UserID, origin, s.nowMS())
		}
		upd.KeyJSON = keys
	}
	// A gap is resynced at once, within SendWait: other daemons wait for
	// that fetch rather than sending their own.
	upd.ResyncHoldUntil = s.nowMS() + s.opts.SendWait.Milliseconds()
	res, err := s.db.ApplyRemoteDeviceUpdate(ctx, upd)
	if err != nil {
		return "", err
	}
	s.streamAdvanced(res.Change)
	if res.Outcome == storage.NeedResync {
		log.WithFields(logrus.Fields{"user_id": c.UserID, "device_id": c.DeviceID, "stream_id": *c.StreamID, "prev_id": c.PrevID}).
			Debug("m.device_list_update does not follow the cached list; resyncing the user")
		return c.UserID, nil
	}
	return "", nil
}

// SigningKeyUpdate handles one m.signing_key_update from origin: a remote user's new
// master and/or self-signing key, checked as a fetched list's keys are,
// replaces the cached one, a change for local users sharing a room with
// the user. Updates that are malformed, about users of another server or
// about users whose list is not cached are dropped.
func (s *Tracker) SigningKeyUpdate(ctx context.Context, origin string, content json.RawMessage) error {
	var c struct {
		UserID         string          `json:"user_id"`
		MasterKey      json.RawMessage `json:"master_key"`
		SelfSigningKey json.RawMessage `json:"self_signing_key"`
	}
	log := s.logger(ctx).WithField("origin", origin)
	if err := json.Unmarshal(content, &c); err != nil {
		log.WithField("content", string(content)).Debug("dropped a malformed m.signing_key_update")
		return nil
	}
	if server, ok := matrixid.ParseUserID(c.UserID); !ok || server != origin {
		log.WithField("user_id", c.UserID).Debug("dropped an m.signing_key_update for a user not on its origin")
		return nil
	}
	lists, err := s.db.RemoteDeviceLists(ctx, []string{c.UserID})
	if err != nil {
		return err
	}
	l := lists[c.UserID]
	if l == nil {
		return nil // not tracked: the keys come with the list when it is fetched
	}
	keys, err := checkRemoteCrossSigning(c.UserID, l.CrossSigning[storage.UsageMaster], c.MasterKey, c.SelfSigningKey)
	if err != nil {
		log.WithFields(logrus.Fields{"user_id": c.UserID, "error": err.Error()}).Warn("dropped an m.signing_key_update with bad keys")
		return nil
	}
	ch, err := s.db.UpdateRemoteCrossSigning(ctx, c.UserID, keys)
	if err != nil {
		return err
	}
	s.streamAdvanced(ch)
	return nil
}

// ResyncWithin resyncs users of server (already marked stale by
// DeviceListUpdate) concurrently, waiting at most SendWait; what does not
// finish stays stale for the updater.
func (s *Tracker) ResyncWithin(ctx context.Context, server string, users map[string]bool) {
	if len(users) == 0 {
		return
	}
	log := s.logger(ctx).WithField("origin", server)
	ctx, cancel := context.WithTimeout(ctx, s.opts.SendWait)
	defer cancel()
	var wg sync.WaitGroup
	failed := false
	var mu sync.Mutex
	for u := range users {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.freshResync(ctx, server, u); err != nil {
				log.WithFields(logrus.Fields{"user_id": u, "error": err.Error()}).Debug("resync for an incoming update failed; left to the updater")
				mu.Lock()
				failed = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if failed && s.updater != nil {
		s.updater.Wake()
	}
}
