package sqlstore

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sort"

	"github.com/keyserver/keyserver/storage"
)

// What a key query shows of local users comes from one statement: their
// devices with keys, their cross-signing keys and the signatures on them,
// told apart by the first column. The user list is named once and used in
// every branch.
func userKeysQuery(n int) string {
	in := placeholders(1, n)
	return `
	SELECT 0, user_id, device_id, display_name, key_json, last_seen_ip, last_seen_ts FROM devices
	WHERE key_json IS NOT NULL AND user_id IN (` + in + `)
	UNION ALL
	SELECT 1, user_id, usage, NULL, key_json, '', 0 FROM cross_signing_keys WHERE user_id IN (` + in + `)
	UNION ALL
	SELECT 2, target_user_id, target_key_id, signer_user_id, signer_key_id, signature, 0 FROM cross_signing_signatures
	WHERE target_user_id IN (` + in + `)`
}

// UserKeys returns what a key query shows of local users: from the cache
// of users' keys, and for the users it lacks from a single statement however
// many they are. Users with nothing are left out. The values may be shared
// with the cache and must not be modified.
func (s *Store) UserKeys(ctx context.Context, userIDs []string) (_ map[string]*storage.UserKeys, err error) {
	defer named("UserKeys", &err)
	return s.userKeys(ctx, userIDs)
}

func (s *Store) userKeys(ctx context.Context, userIDs []string) (map[string]*storage.UserKeys, error) {
	out := make(map[string]*storage.UserKeys, len(userIDs))
	var missing []string
	for _, u := range userIDs {
		if k, ok := s.devices.get(u); ok {
			if !k.empty() {
				out[u] = &k.UserKeys
			}
		} else {
			missing = append(missing, u)
		}
	}
	if len(missing) == 0 {
		return out, nil
	}
	gen, cache := s.devices.generation()
	rows, err := s.q.QueryContext(ctx, userKeysQuery(len(missing)), args(nil, missing)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	read := make(map[string]*cachedKeys, len(missing))
	for rows.Next() {
		var (
			kind       int
			user, a, d string
			b          sql.NullString
			c          []byte
			e          int64
		)
		if err := rows.Scan(&kind, &user, &a, &b, &c, &d, &e); err != nil {
			return nil, err
		}
		k := read[user]
		if k == nil {
			k = &cachedKeys{}
			read[user] = k
		}
		switch kind {
		case 0:
			dev := storage.Device{UserID: user, DeviceID: a, KeyJSON: c, LastSeenIP: d, LastSeenTS: e}
			if b.Valid {
				dev.DisplayName = &b.String
			}
			k.Devices = append(k.Devices, dev)
		case 1:
			if k.Keys == nil {
				k.Keys = map[string][]byte{}
			}
			k.Keys[a] = c
		case 2:
			k.Signatures = append(k.Signatures, storage.CrossSigningSignature{
				TargetUserID: user, TargetKeyID: a, SignerUserID: b.String, SignerKeyID: string(c), Signature: d})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, u := range missing {
		k := read[u]
		if k == nil {
			// Users with nothing are cached too: they are asked for as
			// often, and gaining a device is a change like any other.
			k = &cachedKeys{}
		} else {
			out[u] = &k.UserKeys
		}
		if cache {
			s.devices.put(gen, u, u, k)
		}
	}
	return out, nil
}

// cachedKeys is a user's entry in the key cache.
type cachedKeys struct{ storage.UserKeys }

func (k *cachedKeys) empty() bool {
	return len(k.Devices) == 0 && len(k.Keys) == 0 && len(k.Signatures) == 0
}

// UserCrossSigning returns a user's cross-signing keys and the signatures
// on them from the database.
func (s *Store) UserCrossSigning(ctx context.Context, userID string) (_ storage.CrossSigning, err error) {
	defer named("UserCrossSigning", &err)
	return s.crossSigning(ctx, s.q, userID)
}

func (s *Store) crossSigning(ctx context.Context, q querier, userID string) (storage.CrossSigning, error) {
	cs := storage.CrossSigning{Keys: map[string][]byte{}}
	rows, err := q.QueryContext(ctx, `SELECT usage, key_json FROM cross_signing_keys WHERE user_id = $1`, userID)
	if err != nil {
		return cs, err
	}
	for rows.Next() {
		var usage string
		var js []byte
		if err := rows.Scan(&usage, &js); err != nil {
			rows.Close()
			return cs, err
		}
		cs.Keys[usage] = js
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return cs, err
	}
	rows, err = q.QueryContext(ctx, `SELECT target_key_id, signer_user_id, signer_key_id, signature FROM cross_signing_signatures
		WHERE target_user_id = $1 ORDER BY target_key_id, signer_user_id, signer_key_id`, userID)
	if err != nil {
		return cs, err
	}
	defer rows.Close()
	for rows.Next() {
		sig := storage.CrossSigningSignature{TargetUserID: userID}
		if err := rows.Scan(&sig.TargetKeyID, &sig.SignerUserID, &sig.SignerKeyID, &sig.Signature); err != nil {
			return cs, err
		}
		cs.Signatures = append(cs.Signatures, sig)
	}
	return cs, rows.Err()
}

// UploadCrossSigningKeys stores the keys decide chooses, given the stored
// ones. The account row is locked first, so uploads of one user (and a
// deactivation) happen one after the other and decide sees the keys the
// write replaces.
func (s *Store) UploadCrossSigningKeys(ctx context.Context, userID string,
	decide func(stored map[string][]byte) (storage.CrossSigningWrite, error)) (_ storage.Change, err error) {
	defer named("UploadCrossSigningKeys", &err)
	return s.writeChange(ctx, func(tx *txn) error {
		var deactivated int64
		err := tx.QueryRowContext(ctx, `SELECT deactivated_ts FROM accounts WHERE user_id = $1`+s.d.forUpdate, userID).Scan(&deactivated)
		if errors.Is(err, sql.ErrNoRows) {
			return storage.ErrNotFound
		}
		if err != nil {
			return err
		}
		if deactivated != 0 {
			return storage.ErrDeactivated
		}
		stored, err := s.crossSigning(ctx, tx, userID)
		if err != nil {
			return err
		}
		w, err := decide(stored.Keys)
		if err != nil {
			return err
		}
		usages := make([]string, 0, len(w.Keys))
		for u := range w.Keys {
			usages = append(usages, u)
		}
		sort.Strings(usages)
		public, private := false, false
		for _, usage := range usages {
			js := w.Keys[usage]
			if bytes.Equal(stored.Keys[usage], js) {
				continue
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO cross_signing_keys (user_id, usage, key_json) VALUES ($1, $2, $3)
				ON CONFLICT (user_id, usage) DO UPDATE SET key_json = excluded.key_json`, userID, usage, js); err != nil {
				return err
			}
			if usage == storage.UsageUserSigning {
				private = true
			} else {
				public = true
			}
		}
		if !public && !private {
			return nil
		}
		// A public change tells the user too; a user-signing key alone
		// tells only them.
		_, err = s.recordCrossSigningChange(ctx, tx, userID, userID, !public)
		return err
	})
}

// StoreSignatures stores signatures on local users' keys; see
// storage.Database.
func (s *Store) StoreSignatures(ctx context.Context, sigs []storage.CrossSigningSignature) (_ storage.Change, err error) {
	defer named("StoreSignatures", &err)
	if len(sigs) == 0 {
		return storage.Change{}, nil
	}
	return s.writeChange(ctx, func(tx *txn) error {
		for _, sig := range sigs {
			var old string
			err := tx.QueryRowContext(ctx, `SELECT signature FROM cross_signing_signatures
				WHERE target_user_id = $1 AND target_key_id = $2 AND signer_user_id = $3 AND signer_key_id = $4`+s.d.forUpdate,
				sig.TargetUserID, sig.TargetKeyID, sig.SignerUserID, sig.SignerKeyID).Scan(&old)
			if err != nil && !errors.Is(err, sql.ErrNoRows) {
				return err
			}
			if err == nil && old == sig.Signature {
				continue
			}
			if _, err := tx.ExecContext(ctx, `
				INSERT INTO cross_signing_signatures (target_user_id, target_key_id, signer_user_id, signer_key_id, signature)
				VALUES ($1, $2, $3, $4, $5)
				ON CONFLICT (target_user_id, target_key_id, signer_user_id, signer_key_id) DO UPDATE SET signature = excluded.signature`,
				sig.TargetUserID, sig.TargetKeyID, sig.SignerUserID, sig.SignerKeyID, sig.Signature); err != nil {
				return err
			}
			var isDevice int
			if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM devices WHERE user_id = $1 AND device_id = $2`,
				sig.TargetUserID, sig.TargetKeyID).Scan(&isDevice); err != nil {
				return err
			}
			switch {
			case isDevice > 0:
				// The device's keys changed: its owner's room-mates and
				// the servers sharing a room with them are told.
				_, err = s.recordLocalChange(ctx, tx, sig.TargetUserID, sig.TargetKeyID, false)
			case sig.SignerUserID == sig.TargetUserID:
				_, err = s.recordCrossSigningChange(ctx, tx, sig.TargetUserID, sig.TargetUserID, false)
			default:
				// Another user's master key signed with the signer's
				// user-signing key, which only the signer sees.
				_, err = s.recordCrossSigningChange(ctx, tx, sig.TargetUserID, sig.SignerUserID, true)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// recordCrossSigningChange records a change of owner's cross-signing keys
// (or of the signatures on them) in the device-list stream, for the users
// sharing a room with changedUser or, with ownerOnly, for changedUser
// alone. The cached keys of owner are dropped at commit. A public change
// of a local user's keys is queued for the servers sharing a room with
// them, in the same transaction.
func (s *Store) recordCrossSigningChange(ctx context.Context, tx *txn, owner, changedUser string, ownerOnly bool) (storage.StreamPos, error) {
	if err := s.revokeUserKeys(ctx, tx, owner); err != nil {
		return 0, err
	}
	pos, err := s.nextPos(ctx, tx)
	if err != nil {
		return 0, err
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO cross_signing_changes (pos, user_id, owner_only) VALUES ($1, $2, $3)`,
		pos, changedUser, ownerOnly)
	if err != nil {
		return 0, fmt.Errorf("record cross-signing change: %w", err)
	}
	if ownerOnly {
		if s.isLocal(changedUser) {
			tx.concern(changedUser)
		}
	} else if err := s.concernRoomMates(ctx, tx, changedUser); err != nil {
		return 0, err
	}
	if !ownerOnly && owner == changedUser && s.isLocal(owner) {
		// A local user's public keys: the servers sharing a room with
		// them are sent the change.
		if err := s.queueSigningKeyUpdate(ctx, tx, owner, pos); err != nil {
			return 0, err
		}
	}
	return pos, nil
}
