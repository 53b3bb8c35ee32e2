// Package fedrouter routes the transactions other servers send (PUT
// /send/{txnId}) to the domains: PDUs to the rooms, device-list and
// signing-key updates to the keys domain, to-device messages to their
// package, presence, typing notifications and receipts to theirs. It
// answers a transaction sent again with the answer it stored, without
// processing it twice. Only m.device_list_update, m.signing_key_update,
// m.direct_to_device, m.presence, m.typing and m.receipt EDUs are acted
// on; other EDU types are not ours to handle.
package fedrouter

import (
	"context"
	"encoding/json"
	"time"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/internal/metrics"
	"github.com/keyserver/keyserver/internal/mxerr"
)

// Store keeps the answers of the transactions processed (package sqlstore).
type Store interface {
	InboundTransaction(ctx context.Context, origin, txnID string) ([]byte, bool, error)
	StoreInboundTransaction(ctx context.Context, origin, txnID string, answer []byte, now int64) error
}

// DeviceLists takes the device-list and signing-key EDUs (package
// keyserver). DeviceListUpdate returns the user to resync, if any;
// ResyncWithin resyncs them, bounded in time, once every EDU was handled.
type DeviceLists interface {
	DeviceListUpdate(ctx context.Context, origin string, content json.RawMessage) (string, error)
	SigningKeyUpdate(ctx context.Context, origin string, content json.RawMessage) error
	ResyncWithin(ctx context.Context, origin string, users map[string]bool)
}

// DirectToDeviceReceiver takes the m.direct_to_device EDUs of a
// transaction (package todevice). An error fails the transaction, which
// the origin then sends again; a bad EDU is dropped without one.
type DirectToDeviceReceiver interface {
	ReceiveDirectToDevice(ctx context.Context, origin string, content json.RawMessage) error
}

// PresenceReceiver takes the m.presence EDUs of a transaction (package
// presence). An error fails the transaction; a bad EDU is dropped
// without one.
type PresenceReceiver interface {
	ReceivePresence(ctx context.Context, origin string, content json.RawMessage) error
}

// TypingReceiver takes the m.typing EDUs of a transaction (package
// typing); ReceiptReceiver the m.receipt EDUs (package receipts). As for
// to-device messages, an error fails the transaction and a bad EDU is
// dropped without one.
type TypingReceiver interface {
	ReceiveTyping(ctx context.Context, origin string, content json.RawMessage) error
}

// ReceiptReceiver: see TypingReceiver.
type ReceiptReceiver interface {
	ReceiveReceipt(ctx context.Context, origin string, content json.RawMessage) error
}

// PDUReceiver takes the PDUs of a transaction (package roomserver) and
// returns each one's error by event ID, "" for one accepted.
type PDUReceiver interface {
	ReceivePDUs(ctx context.Context, origin string, pdus []json.RawMessage) map[string]string
}

// Options are where the router sends what it routes; a nil receiver drops
// what it would take (PDUs are then answered as not processed).
type Options struct {
	DeviceLists    DeviceLists
	DirectToDevice DirectToDeviceReceiver
	PDUs           PDUReceiver
	// Presence takes m.presence EDUs; nil: they are ignored (presence is
	// off).
	Presence PresenceReceiver
	Typing   TypingReceiver
	Receipts ReceiptReceiver
	Now      func() time.Time // the clock; time.Now when nil
}

// Router routes transactions.
type Router struct {
	db Store
	o  Options
}

// New makes a Router.
func New(db Store, o Options) *Router {
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Router{db: db, o: o}
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
func (r *Router) HandleTransaction(ctx context.Context, origin, txnID string, body []byte) (json.RawMessage, error) {
	if stored, ok, err := r.db.InboundTransaction(ctx, origin, txnID); err != nil || ok {
		return stored, err
	}
	start := time.Now()
	defer func() { metrics.SendWait.Observe(time.Since(start).Seconds()) }()
	var t transaction
	if err := json.Unmarshal(body, &t); err != nil {
		return nil, mxerr.BadJSON("transaction has the wrong shape: %v", err)
	}
	if len(t.PDUs) > fedclient.MaxPDUsPerTransaction || len(t.EDUs) > fedclient.MaxEDUsPerTransaction {
		return nil, mxerr.BadJSON("a transaction carries at most %d PDUs and %d EDUs", fedclient.MaxPDUsPerTransaction, fedclient.MaxEDUsPerTransaction)
	}
	// PDUs first: a membership they bring decides whether the device-list
	// updates of the same transaction concern anyone here.
	var pdus map[string]any
	if r.o.PDUs != nil && len(t.PDUs) > 0 {
		pdus = map[string]any{}
		for id, msg := range r.o.PDUs.ReceivePDUs(ctx, origin, t.PDUs) {
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
		switch {
		case e.Type == "m.signing_key_update" && r.o.DeviceLists != nil:
			if err := r.o.DeviceLists.SigningKeyUpdate(ctx, origin, e.Content); err != nil {
				return nil, err
			}
		case e.Type == "m.direct_to_device" && r.o.DirectToDevice != nil:
			if err := r.o.DirectToDevice.ReceiveDirectToDevice(ctx, origin, e.Content); err != nil {
				return nil, err
			}
		case e.Type == "m.presence" && r.o.Presence != nil:
			if err := r.o.Presence.ReceivePresence(ctx, origin, e.Content); err != nil {
				return nil, err
			}
		case e.Type == "m.typing" && r.o.Typing != nil:
			if err := r.o.Typing.ReceiveTyping(ctx, origin, e.Content); err != nil {
				return nil, err
			}
		case e.Type == "m.receipt" && r.o.Receipts != nil:
			if err := r.o.Receipts.ReceiveReceipt(ctx, origin, e.Content); err != nil {
				return nil, err
			}
		case e.Type == "m.device_list_update" && r.o.DeviceLists != nil:
			user, err := r.o.DeviceLists.DeviceListUpdate(ctx, origin, e.Content)
			if err != nil {
				return nil, err
			}
			if user != "" {
				resync[user] = true
			}
		}
	}
	if len(resync) > 0 {
		r.o.DeviceLists.ResyncWithin(ctx, origin, resync)
	}

	answer, err := json.Marshal(map[string]any{"pdus": pdus})
	if err != nil {
		return nil, err
	}
	if err := r.db.StoreInboundTransaction(ctx, origin, txnID, answer, r.o.Now().UnixMilli()); err != nil {
		return nil, err
	}
	return answer, nil
}

// pduResults reports every PDU as not processed, without rooms. Event
// IDs are computed as for current room versions (the only way to name
// them); a PDU that cannot be parsed is left out.
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
