package roomserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/authrules"
	"github.com/keyserver/keyserver/roomversion"
)

// A join of a version 12 room over federation runs the handshake here:
// gomatrixserverlib.PerformJoin builds the join with its own builder and
// checks the answer with the version 11 auth rules, which refuse a create
// event without room_id. The steps are those of PerformJoin: the
// template checked, the join built and signed, /send_join, then every
// event of the answer checked before any is kept.

// performJoin12 completes a join from a version 12 template.
func (s *Service) performJoin12(ctx context.Context, server string, tmpl gomatrixserverlib.MakeJoinResponse, userID, roomID string,
	content map[string]any) (*gomatrixserverlib.PerformJoinResponse, error) {
	proto := tmpl.GetJoinEvent()
	var tc map[string]any
	_ = json.Unmarshal(proto.Content, &tc)
	switch {
	case proto.Type != spec.MRoomMember || proto.RoomID != roomID || proto.SenderID != userID ||
		proto.StateKey == nil || *proto.StateKey != userID || tc["membership"] != spec.Join:
		return nil, errors.New("make_join answered with a template for another room, user or membership")
	}
	c := map[string]any{}
	for k, v := range content {
		c[k] = v
	}
	if via, ok := tc["join_authorised_via_users_server"]; ok {
		c["join_authorised_via_users_server"] = via
	}
	c["membership"] = spec.Join
	raw, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	proto.Content = raw
	proto.Redacts = ""
	join, err := roomversion.Build(roomversion.V12, &proto, s.opts.Now(), spec.ServerName(s.opts.ServerName), s.opts.KeyID, s.opts.PrivateKey)
	if err != nil {
		return nil, fmt.Errorf("the join cannot be built from the template: %w", err)
	}
	res, err := s.opts.Handshakes.SendJoin(ctx, spec.ServerName(s.opts.ServerName), spec.ServerName(server), join)
	if err != nil {
		return nil, err
	}
	if signed := res.GetJoinEvent(); len(signed) > 0 {
		// A restricted join comes back signed by the resident too.
		if ev, err := gomatrixserverlib.MustGetRoomVersion(roomversion.V12).NewEventFromUntrustedJSON(signed); err == nil &&
			ev.EventID() == join.EventID() {
			join = ev
		}
	}
	state, err := s.checkJoinAnswer12(ctx, roomID, join, res)
	if err != nil {
		return nil, fmt.Errorf("the send_join answer is not valid: %w", err)
	}
	return &gomatrixserverlib.PerformJoinResponse{JoinEvent: join, StateSnapshot: state}, nil
}

// joinAnswer is the checked state and auth chain of a send_join answer.
type joinAnswer struct{ auth, state gomatrixserverlib.EventJSONs }

func (a joinAnswer) GetAuthEvents() gomatrixserverlib.EventJSONs  { return a.auth }
func (a joinAnswer) GetStateEvents() gomatrixserverlib.EventJSONs { return a.state }

// checkJoinAnswer12 checks a version 12 send_join answer: its create
// event hashes to the room ID, every event is of the room and signed by
// its sender's server, every event is allowed by its auth events (in
// depth order, so those are checked first), and the join is allowed by
// the state returned. Events that fail are left out, as are the events
// that depend on them; a missing or wrong create event fails the answer.
func (s *Service) checkJoinAnswer12(ctx context.Context, roomID string, join gomatrixserverlib.PDU, res gomatrixserverlib.SendJoinResponse) (joinAnswer, error) {
	authEvs := res.GetAuthEvents().UntrustedEvents(roomversion.V12)
	stateEvs := res.GetStateEvents().UntrustedEvents(roomversion.V12)
	all := map[string]gomatrixserverlib.PDU{}
	for _, ev := range append(slices.Clone(authEvs), stateEvs...) {
		all[ev.EventID()] = ev
	}
	create, ok := all[roomversion.CreateEventID(roomID)]
	if !ok || create.Type() != spec.MRoomCreate || !create.StateKeyEquals("") {
		return joinAnswer{}, errors.New("the room's create event is missing (its hash is the room ID)")
	}
	ordered := make([]gomatrixserverlib.PDU, 0, len(all))
	for _, ev := range all {
		ordered = append(ordered, ev)
	}
	sort.Slice(ordered, func(i, j int) bool {
		if ordered[i].Depth() != ordered[j].Depth() {
			return ordered[i].Depth() < ordered[j].Depth()
		}
		return ordered[i].EventID() < ordered[j].EventID()
	})
	valid := map[string]bool{}
	for _, ev := range ordered {
		if ev.RoomID().String() != roomID {
			continue
		}
		if err := gomatrixserverlib.VerifyEventSignatures(ctx, ev, s.opts.KeyRing, userIDForSender); err != nil {
			s.opts.Logger.WithField("event_id", ev.EventID()).WithError(err).Info("send_join answer: event with a bad signature left out")
			continue
		}
		provider := gomatrixserverlib.NewAuthEvents(nil)
		complete := true
		for _, id := range authEventIDs(ev) {
			a, ok := all[id]
			if !ok || !valid[id] {
				complete = false
				break
			}
			if err := provider.AddEvent(a); err != nil {
				complete = false
				break
			}
		}
		if !complete {
			continue
		}
		var listed []gomatrixserverlib.PDU
		for _, id := range ev.AuthEventIDs() {
			listed = append(listed, all[id])
		}
		if err := authrules.CheckAuthEvents(ev, listed); err != nil {
			s.opts.Logger.WithField("event_id", ev.EventID()).WithError(err).Info("send_join answer: event with wrong auth events left out")
			continue
		}
		if err := allowed(ev, &provider); err != nil {
			s.opts.Logger.WithField("event_id", ev.EventID()).WithError(err).Info("send_join answer: event not allowed by its auth events left out")
			continue
		}
		valid[ev.EventID()] = true
	}
	if !valid[create.EventID()] {
		return joinAnswer{}, errors.New("the room's create event is not valid")
	}
	var out joinAnswer
	stateProvider := gomatrixserverlib.NewAuthEvents(nil)
	for _, ev := range stateEvs {
		if valid[ev.EventID()] {
			out.state = append(out.state, ev.JSON())
			_ = stateProvider.AddEvent(ev)
		}
	}
	for _, ev := range authEvs {
		if valid[ev.EventID()] {
			out.auth = append(out.auth, ev.JSON())
		}
	}
	if err := stateProvider.AddEvent(create); err != nil {
		return joinAnswer{}, err
	}
	if err := allowed(join, &stateProvider); err != nil {
		return joinAnswer{}, fmt.Errorf("the join is not allowed by the room's state: %w", err)
	}
	return out, nil
}
