package roomserver

import (
	"context"
	"encoding/json"
	"math"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/authrules"
	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/roomversion"
	"github.com/keyserver/keyserver/storage"
)

// Redactions. An m.room.redaction names the event it redacts (top-level
// redacts up to version 10, content.redacts from version 11; events this
// server builds carry both). When it is written, the event it names, if
// stored and of the same room, is kept redacted from then on, with the
// redaction in its unsigned redacted_because: everything that serves it
// (client API, /sync, federation) serves the redacted form. Up to version
// 2 the auth rules decide whether the sender may redact; from version 3
// they do not, and the redaction applies when its sender's server is the
// redacted event's sender's, or its sender's power is at least the
// room's redact level. A redaction that arrives before the event it names
// applies to nothing.

// redactsOf returns the ID of the event a redaction redacts.
func redactsOf(ev gomatrixserverlib.PDU) string {
	if id := ev.Redacts(); id != "" {
		return id
	}
	var c struct {
		Redacts string `json:"redacts"`
	}
	_ = json.Unmarshal(ev.Content(), &c)
	return c.Redacts
}

// redaction returns what a redaction event does: the redacted form of
// the event it names, or nil when it changes nothing.
func (s *Service) redaction(ctx context.Context, ev gomatrixserverlib.PDU) (*storage.RoomRedaction, error) {
	if ev.Type() != spec.MRoomRedaction {
		return nil, nil
	}
	stored, err := s.db.RoomEventsByID(ctx, []string{redactsOf(ev)})
	if err != nil || len(stored) != 1 || stored[0].Rejected || stored[0].RoomID != ev.RoomID().String() {
		return nil, err
	}
	target, err := pdu(stored[0])
	if err != nil {
		return nil, err
	}
	if matrixid.Server(string(ev.SenderID())) != matrixid.Server(string(target.SenderID())) {
		allowed, err := s.mayRedactOthers(ctx, ev.RoomID().String(), ev.SenderID())
		if err != nil || !allowed {
			return nil, err
		}
	}
	target.Redact()
	if err := target.SetUnsignedField("redacted_because", clientEvent(ev)); err != nil {
		return nil, err
	}
	return &storage.RoomRedaction{EventID: target.EventID(), RoomID: stored[0].RoomID, JSON: target.JSON()}, nil
}

// mayRedactOthers reports whether a user has a room's redact level now.
func (s *Service) mayRedactOthers(ctx context.Context, roomID string, sender spec.SenderID) (bool, error) {
	pl, err := s.powerLevels(ctx, roomID)
	if err != nil || pl == nil {
		return false, err
	}
	return pl.UserLevel(sender) >= pl.Redact, nil
}

// powerLevels are a room's power levels now (the spec's defaults when it
// has no power levels event); nil when its state cannot be read as a
// room's (no create event).
func (s *Service) powerLevels(ctx context.Context, roomID string) (*gomatrixserverlib.PowerLevelContent, error) {
	stored, err := s.db.RoomStateEvents(ctx, roomID,
		[]storage.StateKey{{Type: spec.MRoomCreate}, {Type: spec.MRoomPowerLevels}})
	if err != nil {
		return nil, err
	}
	evs, err := pdus(stored)
	if err != nil {
		return nil, err
	}
	ae, err := authEventsFrom(evs)
	if err != nil {
		return nil, nil
	}
	create, err := ae.Create()
	if err != nil || create == nil {
		return nil, err
	}
	pl, err := gomatrixserverlib.NewPowerLevelContentFromAuthEvents(ae, string(create.SenderID()))
	if err != nil {
		return nil, nil
	}
	pl = withCreators(pl, create)
	return &pl, nil
}

// withCreators gives the creators of a version 12 room their power
// (above any level: math.MaxInt64) in a copy of pl; other versions'
// levels are returned as they are. These levels serve the decisions the
// server makes outside the auth rules (applying a redaction, upgrading);
// they are never written back into an event.
func withCreators(pl gomatrixserverlib.PowerLevelContent, create gomatrixserverlib.PDU) gomatrixserverlib.PowerLevelContent {
	if create == nil || !roomversion.Is12(create.Version()) {
		return pl
	}
	creators, err := authrules.Creators(create)
	if err != nil {
		return pl
	}
	users := make(map[string]int64, len(pl.Users)+len(creators))
	for u, l := range pl.Users {
		users[u] = l
	}
	for _, c := range creators {
		users[c] = math.MaxInt64
	}
	pl.Users = users
	return pl
}

// CheckDirectoryChange allows a user to list a room in the public room
// directory or take it out, as Synapse decides it: a joined member with
// the power level to set the room's canonical alias. 404 for a room this
// server does not know, 403 otherwise.
func (s *Service) CheckDirectoryChange(ctx context.Context, userID, roomID string) error {
	if err := s.joined(ctx, roomID, userID); err != nil {
		return err
	}
	pl, err := s.powerLevels(ctx, roomID)
	if err != nil {
		return err
	}
	if pl == nil || pl.UserLevel(spec.SenderID(userID)) < pl.EventLevel(spec.MRoomCanonicalAlias, true) {
		return mxerr.Forbidden("you may not change the room's entry in the room directory")
	}
	return nil
}

// Redact redacts an event of a room (PUT /rooms/{roomId}/redact/...);
// a retried request of the same device gets the same redaction.
func (s *Service) Redact(ctx context.Context, sender, deviceID, roomID, eventID, txnID, reason string) (string, error) {
	if err := s.joined(ctx, roomID, sender); err != nil {
		return "", err
	}
	content := map[string]any{"redacts": eventID}
	if reason != "" {
		content["reason"] = reason
	}
	if err := s.checkLocalRedaction(ctx, sender, roomID, eventID); err != nil {
		return "", err
	}
	path, _ := json.Marshal([]string{"redact", roomID, eventID, txnID})
	ev, err := s.send(ctx, roomID, sender, spec.MRoomRedaction, nil, content,
		&storage.RoomTxn{UserID: sender, DeviceID: deviceID, Path: string(path)})
	if err != nil {
		return "", err
	}
	return ev.EventID(), nil
}

// checkLocalRedaction checks a redaction by one of our users, as Synapse
// does: of a known event of the room, their own, or with the room's
// redact level.
func (s *Service) checkLocalRedaction(ctx context.Context, sender, roomID, eventID string) error {
	stored, err := s.db.RoomEventsByID(ctx, []string{eventID})
	if err != nil {
		return err
	}
	if len(stored) != 1 || stored[0].RoomID != roomID || stored[0].Rejected {
		return mxerr.NotFound("unknown event %s", eventID)
	}
	if stored[0].Sender == sender {
		return nil
	}
	if ok, err := s.mayRedactOthers(ctx, roomID, spec.SenderID(sender)); err != nil {
		return err
	} else if !ok {
		return mxerr.Forbidden("you may redact only your own events in this room")
	}
	return nil
}
