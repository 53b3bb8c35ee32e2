package authrules

import (
	"crypto/ed25519"
	"encoding/json"
	"strings"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// memberContent is what the rules read from an m.room.member event.
type memberContent struct {
	Membership       *string         `json:"membership"`
	AuthorisedVia    json.RawMessage `json:"join_authorised_via_users_server"`
	ThirdPartyInvite json.RawMessage `json:"third_party_invite"`
}

// memberChange is a membership event being authorised: who sends it, whose
// membership it sets, to what, and the current memberships of both.
type memberChange struct {
	*authState
	content          memberContent
	newMembership    string
	sender, target   string
	senderMembership string // current
	targetMembership string // current
}

// memberAllowed applies rule 5 to an m.room.member event.
func (st *authState) memberAllowed() error {
	ev := st.ev
	// Rule 5.1: a state key and a membership.
	if ev.StateKey() == nil {
		return notAllowed("5.1", "the membership event has no state_key")
	}
	m := &memberChange{authState: st, sender: string(ev.SenderID()), target: *ev.StateKey()}
	if err := json.Unmarshal(ev.Content(), &m.content); err != nil {
		return notAllowed("5.1", "the membership event's content is not valid: %v", err)
	}
	if m.content.Membership == nil {
		return notAllowed("5.1", "the membership event has no membership")
	}
	m.newMembership = *m.content.Membership
	// Rule 5.2 (signature of the join_authorised_via_users_server user's
	// server) is checked with the event's signatures.

	var err error
	if m.senderMembership, err = st.membership(m.sender); err != nil {
		return err
	}
	if m.targetMembership, err = st.membership(m.target); err != nil {
		return err
	}

	switch m.newMembership {
	case spec.Join:
		return m.joinAllowed()
	case spec.Invite:
		return m.inviteAllowed()
	case spec.Leave:
		return m.leaveAllowed()
	case spec.Ban:
		return m.banAllowed()
	case spec.Knock:
		return m.knockAllowed()
	default:
		// Rule 5.8.
		return notAllowed("5.8", "unknown membership %q", m.newMembership)
	}
}

// joinAllowed applies rule 5.3.
func (m *memberChange) joinAllowed() error {
	// Rule 5.3.1: the creator's join right after the create event.
	if prev := m.ev.PrevEventIDs(); len(prev) == 1 && prev[0] == m.create.EventID() && m.target == string(m.create.SenderID()) {
		return nil
	}
	// Rule 5.3.2: one joins only oneself.
	if m.sender != m.target {
		return notAllowed("5.3.2", "%s may not join %s to the room", m.sender, m.target)
	}
	// Rule 5.3.3: the banned do not join.
	if m.senderMembership == spec.Ban {
		return notAllowed("5.3.3", "%s is banned from the room", m.sender)
	}
	joinRule, err := m.joinRule()
	if err != nil {
		return err
	}
	invitedOrJoined := m.targetMembership == spec.Invite || m.targetMembership == spec.Join
	switch joinRule {
	case spec.Invite, spec.Knock:
		// Rule 5.3.4.
		if invitedOrJoined {
			return nil
		}
		return notAllowed("5.3.4", "%s is not invited to the room (join rule %q, membership %q)", m.sender, joinRule, m.targetMembership)
	case spec.Restricted, spec.KnockRestricted:
		// Rule 5.3.5.1.
		if invitedOrJoined {
			return nil
		}
		// Rule 5.3.5.2: the authorising user must be able to invite.
		return m.authorisedJoinAllowed()
	case spec.Public:
		// Rule 5.3.6.
		return nil
	default:
		// Rule 5.3.7.
		return notAllowed("5.3.7", "the join rule %q lets nobody join", joinRule)
	}
}

// authorisedJoinAllowed applies rule 5.3.5.2: a restricted join names in
// join_authorised_via_users_server a user with the permission to invite: a
// joined member whose power level is at least the invite level.
func (m *memberChange) authorisedJoinAllowed() error {
	if len(m.content.AuthorisedVia) == 0 || string(m.content.AuthorisedVia) == "null" {
		return notAllowed("5.3.5.2", "%s is not invited and the join names no authorising user", m.sender)
	}
	var via string
	if err := json.Unmarshal(m.content.AuthorisedVia, &via); err != nil || via == "" {
		return notAllowed("5.3.5.2", "join_authorised_via_users_server is %s, not a user ID", m.content.AuthorisedVia)
	}
	membership, err := m.membership(via)
	if err != nil {
		return err
	}
	if membership != spec.Join {
		return notAllowed("5.3.5.2", "the authorising user %s is not joined to the room (membership %q)", via, membership)
	}
	if l, invite := m.userLevel(via), m.levels.invite(); !l.atLeast(invite) {
		return notAllowed("5.3.5.2", "the authorising user %s has power level %s, inviting needs %d", via, l, invite)
	}
	// Rule 5.3.5.3.
	return nil
}

// inviteAllowed applies rule 5.4.
func (m *memberChange) inviteAllowed() error {
	// Rule 5.4.1: an invite redeeming a third-party invite (the property
	// present, whatever its value).
	if len(m.content.ThirdPartyInvite) > 0 {
		return m.thirdPartyInviteAllowed()
	}
	// Rule 5.4.2: only members invite.
	if m.senderMembership != spec.Join {
		return notAllowed("5.4.2", "the inviter %s is not joined to the room (membership %q)", m.sender, m.senderMembership)
	}
	// Rule 5.4.3: members and banned users are not invited.
	if m.targetMembership == spec.Join || m.targetMembership == spec.Ban {
		return notAllowed("5.4.3", "%s cannot be invited: their membership is %q", m.target, m.targetMembership)
	}
	// Rules 5.4.4 and 5.4.5: the invite level.
	if l, invite := m.userLevel(m.sender), m.levels.invite(); !l.atLeast(invite) {
		return notAllowed("5.4.5", "the inviter %s has power level %s, inviting needs %d", m.sender, l, invite)
	}
	return nil
}

// thirdPartyInviteAllowed applies rule 5.4.1.
func (m *memberChange) thirdPartyInviteAllowed() error {
	// Rule 5.4.1.1.
	if m.targetMembership == spec.Ban {
		return notAllowed("5.4.1.1", "%s is banned from the room", m.target)
	}
	var tpi struct {
		Signed json.RawMessage `json:"signed"`
	}
	if err := json.Unmarshal(m.content.ThirdPartyInvite, &tpi); err != nil || len(tpi.Signed) == 0 || string(tpi.Signed) == "null" {
		// Rule 5.4.1.2.
		return notAllowed("5.4.1.2", "third_party_invite has no signed object")
	}
	var signed struct {
		MXID       *string                      `json:"mxid"`
		Token      *string                      `json:"token"`
		Signatures map[string]map[string]string `json:"signatures"`
	}
	if err := json.Unmarshal(tpi.Signed, &signed); err != nil {
		return notAllowed("5.4.1.2", "third_party_invite.signed is not valid: %v", err)
	}
	// Rule 5.4.1.3.
	if signed.MXID == nil || signed.Token == nil {
		return notAllowed("5.4.1.3", "third_party_invite.signed has no mxid or no token")
	}
	// Rule 5.4.1.4.
	if *signed.MXID != m.target {
		return notAllowed("5.4.1.4", "third_party_invite.signed.mxid %s is not the invited user %s", *signed.MXID, m.target)
	}
	// Rule 5.4.1.5.
	invite, err := m.fetch(m.provider.ThirdPartyInvite(*signed.Token))
	if err != nil {
		return err
	}
	if invite == nil {
		return notAllowed("5.4.1.5", "no m.room.third_party_invite with the token %q", *signed.Token)
	}
	// Rule 5.4.1.6.
	if invite.SenderID() != m.ev.SenderID() {
		return notAllowed("5.4.1.6", "the sender %s did not send the third-party invite, %s did", m.sender, invite.SenderID())
	}
	// Rule 5.4.1.7: a signature of signed by one of the invite's public keys.
	for _, key := range thirdPartyInviteKeys(invite) {
		for signer, sigs := range signed.Signatures {
			for keyID := range sigs {
				if !strings.HasPrefix(keyID, "ed25519:") {
					continue
				}
				if gomatrixserverlib.VerifyJSON(signer, gomatrixserverlib.KeyID(keyID), key, tpi.Signed) == nil {
					return nil
				}
			}
		}
	}
	// Rule 5.4.1.8.
	return notAllowed("5.4.1.8", "no signature of third_party_invite.signed verifies with the public keys of the third-party invite")
}

// thirdPartyInviteKeys returns the ed25519 public keys of an
// m.room.third_party_invite event: public_key and the public_keys list.
func thirdPartyInviteKeys(invite gomatrixserverlib.PDU) []ed25519.PublicKey {
	var c struct {
		PublicKey  string `json:"public_key"`
		PublicKeys []struct {
			PublicKey string `json:"public_key"`
		} `json:"public_keys"`
	}
	if err := json.Unmarshal(invite.Content(), &c); err != nil {
		return nil
	}
	encoded := []string{c.PublicKey}
	for _, k := range c.PublicKeys {
		encoded = append(encoded, k.PublicKey)
	}
	var keys []ed25519.PublicKey
	for _, e := range encoded {
		var b spec.Base64Bytes
		if e == "" || b.Decode(strings.TrimRight(e, "=")) != nil || len(b) != ed25519.PublicKeySize {
			continue
		}
		keys = append(keys, ed25519.PublicKey(b))
	}
	return keys
}

// leaveAllowed applies rule 5.5: leaving, kicking and unbanning.
func (m *memberChange) leaveAllowed() error {
	// Rule 5.5.1: leaving oneself, from an invite, a join or a knock.
	if m.sender == m.target {
		switch m.senderMembership {
		case spec.Invite, spec.Join, spec.Knock:
			return nil
		}
		return notAllowed("5.5.1", "%s cannot leave from membership %q", m.sender, m.senderMembership)
	}
	// Rule 5.5.2: only members kick and unban.
	if m.senderMembership != spec.Join {
		return notAllowed("5.5.2", "%s is not joined to the room (membership %q)", m.sender, m.senderMembership)
	}
	senderLevel, targetLevel := m.userLevel(m.sender), m.userLevel(m.target)
	// Rule 5.5.3: unbanning needs the ban level.
	if ban := m.levels.ban(); m.targetMembership == spec.Ban && !senderLevel.atLeast(ban) {
		return notAllowed("5.5.3", "%s has power level %s, unbanning needs %d", m.sender, senderLevel, ban)
	}
	// Rule 5.5.4: the kick level, and more power than the target.
	kick := m.levels.kick()
	if senderLevel.atLeast(kick) && targetLevel.below(senderLevel) {
		return nil
	}
	// Rule 5.5.5.
	return notAllowed("5.5.5", "%s (power level %s, kick level %d) may not remove %s (power level %s)", m.sender, senderLevel, kick, m.target, targetLevel)
}

// banAllowed applies rule 5.6.
func (m *memberChange) banAllowed() error {
	// Rule 5.6.1.
	if m.senderMembership != spec.Join {
		return notAllowed("5.6.1", "%s is not joined to the room (membership %q)", m.sender, m.senderMembership)
	}
	// Rule 5.6.2: the ban level, and more power than the target.
	senderLevel, targetLevel := m.userLevel(m.sender), m.userLevel(m.target)
	ban := m.levels.ban()
	if senderLevel.atLeast(ban) && targetLevel.below(senderLevel) {
		return nil
	}
	// Rule 5.6.3.
	return notAllowed("5.6.3", "%s (power level %s, ban level %d) may not ban %s (power level %s)", m.sender, senderLevel, ban, m.target, targetLevel)
}

// knockAllowed applies rule 5.7.
func (m *memberChange) knockAllowed() error {
	joinRule, err := m.joinRule()
	if err != nil {
		return err
	}
	// Rule 5.7.1.
	if joinRule != spec.Knock && joinRule != spec.KnockRestricted {
		return notAllowed("5.7.1", "the join rule %q does not allow knocking", joinRule)
	}
	// Rule 5.7.2.
	if m.sender != m.target {
		return notAllowed("5.7.2", "%s may not knock for %s", m.sender, m.target)
	}
	// Rules 5.7.3 and 5.7.4.
	switch m.senderMembership {
	case spec.Ban, spec.Invite, spec.Join:
		return notAllowed("5.7.4", "%s cannot knock with membership %q", m.sender, m.senderMembership)
	}
	return nil
}
