package keyserver

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/metrics"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// Receiving other servers' transactions (PUT /send/{txnId}).
//
// Only m.device_list_update, m.signing_key_update and m.direct_to_device
// EDUs are acted on (the last by Options.DirectToDevice).
// A device-list update is checked (its user
// must belong to the sending server and share a room with one of ours, its
// keys must pass checkRemoteDeviceKeys: they are kept as sent, unverified) and
// applied to the cached list in one transaction that also checks its
// prev_ids; a gap marks the user stale, persisted before anything else, and
// the user is resynced. The transaction is answered only once what it
// carries is in the database, and so visible to /keys/query on any daemon
// sharing it, or once SendWait has passed: a resync that cannot finish in
// time leaves the user stale for the updater to retry.

const (
	maxPDUsPerTransaction = 50
	maxEDUsInTransaction  = 100
)

// DirectToDeviceReceiver takes the m.direct_to_device EDUs of a
// transaction (package todevice). An error fails the transaction, which
// the origin then sends again; a bad EDU is dropped without one.
type DirectToDeviceReceiver interface {
	ReceiveDirectToDevice(ctx context.Context, origin string, content json.RawMessage) error
}

// PDUReceiver takes the PDUs of a transaction (package roomserver) and
// returns each one's error by event ID, "" for one accepted.
type PDUReceiver interface {
	ReceivePDUs(ctx context.Context, origin string, pdus []json.RawMessage) map[string]string
}

type transaction struct {
	Origin string            `json:"origin"`
	PDUs   []json.RawMessage `json:"pdus"`
	EDUs   []struct {
		Type    string          `json:"edu_type"`
		Content json.RawMessage `json:"content"`
	} `json:"edus"`
}

// HandleTransaction processes a transaction from origin (authenticated)
// and returns the answer. A transaction already processed gets the same
// answer again without being processed twice.
func (s *Service) HandleTransaction(ctx context.Context, origin, txnID string, body []byte) (json.RawMessage, error) {
	if stored, ok, err := s.db.InboundTransaction(ctx, origin, txnID); err != nil || ok {
		return stored, err
	}
	start := time.Now()
	defer func() { metrics.SendWait.Observe(time.Since(start).Seconds()) }()
	var t transaction
	if err := json.Unmarshal(body, &t); err != nil {
		return nil, mxerr.BadJSON("transaction has the wrong shape: %v", err)
	}
	if len(t.PDUs) > maxPDUsPerTransaction || len(t.EDUs) > maxEDUsInTransaction {
		return nil, mxerr.BadJSON("a transaction carries at most %d PDUs and %d EDUs", maxPDUsPerTransaction, maxEDUsInTransaction)
	}
	log := s.logger(ctx).WithFields(logrus.Fields{"origin": origin, "txn_id": txnID})
	// PDUs first: a membership they bring decides whether the device-list
	// updates of the same transaction concern anyone here.
	var pdus map[string]any
	if s.pdus != nil && len(t.PDUs) > 0 {
		pdus = map[string]any{}
		for id, msg := range s.pdus.ReceivePDUs(ctx, origin, t.PDUs) {
			if msg == "" {
				pdus[id] = map[string]any{}
			} else {
				pdus[id] = map[string]string{"error": msg}
			}
		}
	} else {
		pdus = pduResults(t.PDUs)
	}
	// A body origin that differs from the authenticated one is ignored.
	resync := map[string]bool{}
	for _, e := range t.EDUs {
		if e.Type == "m.signing_key_update" {
			if err := s.signingKeyUpdate(ctx, origin, e.Content); err != nil {
				return nil, err
			}
			continue
		}
		if e.Type == "m.direct_to_device" && s.opts.DirectToDevice != nil {
			if err := s.opts.DirectToDevice.ReceiveDirectToDevice(ctx, origin, e.Content); err != nil {
				return nil, err
			}
			continue
		}
		if e.Type != "m.device_list_update" {
			continue // other EDU types are not ours to handle
		}
		user, err := s.deviceListUpdate(ctx, origin, e.Content)
		if err != nil {
			return nil, err
		}
		if user != "" {
			resync[user] = true
		}
	}
	s.resyncWithin(ctx, origin, resync, log)

	answer, err := json.Marshal(map[string]any{"pdus": pdus})
	if err != nil {
		return nil, err
	}
	if err := s.db.StoreInboundTransaction(ctx, origin, txnID, answer, s.nowMS()); err != nil {
		return nil, err
	}
	return answer, nil
}

// deviceListUpdate handles one m.device_list_update; it returns the user
// when a resync is needed. Updates that are malformed, about users of
// another server or about users nobody here shares a room with are dropped.
func (s *Service) deviceListUpdate(ctx context.Context, origin string, content json.RawMessage) (string, error) {
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

// signingKeyUpdate handles one m.signing_key_update: a remote user's new
// master and/or self-signing key, checked as a fetched list's keys are,
// replaces the cached one, a change for local users sharing a room with
// the user. Updates that are malformed, about users of another server or
// about users whose list is not cached are dropped.
func (s *Service) signingKeyUpdate(ctx context.Context, origin string, content json.RawMessage) error {
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

// resyncWithin resyncs users (already marked stale) concurrently, waiting
// at most SendWait; what does not finish stays stale for the updater.
func (s *Service) resyncWithin(ctx context.Context, server string, users map[string]bool, log logrus.FieldLogger) {
	if len(users) == 0 {
		return
	}
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

// pduResults reports every PDU as not processed, without rooms. Event IDs are computed as for current room versions (the only
// way to name them); a PDU that cannot be parsed is left out.
func pduResults(pdus []json.RawMessage) map[string]any {
	out := map[string]any{}
	verImpl := gomatrixserverlib.MustGetRoomVersion(gomatrixserverlib.RoomVersionV10)
	for _, raw := range pdus {
		var withID struct {
			EventID string `json:"event_id"`
		}
		id := ""
		if json.Unmarshal(raw, &withID) == nil && withID.EventID != "" {
			id = withID.EventID
		} else if ev, err := verImpl.NewEventFromUntrustedJSON(raw); err == nil {
			id = ev.EventID()
		}
		if id != "" {
			out[id] = map[string]string{"error": "this server does not process room events"}
		}
	}
	return out
}
