// Package todevice is send-to-device messaging: PUT /sendToDevice puts
// messages in the inboxes of local devices and queues them, as
// m.direct_to_device EDUs, for the servers of remote ones; those servers'
// EDUs come in through Receive. /sync hands a device its inbox (see
// keyserver.Service.Sync); the device-list sender delivers the queued
// EDUs (package federationsender), from the database, so they survive restarts.
package todevice

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"sort"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/ratelimit"
	"github.com/keyserver/keyserver/internal/reqlog"
	"github.com/keyserver/keyserver/storage"
)

// EDUType is the type of the EDUs that carry to-device messages between
// servers.
const EDUType = "m.direct_to_device"

// MaxContentBytes bounds the content of one message (as sent, compacted):
// larger ones are refused with 413 M_TOO_LARGE. Over federation a message
// travels inside an EDU, which must fit in a transaction.
const MaxContentBytes = 65536

// Store is what to-device messaging keeps in the database (package
// sqlstore).
type Store interface {
	storage.ToDeviceInbox
}

// Options configure a Service.
type Options struct {
	ServerName string
	// Federated queues the messages of remote users for their servers;
	// without, they are dropped.
	Federated bool
	// RateLimit bounds each sending user's sends; nil: no limit.
	RateLimit *ratelimit.Limiter
	// Changed is told of each committed change, to wake the recipients'
	// waiting /sync requests; Queued when EDUs were queued for other
	// servers, to send them. Either may be nil.
	Changed func(storage.Change)
	Queued  func()
	Logger  logrus.FieldLogger
	Now     func() time.Time
}

// Service sends and receives to-device messages.
type Service struct {
	db Store
	o  Options
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
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Service{db: db, o: o}
}

// SendRequest is the body of PUT /sendToDevice.
type SendRequest struct {
	Messages map[string]map[string]json.RawMessage `json:"messages"`
}

// Send stores a client's send: the messages of userID's device deviceID,
// all of type eventType, under its transaction ID. A retry (same device
// and txnID) stores nothing again. Unknown users and devices are skipped.
func (s *Service) Send(ctx context.Context, userID, deviceID, eventType, txnID string, req SendRequest) error {
	if !matrixid.ValidOpaqueID(eventType) {
		return mxerr.InvalidParam("the event type must be 1 to %d printable characters", matrixid.MaxLength)
	}
	if req.Messages == nil {
		return mxerr.MissingParam("messages is required")
	}
	send := storage.ToDeviceSend{Origin: userID, DeviceID: deviceID, TxnID: txnID, Sender: userID, Type: eventType,
		Local: map[string]map[string]json.RawMessage{}, Now: s.o.Now().UnixMilli()}
	remote := map[string]map[string]map[string]json.RawMessage{} // server -> user -> device -> content
	for user, devices := range req.Messages {
		server, ok := matrixid.ParseUserID(user)
		if !ok {
			return mxerr.InvalidParam("%q is not a valid user ID", user)
		}
		checked := make(map[string]json.RawMessage, len(devices))
		for device, content := range devices {
			if !matrixid.ValidOpaqueID(device) {
				return mxerr.InvalidParam("the device IDs of %s must be 1 to %d printable characters", user, matrixid.MaxLength)
			}
			c, err := compactObject(content)
			if err != nil {
				return err
			}
			checked[device] = c
		}
		switch {
		case server == s.o.ServerName:
			send.Local[user] = checked
		case s.o.Federated:
			if remote[server] == nil {
				remote[server] = map[string]map[string]json.RawMessage{}
			}
			remote[server][user] = checked
		}
	}
	if ok, wait := s.o.RateLimit.Allow(userID); !ok {
		return mxerr.LimitExceeded(wait)
	}
	servers := make([]string, 0, len(remote))
	for server := range remote {
		servers = append(servers, server)
	}
	sort.Strings(servers)
	for _, server := range servers {
		edu, err := json.Marshal(map[string]any{
			"sender": userID, "type": eventType, "message_id": messageID(), "messages": remote[server],
		})
		if err != nil {
			return err
		}
		send.Remote = append(send.Remote, storage.OutboundEDU{Destination: server, Content: edu})
	}
	ch, duplicate, err := s.db.StoreToDevice(ctx, send)
	if err != nil || duplicate {
		return err
	}
	s.o.Changed(ch)
	if len(send.Remote) > 0 {
		s.o.Queued()
	}
	return nil
}

// Receive stores the messages of an m.direct_to_device EDU from origin
// (authenticated) for local devices. An EDU that is malformed, whose
// sender is not of origin, or whose message_id origin sent before is
// dropped; so are messages for other servers' users or unknown devices.
func (s *Service) Receive(ctx context.Context, origin string, content json.RawMessage) error {
	var edu struct {
		Sender    string                                `json:"sender"`
		Type      string                                `json:"type"`
		MessageID string                                `json:"message_id"`
		Messages  map[string]map[string]json.RawMessage `json:"messages"`
	}
	log := reqlog.From(ctx, s.o.Logger).WithField("origin", origin)
	if err := json.Unmarshal(content, &edu); err != nil || !matrixid.ValidOpaqueID(edu.Type) || !matrixid.ValidOpaqueID(edu.MessageID) {
		log.Debug("dropped a malformed m.direct_to_device")
		return nil
	}
	if server, ok := matrixid.ParseUserID(edu.Sender); !ok || server != origin {
		log.WithField("sender", edu.Sender).Debug("dropped an m.direct_to_device from a user not on its origin")
		return nil
	}
	send := storage.ToDeviceSend{Origin: origin, TxnID: edu.MessageID, Sender: edu.Sender, Type: edu.Type,
		Local: map[string]map[string]json.RawMessage{}, Now: s.o.Now().UnixMilli()}
	for user, devices := range edu.Messages {
		if server, ok := matrixid.ParseUserID(user); !ok || server != s.o.ServerName {
			continue
		}
		checked := map[string]json.RawMessage{}
		for device, c := range devices {
			if c, err := compactObject(c); err == nil && device != "" {
				checked[device] = c
			}
		}
		send.Local[user] = checked
	}
	ch, _, err := s.db.StoreToDevice(ctx, send)
	if err != nil {
		return err
	}
	s.o.Changed(ch)
	return nil
}

// ReceiveDirectToDevice is Receive, as package fedrouter calls it.
func (s *Service) ReceiveDirectToDevice(ctx context.Context, origin string, content json.RawMessage) error {
	return s.Receive(ctx, origin, content)
}

// compactObject checks that a message's content is a JSON object of at
// most MaxContentBytes and returns it compacted.
func compactObject(content json.RawMessage) (json.RawMessage, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(content, &obj); err != nil || obj == nil {
		return nil, mxerr.BadJSON("each message's content must be a JSON object")
	}
	out, err := json.Marshal(obj)
	if err != nil {
		return nil, mxerr.BadJSON("each message's content must be a JSON object")
	}
	if len(out) > MaxContentBytes {
		return nil, mxerr.TooLarge("a message's content is over %d bytes", MaxContentBytes)
	}
	return out, nil
}

// messageID makes the message_id of an EDU: 32 hex digits, the most the
// spec allows.
func messageID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
