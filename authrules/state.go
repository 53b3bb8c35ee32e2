package authrules

import (
	"encoding/json"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// authState is what the rules know of the room when authorising ev: the
// create event, the current power levels and, through the provider, the
// memberships, join rules and third-party invites. Every event taken from the
// provider is checked to be of ev's room (rule 3.4).
type authState struct {
	ev              gomatrixserverlib.PDU
	roomID          string
	provider        gomatrixserverlib.AuthEventProvider
	userIDForSender spec.UserIDForSender

	create   gomatrixserverlib.PDU
	content  createContent
	creators []string

	levelsEvent gomatrixserverlib.PDU // nil when the room has no power levels event
	levels      *levels               // nil when the room has no power levels event
}

// loadState checks rules 2 and 3 (what the provider lets us see) and reads
// the create and power levels events.
func loadState(ev gomatrixserverlib.PDU, provider gomatrixserverlib.AuthEventProvider, userIDForSender spec.UserIDForSender) (*authState, error) {
	st := &authState{ev: ev, roomID: ev.RoomID().String(), provider: provider, userIDForSender: userIDForSender}

	// Rule 2: the room ID is the ID of the room's create event, with "!"
	// for "$". (That the create event was accepted is the caller's part.)
	create, err := provider.Create()
	if err != nil {
		return nil, err
	}
	if create == nil {
		return nil, notAllowed("2", "no create event for room %s", st.roomID)
	}
	if create.Type() != spec.MRoomCreate || !create.StateKeyEquals("") {
		return nil, notAllowed("2", "the create event given for room %s is a %s event", st.roomID, create.Type())
	}
	createID := create.EventID()
	if len(createID) < 2 || createID[0] != '$' || st.roomID != "!"+createID[1:] {
		return nil, notAllowed("2", "room %s is not the room of create event %s", st.roomID, createID)
	}
	st.create = create

	// Rule 3.2: the create event is implied by the room ID, never listed.
	for _, id := range ev.AuthEventIDs() {
		if id == createID {
			return nil, notAllowed("3.2", "auth_events lists the create event %s", createID)
		}
	}
	// Rule 3.4: auth events of another room.
	if !provider.Valid() {
		return nil, notAllowed("3.4", "the auth events are of more than one room")
	}

	if st.content, err = parseCreateContent(create.Content()); err != nil {
		return nil, notAllowed("2", "the create event %s is not valid: %v", createID, err)
	}
	st.creators = creatorList(create, st.content)

	pl, err := st.fetch(provider.PowerLevels())
	if err != nil {
		return nil, err
	}
	if pl != nil {
		if st.levels, err = parseLevels(pl.Content()); err != nil {
			return nil, notAllowed("3", "the room's power levels event %s is not valid: %v", pl.EventID(), err)
		}
		st.levelsEvent = pl
	}
	return st, nil
}

// fetch checks an event the provider gave: rule 3.4, it must be of the
// event's room.
func (st *authState) fetch(e gomatrixserverlib.PDU, err error) (gomatrixserverlib.PDU, error) {
	if err != nil || e == nil {
		return nil, err
	}
	if r := e.RoomID().String(); r != st.roomID {
		return nil, notAllowed("3.4", "auth event %s (%s) is of room %s, not %s", e.EventID(), e.Type(), r, st.roomID)
	}
	return e, nil
}

// isCreator reports whether userID is one of the room's creators.
func (st *authState) isCreator(userID string) bool {
	for _, c := range st.creators {
		if c == userID {
			return true
		}
	}
	return false
}

// userLevel is a user's power level: infinite for creators, else from the
// power levels event (0 when there is none).
func (st *authState) userLevel(userID string) level {
	if st.isCreator(userID) {
		return infiniteLevel
	}
	return finiteLevel(st.levels.userLevel(userID))
}

// memberEvent returns userID's current m.room.member event, or nil.
func (st *authState) memberEvent(userID string) (gomatrixserverlib.PDU, error) {
	return st.fetch(st.provider.Member(spec.SenderID(userID)))
}

// membership returns userID's current membership, "leave" when they have none.
func (st *authState) membership(userID string) (string, error) {
	e, err := st.memberEvent(userID)
	if err != nil || e == nil {
		return spec.Leave, err
	}
	var c struct {
		Membership string `json:"membership"`
	}
	if err := json.Unmarshal(e.Content(), &c); err != nil {
		return "", notAllowed("3", "the membership event %s of %s is not valid: %v", e.EventID(), userID, err)
	}
	return c.Membership, nil
}

// joinRule returns the room's join rule; "invite" when there is no join
// rules event or it has no join_rule.
func (st *authState) joinRule() (string, error) {
	e, err := st.fetch(st.provider.JoinRules())
	if err != nil || e == nil {
		return spec.Invite, err
	}
	var c struct {
		JoinRule *string `json:"join_rule"`
	}
	if err := json.Unmarshal(e.Content(), &c); err != nil {
		return "", notAllowed("3", "the join rules event %s is not valid: %v", e.EventID(), err)
	}
	if c.JoinRule == nil {
		return spec.Invite, nil
	}
	return *c.JoinRule, nil
}

// senderDomain is the server name of a sender.
func (st *authState) senderDomain(sender spec.SenderID) (spec.ServerName, bool) {
	var userID *spec.UserID
	var err error
	if st.userIDForSender != nil {
		userID, err = st.userIDForSender(st.ev.RoomID(), sender)
	} else {
		userID, err = spec.NewUserID(string(sender), true)
	}
	if err != nil || userID == nil {
		return "", false
	}
	return userID.Domain(), true
}

// federateAllowed applies rule 4: a room created with m.federate false only
// takes events from users of the creator's server.
func (st *authState) federateAllowed() error {
	if st.content.federate {
		return nil
	}
	senderDomain, ok := st.senderDomain(st.ev.SenderID())
	if !ok {
		return notAllowed("4", "the sender %s is not a user ID", st.ev.SenderID())
	}
	createDomain, ok := st.senderDomain(st.create.SenderID())
	if !ok {
		return notAllowed("4", "the create event's sender %s is not a user ID", st.create.SenderID())
	}
	if senderDomain != createDomain {
		return notAllowed("4", "the room does not federate: sender %s is not of the creator's server %s", st.ev.SenderID(), createDomain)
	}
	return nil
}
