package authrules

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// Rule 5.4.1: invites redeeming a third-party invite.
func TestThirdPartyInvite(t *testing.T) {
	idPub, idKey, _ := ed25519.GenerateKey(nil)
	_, otherKey, _ := ed25519.GenerateKey(nil)
	const token = "tok3n"
	b64 := base64.RawStdEncoding.EncodeToString

	// sign returns the signed object of a third-party invite as an identity
	// server makes it.
	sign := func(t *testing.T, key ed25519.PrivateKey, fields map[string]any) json.RawMessage {
		signed, err := gomatrixserverlib.SignJSON("id.example", "ed25519:0", key, mustJSON(t, fields))
		if err != nil {
			t.Fatal(err)
		}
		return signed
	}
	goodSigned := func(t *testing.T) json.RawMessage {
		return sign(t, idKey, map[string]any{"mxid": stranger, "token": token, "sender": user})
	}
	inviteWith := func(sender string, tpi any) func(r *room) gomatrixserverlib.PDU {
		return func(r *room) gomatrixserverlib.PDU {
			return r.member(sender, stranger, spec.Invite, map[string]any{"third_party_invite": tpi})
		}
	}
	withSigned := func(signed func(t *testing.T) json.RawMessage, sender string) func(r *room) gomatrixserverlib.PDU {
		return func(r *room) gomatrixserverlib.PDU {
			return inviteWith(sender, map[string]any{"display_name": "s…@example.org", "signed": signed(r.t.(*testing.T))})(r)
		}
	}
	// The m.room.third_party_invite event, by bob, with its keys.
	thirdParty := func(content map[string]any) func(r *room) {
		return func(r *room) { r.mustApply(r.state_(user, spec.MRoomThirdPartyInvite, token, content)) }
	}
	singleKey := thirdParty(map[string]any{"display_name": "s…", "key_validity_url": "https://id.example/v", "public_key": b64(idPub)})
	keyList := thirdParty(map[string]any{"display_name": "s…", "key_validity_url": "https://id.example/v",
		"public_key": b64(otherKey.Public().(ed25519.PublicKey)), "public_keys": []map[string]string{{"public_key": base64.URLEncoding.EncodeToString(idPub)}}})

	runMemberCases(t, []memberCase{
		{name: "signed with the public_key", setup: singleKey, event: withSigned(goodSigned, user)},
		{name: "signed with a key of public_keys", setup: keyList, event: withSigned(goodSigned, user)},
		// The third-party invite's sender need not be joined any more.
		{name: "inviter has left since", setup: func(r *room) {
			singleKey(r)
			r.mustApply(r.member(user, user, spec.Leave, nil))
		}, event: withSigned(goodSigned, user)},
		{name: "target banned", setup: func(r *room) {
			singleKey(r)
			r.mustApply(r.member(mod, stranger, spec.Ban, nil))
		}, event: withSigned(goodSigned, user), rule: "5.4.1.1"},
		{name: "no signed", setup: singleKey, event: inviteWith(user, map[string]any{"display_name": "s…"}), rule: "5.4.1.2"},
		{name: "third_party_invite null", setup: singleKey, event: inviteWith(user, nil), rule: "5.4.1.2"},
		{name: "third_party_invite not an object", setup: singleKey, event: inviteWith(user, "yes"), rule: "5.4.1.2"},
		{name: "no token", setup: singleKey, event: withSigned(func(t *testing.T) json.RawMessage {
			return sign(t, idKey, map[string]any{"mxid": stranger, "sender": user})
		}, user), rule: "5.4.1.3"},
		{name: "no mxid", setup: singleKey, event: withSigned(func(t *testing.T) json.RawMessage {
			return sign(t, idKey, map[string]any{"token": token, "sender": user})
		}, user), rule: "5.4.1.3"},
		{name: "mxid of another user", setup: singleKey, event: withSigned(func(t *testing.T) json.RawMessage {
			return sign(t, idKey, map[string]any{"mxid": "@other:other.example", "token": token, "sender": user})
		}, user), rule: "5.4.1.4"},
		{name: "no third-party invite with the token", setup: singleKey, event: withSigned(func(t *testing.T) json.RawMessage {
			return sign(t, idKey, map[string]any{"mxid": stranger, "token": "other", "sender": user})
		}, user), rule: "5.4.1.5"},
		{name: "sent by someone else than the third-party inviter", setup: singleKey, event: withSigned(goodSigned, mod), rule: "5.4.1.6"},
		{name: "signed by another key", setup: singleKey, event: withSigned(func(t *testing.T) json.RawMessage {
			return sign(t, otherKey, map[string]any{"mxid": stranger, "token": token, "sender": user})
		}, user), rule: "5.4.1.8"},
		{name: "signed object changed after signing", setup: singleKey, event: withSigned(func(t *testing.T) json.RawMessage {
			var m map[string]any
			_ = json.Unmarshal(goodSigned(t), &m)
			m["sender"] = mod
			return mustJSON(t, m)
		}, user), rule: "5.4.1.8"},
		{name: "no signatures", setup: singleKey, event: withSigned(func(t *testing.T) json.RawMessage {
			return mustJSON(t, map[string]any{"mxid": stranger, "token": token, "sender": user})
		}, user), rule: "5.4.1.8"},
	})
}
