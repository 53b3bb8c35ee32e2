package sqlstore

import (
	"context"
	"strings"

	"github.com/keyserver/keyserver/storage"
)

// Outbound m.signing_key_update: a change of a local user's master or
// self-signing key (or of the user's signatures on the master key) is
// queued for every server sharing a room with the user, in the
// transaction of the change (table outbound_signing_key_updates). It goes
// out through the same per-destination queue as device-list updates
// (PendingUpdates, MarkUpdatesSent), marked OutboundUpdate.SigningKeys,
// and carries the keys current when it is sent.

// queueSigningKeyUpdate queues, for every remote server sharing a room
// with the local user userID now, the change of their keys at pos; it
// replaces an unsent older one.
func (s *Store) queueSigningKeyUpdate(ctx context.Context, tx *txn, userID string, pos storage.StreamPos) error {
	mates, err := s.txUserList(ctx, tx, `
		SELECT DISTINCT theirs.user_id FROM memberships mine JOIN memberships theirs ON theirs.room_id = mine.room_id
		WHERE mine.user_id = $1 AND mine.membership IN ('join', 'invite') AND theirs.membership IN ('join', 'invite')`, userID)
	if err != nil {
		return err
	}
	dests := map[string]bool{}
	for _, other := range mates {
		if _, server, ok := strings.Cut(other, ":"); ok && server != s.serverName {
			dests[server] = true
		}
	}
	for dest := range dests {
		if _, err := tx.ExecContext(ctx, `
			INSERT INTO outbound_signing_key_updates (destination, user_id, stream_id) VALUES ($1, $2, $3)
			ON CONFLICT (destination, user_id) DO UPDATE SET stream_id = excluded.stream_id`,
			dest, userID, pos); err != nil {
			return err
		}
	}
	return nil
}

// withCurrentKeys fills in the updates of a batch what they carry of the
// users' cross-signing state now: the signatures the users made on their
// own keys and, in signing-key updates, the master and self-signing keys.
// The user-signing key never leaves the server.
func (s *Store) withCurrentKeys(ctx context.Context, batch []storage.OutboundUpdate) error {
	var users []string
	seen := map[string]bool{}
	for _, u := range batch {
		if !seen[u.UserID] {
			seen[u.UserID] = true
			users = append(users, u.UserID)
		}
	}
	if len(users) == 0 {
		return nil
	}
	keys, err := s.userKeys(ctx, users)
	if err != nil {
		return err
	}
	own := map[string][]storage.CrossSigningSignature{}
	for user, k := range keys {
		for _, sig := range k.Signatures {
			if sig.SignerUserID == user {
				own[user] = append(own[user], sig)
			}
		}
	}
	for i := range batch {
		u := &batch[i]
		u.Signatures = own[u.UserID]
		if k := keys[u.UserID]; u.SigningKeys && k != nil {
			u.MasterKey = k.Keys[storage.UsageMaster]
			u.SelfSigningKey = k.Keys[storage.UsageSelfSigning]
		}
	}
	return nil
}
