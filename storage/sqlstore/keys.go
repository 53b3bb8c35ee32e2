package sqlstore

import (
	"bytes"
	"context"
	"database/sql"
	"sort"
	"strings"

	"github.com/keyserver/keyserver/storage"
)

// UploadKeys runs one key upload as a single transaction. It reads the
// device's key state (locking the device row, so uploads for one device
// queue behind each other), lets decide choose what to write from it, and
// writes that. decide's error aborts the upload with nothing written.
// oneTimeKeyIDs are the full IDs ("alg:id") the upload names, so that the
// state includes any of them already stored.
func (s *Store) UploadKeys(ctx context.Context, userID, deviceID string, oneTimeKeyIDs []string,
	decide func(storage.KeyState) (storage.KeyWrite, error)) (storage.UploadResult, error) {
	var res storage.UploadResult
	err := s.write(ctx, func(tx *txn) error {
		res = storage.UploadResult{}
		state, err := s.keyState(ctx, tx, userID, deviceID, oneTimeKeyIDs)
		if err != nil {
			return err
		}
		w, err := decide(state)
		if err != nil {
			return err
		}
		if w.DeviceKeys != nil && !bytes.Equal(w.DeviceKeys, state.DeviceKeys) {
			if _, err := tx.ExecContext(ctx, `UPDATE devices SET key_json = $1 WHERE user_id = $2 AND device_id = $3`,
				string(w.DeviceKeys), userID, deviceID); err != nil {
				return err
			}
			if res.Pos, err = s.recordLocalChange(ctx, tx, userID, deviceID, false); err != nil {
				return err
			}
		}
		if err := insertOneTimeKeys(ctx, tx, userID, deviceID, w.OneTimeKeys); err != nil {
			return err
		}
		for _, k := range w.FallbackKeys {
			if _, err := tx.ExecContext(ctx, `
				INSERT INTO fallback_keys (user_id, device_id, algorithm, key_id, key_json, used)
				VALUES ($1, $2, $3, $4, $5, FALSE)
				ON CONFLICT (user_id, device_id, algorithm)
				DO UPDATE SET key_id = excluded.key_id, key_json = excluded.key_json, used = FALSE`,
				userID, deviceID, k.Algorithm, k.KeyID, string(k.JSON)); err != nil {
				return err
			}
		}
		res.Counts = state.Counts
		res.Stored = len(w.OneTimeKeys)
		for _, k := range w.OneTimeKeys {
			res.Counts[k.Algorithm]++
		}
		return nil
	})
	return res, err
}

// maxAlgorithmTerms is how many algorithms an upload may name before the
// lookup of its existing keys stops using one indexed term per algorithm.
const maxAlgorithmTerms = 8

func (s *Store) keyState(ctx context.Context, tx *txn, userID, deviceID string, otkIDs []string) (storage.KeyState, error) {
	st := storage.KeyState{
		ExistingOneTimeKeys: map[string][]byte{},
		Counts:              map[string]int{},
		Fallback:            map[string]storage.FallbackKey{},
	}
	var keys []byte
	err := tx.QueryRowContext(ctx, `SELECT key_json FROM devices WHERE user_id = $1 AND device_id = $2`+s.d.forUpdate,
		userID, deviceID).Scan(&keys)
	if err != nil {
		return st, notFound(err)
	}
	st.DeviceKeys = keys

	// The rest in one round trip: unclaimed counts, the named one-time keys
	// already stored, and the fallback keys.
	query := `
		SELECT 'count', algorithm, '', '', COUNT(*) FROM one_time_keys
		WHERE user_id = $1 AND device_id = $2 GROUP BY algorithm
		UNION ALL
		SELECT 'fallback', algorithm, key_id, key_json, CASE WHEN used THEN 1 ELSE 0 END FROM fallback_keys
		WHERE user_id = $1 AND device_id = $2`
	params := []any{userID, deviceID}
	// The named keys already stored: one IN list of key IDs per algorithm,
	// so that each is a lookup in the unique index. A request naming many
	// algorithms (SQLite allows 500 terms in a compound SELECT) matches the
	// full names in one term instead, scanning the device's keys.
	byAlg := map[string][]string{}
	for _, full := range otkIDs {
		alg, id, _ := strings.Cut(full, ":")
		byAlg[alg] = append(byAlg[alg], id)
	}
	if len(byAlg) > maxAlgorithmTerms {
		query += `
		UNION ALL
		SELECT 'existing', algorithm, key_id, key_json, 0 FROM one_time_keys
		WHERE user_id = $1 AND device_id = $2 AND algorithm || ':' || key_id IN (` + placeholders(3, len(otkIDs)) + `)`
		params = args(params, otkIDs)
		byAlg = nil
	}
	algs := make([]string, 0, len(byAlg))
	for alg := range byAlg {
		algs = append(algs, alg)
	}
	sort.Strings(algs) // the same text for the same shape, so it stays prepared
	for _, alg := range algs {
		ids := byAlg[alg]
		query += `
		UNION ALL
		SELECT 'existing', algorithm, key_id, key_json, 0 FROM one_time_keys
		WHERE user_id = $1 AND device_id = $2 AND algorithm = ` + placeholders(len(params)+1, 1) +
			` AND key_id IN (` + placeholders(len(params)+2, len(ids)) + `)`
		params = append(params, alg)
		params = args(params, ids)
	}
	rows, err := tx.QueryContext(ctx, query, params...)
	if err != nil {
		return st, err
	}
	defer rows.Close()
	for rows.Next() {
		var kind string
		var k storage.Key
		var n int
		if err := rows.Scan(&kind, &k.Algorithm, &k.KeyID, &k.JSON, &n); err != nil {
			return st, err
		}
		switch kind {
		case "count":
			st.Counts[k.Algorithm] = n
		case "fallback":
			st.Fallback[k.Algorithm] = storage.FallbackKey{Key: k, Used: n == 1}
		case "existing":
			st.ExistingOneTimeKeys[k.FullID()] = k.JSON
		}
	}
	return st, rows.Err()
}

// insertOneTimeKeys stores keys in their order with multi-row INSERTs, so
// that ids (and so claim order) follow upload order.
func insertOneTimeKeys(ctx context.Context, tx *txn, userID, deviceID string, keys []storage.Key) error {
	const perStatement = 200 // 5 parameters a row stays far below every limit
	for len(keys) > 0 {
		n := min(len(keys), perStatement)
		var b strings.Builder
		b.WriteString(`INSERT INTO one_time_keys (user_id, device_id, algorithm, key_id, key_json) VALUES `)
		params := make([]any, 0, 2+3*n)
		params = append(params, userID, deviceID)
		for i, k := range keys[:n] {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("($1, $2, ")
			b.WriteString(placeholders(3+3*i, 3))
			b.WriteString(")")
			params = append(params, k.Algorithm, k.KeyID, string(k.JSON))
		}
		if _, err := tx.ExecContext(ctx, b.String(), params...); err != nil {
			return err
		}
		keys = keys[n:]
	}
	return nil
}

// ClaimKeys hands out one key per request, in one transaction: the oldest
// unclaimed one-time key of the algorithm, deleted by the same statement
// that returns it so no key is ever handed out twice; when none is left,
// the fallback key, which stays stored and is marked used. Requests that
// find neither are left out of the result.
//
// A claim of a single key needs no transaction around its statement: the
// statement is one by itself, and PostgreSQL is spared the round trips of
// BEGIN and COMMIT.
func (s *Store) ClaimKeys(ctx context.Context, reqs []storage.ClaimRequest) ([]storage.ClaimedKey, error) {
	var out []storage.ClaimedKey
	claim := func(q querier) error {
		out = out[:0]
		for _, r := range reqs {
			c, ok, err := s.claimKey(ctx, q, r)
			if err != nil {
				return err
			}
			if ok {
				out = append(out, c)
			}
		}
		return nil
	}
	var err error
	if len(reqs) == 1 {
		err = s.writeStatements(ctx, func(q pool) error { return claim(q) })
	} else {
		err = s.write(ctx, func(tx *txn) error { return claim(tx) })
	}
	return out, err
}

// claimKey claims one key: a one-time key, or failing that the fallback.
func (s *Store) claimKey(ctx context.Context, q querier, r storage.ClaimRequest) (storage.ClaimedKey, bool, error) {
	c := storage.ClaimedKey{UserID: r.UserID, DeviceID: r.DeviceID, Key: storage.Key{Algorithm: r.Algorithm}}
	err := q.QueryRowContext(ctx, `DELETE FROM one_time_keys WHERE id = (
		SELECT id FROM one_time_keys WHERE user_id = $1 AND device_id = $2 AND algorithm = $3
		ORDER BY id LIMIT 1`+s.d.skipLocked+`)
		RETURNING key_id, key_json`, r.UserID, r.DeviceID, r.Algorithm).Scan(&c.Key.KeyID, &c.Key.JSON)
	if err == sql.ErrNoRows {
		c.Fallback = true
		err = q.QueryRowContext(ctx, `UPDATE fallback_keys SET used = TRUE
			WHERE user_id = $1 AND device_id = $2 AND algorithm = $3
			RETURNING key_id, key_json`, r.UserID, r.DeviceID, r.Algorithm).Scan(&c.Key.KeyID, &c.Key.JSON)
		if err == sql.ErrNoRows {
			return c, false, nil
		}
	}
	return c, err == nil, err
}

// KeyCounts returns a device's unclaimed one-time keys per algorithm and the
// algorithms whose fallback key has not been handed out, in one query.
func (s *Store) KeyCounts(ctx context.Context, userID, deviceID string) (map[string]int, []string, error) {
	rows, err := s.q.QueryContext(ctx, `
		SELECT 'otk', algorithm, COUNT(*) FROM one_time_keys WHERE user_id = $1 AND device_id = $2 GROUP BY algorithm
		UNION ALL
		SELECT 'fallback', algorithm, 0 FROM fallback_keys WHERE user_id = $1 AND device_id = $2 AND NOT used`,
		userID, deviceID)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	counts := map[string]int{}
	unused := []string{}
	for rows.Next() {
		var kind, alg string
		var n int
		if err := rows.Scan(&kind, &alg, &n); err != nil {
			return nil, nil, err
		}
		if kind == "otk" {
			counts[alg] = n
		} else {
			unused = append(unused, alg)
		}
	}
	sort.Strings(unused)
	return counts, unused, rows.Err()
}
