// Package receipts is read receipts and read markers: POST
// /rooms/{roomId}/receipt/{receiptType}/{eventId} and POST
// /rooms/{roomId}/read_markers for the local users, m.receipt EDUs both
// ways, and the m.receipt events of the rooms' ephemeral part of /sync.
//
// A receipt is kept per room, type, user and thread (unthreaded, "main"
// or a thread root), the latest one: a receipt for an earlier event than
// the one kept changes nothing, as in Synapse. Each stored receipt takes a
// stream position, so /sync shows it (an initial /sync: every receipt of
// the user's joined rooms) and the waiting /sync requests of the room's
// local members wake; a private receipt (m.read.private) concerns and is
// shown to its owner alone, and never leaves the server. An unthreaded
// or main-timeline receipt of the reader's own resets the room's unread
// counts up to its event (package pusher). The fully-read marker
// (m.fully_read) is room account data, moved only forward.
package receipts

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/reqlog"
	"github.com/keyserver/keyserver/storage"
)

// The receipt types, and the EDU's.
const (
	Read        = "m.read"
	ReadPrivate = storage.ReceiptPrivate
	FullyRead   = "m.fully_read"
	EDUType     = "m.receipt"
	// MainThread is the thread ID of the events in no thread.
	MainThread = "main"
)

// Store is what receipts read and keep in the database (package sqlstore).
type Store interface {
	storage.Receipts
	// RoomMembership returns a user's membership of a room ("" when none).
	RoomMembership(ctx context.Context, roomID, userID string) (string, error)
	RoomEvent(ctx context.Context, eventID string) (storage.RoomEvent, error)
	RoomEventsByID(ctx context.Context, ids []string) ([]storage.RoomEvent, error)
	AccountData(ctx context.Context, userID, roomID, dataType string) ([]byte, error)
	SetAccountData(ctx context.Context, userID, roomID, dataType string, content []byte) (storage.Change, error)
}

// Unread resets a room's unread counts up to a position (pusher.Service).
type Unread interface {
	MarkRead(ctx context.Context, userID, roomID string, pos storage.StreamPos) error
}

// Options configure a Service.
type Options struct {
	ServerName string
	// Federated sends the local users' public receipts to the rooms'
	// other servers.
	Federated bool
	// Unread has the unread counts reset by receipts; nil: none.
	Unread Unread
	// Changed is told of each committed change, to wake the waiting
	// /sync requests it concerns; Queued when EDUs were queued for other
	// servers. Either may be nil.
	Changed func(storage.Change)
	Queued  func()
	Logger  logrus.FieldLogger
	Now     func() time.Time
}

// Service keeps receipts and read markers.
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

// Post answers POST /rooms/{roomId}/receipt/{receiptType}/{eventId}: body
// may name a thread_id ("main" or a thread root's event ID; not with
// m.fully_read).
func (s *Service) Post(ctx context.Context, c matrixid.Caller, roomID, receiptType, eventID string, body map[string]json.RawMessage) error {
	if !matrixid.ValidRoomID(roomID) || !validEventID(eventID) {
		return mxerr.InvalidParam("a valid room ID and event ID must be given")
	}
	if receiptType != Read && receiptType != ReadPrivate && receiptType != FullyRead {
		return mxerr.InvalidParam("the receipt type must be %s, %s or %s", Read, ReadPrivate, FullyRead)
	}
	threadID := ""
	if raw, ok := body["thread_id"]; ok {
		if json.Unmarshal(raw, &threadID) != nil || threadID == "" {
			return mxerr.InvalidParam("thread_id must be a non-empty string")
		}
		if receiptType == FullyRead {
			return mxerr.InvalidParam("thread_id is not compatible with %s receipts", FullyRead)
		}
		if threadID != MainThread && !validEventID(threadID) {
			return mxerr.InvalidParam("thread_id must be %q or the event ID of a thread root", MainThread)
		}
	}
	if err := s.checkJoined(ctx, c.UserID, roomID); err != nil {
		return err
	}
	ev, err := s.roomEvent(ctx, roomID, eventID)
	if err != nil {
		return err
	}
	if receiptType == FullyRead {
		return s.setFullyRead(ctx, c.UserID, roomID, ev)
	}
	if err := checkThread(ev, threadID); err != nil {
		return err
	}
	return s.receipt(ctx, c.UserID, receiptType, threadID, ev)
}

// ReadMarkers answers POST /rooms/{roomId}/read_markers: the body's
// m.fully_read (the read marker), m.read and m.read.private (unthreaded
// receipts), each optional, other keys ignored (as Synapse does). Every
// event named is checked before anything is stored.
func (s *Service) ReadMarkers(ctx context.Context, c matrixid.Caller, roomID string, body map[string]json.RawMessage) error {
	if !matrixid.ValidRoomID(roomID) {
		return mxerr.InvalidParam("%q is not a valid room ID", roomID)
	}
	ids := map[string]string{}
	for _, typ := range []string{FullyRead, Read, ReadPrivate} {
		raw, ok := body[typ]
		if !ok || string(raw) == "null" {
			continue
		}
		var id string
		if json.Unmarshal(raw, &id) != nil || !validEventID(id) {
			return mxerr.InvalidParam("%s must be an event ID", typ)
		}
		ids[typ] = id
	}
	if err := s.checkJoined(ctx, c.UserID, roomID); err != nil {
		return err
	}
	events := map[string]storage.RoomEvent{}
	for typ, id := range ids {
		ev, err := s.roomEvent(ctx, roomID, id)
		if err != nil {
			return err
		}
		events[typ] = ev
	}
	for _, typ := range []string{Read, ReadPrivate} {
		if ev, ok := events[typ]; ok {
			if err := s.receipt(ctx, c.UserID, typ, "", ev); err != nil {
				return err
			}
		}
	}
	if ev, ok := events[FullyRead]; ok {
		return s.setFullyRead(ctx, c.UserID, roomID, ev)
	}
	return nil
}

// checkJoined refuses a user not joined to the room.
func (s *Service) checkJoined(ctx context.Context, userID, roomID string) error {
	membership, err := s.db.RoomMembership(ctx, roomID, userID)
	if err != nil {
		return err
	}
	if membership != "join" {
		return mxerr.Forbidden("user %s is not in room %s", userID, roomID)
	}
	return nil
}

// roomEvent returns an event of the room the server has in the room's
// timeline; 404 otherwise.
func (s *Service) roomEvent(ctx context.Context, roomID, eventID string) (storage.RoomEvent, error) {
	ev, err := s.db.RoomEvent(ctx, eventID)
	if errors.Is(err, storage.ErrNotFound) || (err == nil && (ev.RoomID != roomID || ev.Outlier || ev.Rejected)) {
		return storage.RoomEvent{}, mxerr.NotFound("event %s is not known in room %s", eventID, roomID)
	}
	return ev, err
}

// receipt stores a local user's receipt for ev, the room's unread counts
// reset first so that a /sync woken by the receipt shows them reset.
func (s *Service) receipt(ctx context.Context, userID, receiptType, threadID string, ev storage.RoomEvent) error {
	if s.o.Unread != nil && (threadID == "" || threadID == MainThread) && ev.Pos > 0 {
		if err := s.o.Unread.MarkRead(ctx, userID, ev.RoomID, ev.Pos); err != nil {
			return err
		}
	}
	r := storage.Receipt{RoomID: ev.RoomID, Type: receiptType, UserID: userID, ThreadID: threadID,
		EventID: ev.EventID, EventPos: ev.Pos, TS: s.o.Now().UnixMilli()}
	var edu json.RawMessage
	if s.o.Federated && receiptType == Read {
		var err error
		if edu, err = json.Marshal(map[string]any{r.RoomID: map[string]any{r.Type: map[string]any{
			r.UserID: map[string]any{"event_ids": []string{r.EventID}, "data": receiptData(r)}}}}); err != nil {
			return err
		}
	}
	ch, stored, err := s.db.StoreReceipt(ctx, r, edu)
	if err != nil {
		return err
	}
	s.o.Changed(ch)
	if stored && edu != nil {
		s.o.Queued()
	}
	return nil
}

// setFullyRead moves the user's read marker in the room to ev, unless it
// is at a later event already.
func (s *Service) setFullyRead(ctx context.Context, userID, roomID string, ev storage.RoomEvent) error {
	old, err := s.db.AccountData(ctx, userID, roomID, FullyRead)
	switch {
	case errors.Is(err, storage.ErrNotFound):
	case err != nil:
		return err
	default:
		var marker struct {
			EventID string `json:"event_id"`
		}
		if json.Unmarshal(old, &marker) == nil && marker.EventID != "" {
			if marker.EventID == ev.EventID {
				return nil
			}
			if prev, err := s.db.RoomEvent(ctx, marker.EventID); err == nil && prev.RoomID == roomID && prev.Pos > ev.Pos {
				return nil
			}
		}
	}
	content, err := json.Marshal(map[string]string{"event_id": ev.EventID})
	if err != nil {
		return err
	}
	ch, err := s.db.SetAccountData(ctx, userID, roomID, FullyRead, content)
	if err != nil {
		return err
	}
	s.o.Changed(ch)
	return nil
}

// validEventID accepts what can name an event: "$" and printable text.
func validEventID(id string) bool {
	return len(id) > 1 && id[0] == '$' && matrixid.ValidOpaqueID(id)
}

// threadOf returns the thread root an event is in ("" for none): its
// m.relates_to of rel_type m.thread.
func threadOf(ev storage.RoomEvent) string {
	var pdu struct {
		Content struct {
			RelatesTo struct {
				RelType string `json:"rel_type"`
				EventID string `json:"event_id"`
			} `json:"m.relates_to"`
		} `json:"content"`
	}
	if json.Unmarshal(ev.JSON, &pdu) != nil || pdu.Content.RelatesTo.RelType != "m.thread" {
		return ""
	}
	return pdu.Content.RelatesTo.EventID
}

// checkThread checks a threaded receipt's event against its thread: a
// receipt in a thread is for the thread's root or an event in the thread,
// one for the main timeline is for an event in no thread.
func checkThread(ev storage.RoomEvent, threadID string) error {
	switch in := threadOf(ev); {
	case threadID == "":
		return nil
	case threadID == MainThread && in != "":
		return mxerr.InvalidParam("event %s is in thread %s, not in the main timeline", ev.EventID, in)
	case threadID != MainThread && ev.EventID != threadID && in != threadID:
		return mxerr.InvalidParam("event %s is not in thread %s", ev.EventID, threadID)
	}
	return nil
}

// receiptData is a receipt's data as clients and other servers see it.
func receiptData(r storage.Receipt) map[string]any {
	data := map[string]any{"ts": r.TS}
	if r.ThreadID != "" {
		data["thread_id"] = r.ThreadID
	}
	return data
}

// ReceiveReceipt takes an m.receipt EDU from origin (authenticated): the
// m.read receipts of origin's users joined to their rooms. Other types
// (private receipts never travel), other users and malformed parts are
// dropped without an error. Of several event IDs for one receipt the
// latest known here is kept.
func (s *Service) ReceiveReceipt(ctx context.Context, origin string, content json.RawMessage) error {
	var edu map[string]map[string]map[string]json.RawMessage
	log := reqlog.From(ctx, s.o.Logger).WithField("origin", origin)
	if json.Unmarshal(content, &edu) != nil {
		log.Debug("dropped a malformed m.receipt")
		return nil
	}
	rooms := make([]string, 0, len(edu))
	for room := range edu {
		rooms = append(rooms, room)
	}
	sort.Strings(rooms)
	for _, room := range rooms {
		if !matrixid.ValidRoomID(room) {
			continue
		}
		for user, raw := range edu[room][Read] {
			if server, ok := matrixid.ParseUserID(user); !ok || server != origin {
				log.WithField("user_id", user).Debug("dropped a receipt of a user not on its origin")
				continue
			}
			var one struct {
				EventIDs []string `json:"event_ids"`
				Data     struct {
					TS       json.RawMessage `json:"ts"`
					ThreadID json.RawMessage `json:"thread_id"`
				} `json:"data"`
			}
			if json.Unmarshal(raw, &one) != nil || len(one.EventIDs) == 0 {
				continue
			}
			if err := s.receiveOne(ctx, log, room, user, one.EventIDs, one.Data.TS, one.Data.ThreadID); err != nil {
				return err
			}
		}
	}
	return nil
}

// receiveOne stores one remote user's m.read receipt.
func (s *Service) receiveOne(ctx context.Context, log logrus.FieldLogger, roomID, userID string, eventIDs []string, rawTS, rawThread json.RawMessage) error {
	membership, err := s.db.RoomMembership(ctx, roomID, userID)
	if err != nil {
		return err
	}
	if membership != "join" {
		log.WithFields(logrus.Fields{"user_id": userID, "room_id": roomID}).Debug("dropped a receipt of a user not in the room")
		return nil
	}
	ids := make([]string, 0, len(eventIDs))
	for _, id := range eventIDs {
		if validEventID(id) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	r := storage.Receipt{RoomID: roomID, Type: Read, UserID: userID, EventID: ids[len(ids)-1], TS: s.o.Now().UnixMilli()}
	known, err := s.db.RoomEventsByID(ctx, ids)
	if err != nil {
		return err
	}
	for _, ev := range known {
		if ev.RoomID == roomID && !ev.Rejected && ev.Pos > r.EventPos {
			r.EventID, r.EventPos = ev.EventID, ev.Pos
		}
	}
	var ts int64
	if json.Unmarshal(rawTS, &ts) == nil && ts > 0 {
		r.TS = ts
	}
	var thread string
	if json.Unmarshal(rawThread, &thread) == nil && (thread == MainThread || validEventID(thread)) {
		// A thread ID that is not one counts as missing, as in Synapse.
		r.ThreadID = thread
	}
	ch, _, err := s.db.StoreReceipt(ctx, r, nil)
	if err != nil {
		return err
	}
	s.o.Changed(ch)
	return nil
}

// SyncEphemeral returns the m.receipt events of the receipts d holds (of
// the rooms the user is joined to, private ones only the user's own), one
// per room: {eventId: {type: {userId: {ts, thread_id}}}}.
func (s *Service) SyncEphemeral(userID string, d *storage.SyncData) map[string][]json.RawMessage {
	if len(d.Receipts) == 0 {
		return nil
	}
	byRoom := map[string]map[string]map[string]map[string]any{}
	for _, r := range d.Receipts {
		if r.Type == ReadPrivate && r.UserID != userID {
			continue
		}
		room := byRoom[r.RoomID]
		if room == nil {
			room = map[string]map[string]map[string]any{}
			byRoom[r.RoomID] = room
		}
		if room[r.EventID] == nil {
			room[r.EventID] = map[string]map[string]any{}
		}
		if room[r.EventID][r.Type] == nil {
			room[r.EventID][r.Type] = map[string]any{}
		}
		room[r.EventID][r.Type][r.UserID] = receiptData(r)
	}
	out := make(map[string][]json.RawMessage, len(byRoom))
	for room, content := range byRoom {
		ev, err := json.Marshal(map[string]any{"type": EDUType, "content": content})
		if err != nil {
			continue
		}
		out[room] = []json.RawMessage{ev}
	}
	return out
}
