package sqlstore

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"sort"
	"strings"

	"github.com/keyserver/keyserver/storage"
)

// UploadKeys runs one key upload as a single transaction. It reads the
// device's key state (holding the device's key lock, so uploads for one
// device queue behind each other, see lockDeviceKeys), lets decide choose
// what to write from it, and writes that. decide's error aborts the upload
// with nothing written. oneTimeKeyIDs are the full IDs ("alg:id") the
// upload names, so that the state includes any of them already stored.
//
// Almost every upload brings only new one-time keys, so a first attempt
// assumes that none is stored and does not look them up: PostgreSQL plans
// that lookup as a scan of all the device's keys, since it cannot know
// that a user and a device ID together pick out few rows. The unique index
// still sees every key stored before; if one was, or if decide refused
// what it was shown, the upload runs again with the named keys looked up,
// and that second run's answer stands. With no key stored before, both runs
// show decide the same state, so the first run's answer is the same.
func (s *Store) UploadKeys(ctx context.Context, userID, deviceID string, oneTimeKeyIDs []string,
	decide func(storage.KeyState) (storage.KeyWrite, error)) (_ storage.UploadResult, err error) {
	defer named("UploadKeys", &err)
	lockRow := false
	for {
		res, err := s.uploadKeysLocked(ctx, userID, deviceID, oneTimeKeyIDs, decide, lockRow)
		if errors.Is(err, errDeviceKeysChange) && !lockRow {
			lockRow = true // rare: once in a device's life
			continue
		}
		return res, err
	}
}

// uploadKeysLocked is UploadKeys with the device's row locked too when
// lockRow (see lockDeviceKeys).
func (s *Store) uploadKeysLocked(ctx context.Context, userID, deviceID string, oneTimeKeyIDs []string,
	decide func(storage.KeyState) (storage.KeyWrite, error), lockRow bool) (storage.UploadResult, error) {
	if len(oneTimeKeyIDs) > 0 {
		res, err := s.uploadKeys(ctx, userID, deviceID, nil, decide, true, lockRow)
		if !errors.Is(err, errNotAllNew) {
			return res, err
		}
	}
	return s.uploadKeys(ctx, userID, deviceID, oneTimeKeyIDs, decide, false, lockRow)
}

// errNotAllNew ends an upload's first attempt when one of its one-time keys
// was stored before, or when decide refused the upload without seeing them.
var errNotAllNew = errors.New("an uploaded one-time key may be stored already")

// errDeviceKeysChange ends an upload that changes the device's keys
// without holding the device's row lock: it runs again, taking it first.
var errDeviceKeysChange = errors.New("the upload changes the device keys")

func (s *Store) uploadKeys(ctx context.Context, userID, deviceID string, oneTimeKeyIDs []string,
	decide func(storage.KeyState) (storage.KeyWrite, error), assumeNew, lockRow bool) (storage.UploadResult, error) {
	var res storage.UploadResult
	ch, err := s.writeChange(ctx, func(tx *txn) error {
		res = storage.UploadResult{}
		state, err := s.keyState(ctx, tx, userID, deviceID, oneTimeKeyIDs, lockRow)
		if err != nil {
			return err
		}
		w, err := decide(state)
		if err != nil {
			if assumeNew {
				return errNotAllNew
			}
			return err
		}
		if w.DeviceKeys != nil && !bytes.Equal(w.DeviceKeys, state.DeviceKeys) {
			if s.d.lockDeviceKeys != "" && !lockRow {
				return errDeviceKeysChange
			}
			if _, err := tx.ExecContext(ctx, `UPDATE devices SET key_json = $1 WHERE user_id = $2 AND device_id = $3`,
				string(w.DeviceKeys), userID, deviceID); err != nil {
				return err
			}
			if res.Pos, err = s.recordLocalChange(ctx, tx, userID, deviceID, false); err != nil {
				return err
			}
		}
		if stored, err := s.insertOneTimeKeys(ctx, tx, userID, deviceID, w.OneTimeKeys); err != nil {
			return err
		} else if stored != len(w.OneTimeKeys) {
			// Keys looked up were left out of w: only the first attempt
			// can meet one stored already.
			return errNotAllNew
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
	res.Change = ch
	return res, err
}

// maxAlgorithmTerms is how many algorithms an upload may name before the
// lookup of its existing keys stops using one indexed term per algorithm.
const maxAlgorithmTerms = 8

func (s *Store) keyState(ctx context.Context, tx *txn, userID, deviceID string, otkIDs []string, lockRow bool) (storage.KeyState, error) {
	st := storage.KeyState{
		ExistingOneTimeKeys: map[string][]byte{},
		Counts:              map[string]int{},
		Fallback:            map[string]storage.FallbackKey{},
	}
	if lockRow {
		var one int
		err := tx.QueryRowContext(ctx, `SELECT 1 FROM devices WHERE user_id = $1 AND device_id = $2`+s.d.forUpdate,
			userID, deviceID).Scan(&one)
		if err != nil {
			return st, notFound(err)
		}
	}
	if err := s.lockDeviceKeys(ctx, tx, userID, []string{deviceID}); err != nil {
		return st, err
	}
	// All in one round trip, read after the lock is held: the device's
	// keys (its row is there, with 1, while the device exists), unclaimed
	// counts, the named one-time keys already stored, and the fallback keys.
	query := `
		SELECT 'device', '', '', key_json, 1 FROM devices WHERE user_id = $1 AND device_id = $2
		UNION ALL
		SELECT 'count', algorithm, '', '', unclaimed FROM one_time_key_counts
		WHERE user_id = $1 AND device_id = $2 AND unclaimed > 0
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
	device := false
	for rows.Next() {
		var kind string
		var k storage.Key
		var n int
		if err := rows.Scan(&kind, &k.Algorithm, &k.KeyID, &k.JSON, &n); err != nil {
			return st, err
		}
		switch kind {
		case "device":
			device, st.DeviceKeys = true, k.JSON
		case "count":
			st.Counts[k.Algorithm] = n
		case "fallback":
			st.Fallback[k.Algorithm] = storage.FallbackKey{Key: k, Used: n == 1}
		case "existing":
			st.ExistingOneTimeKeys[k.FullID()] = k.JSON
		}
	}
	if err := rows.Err(); err != nil {
		return st, err
	}
	if !device {
		return st, storage.ErrNotFound
	}
	return st, nil
}

// lockDeviceKeys takes the key locks of the devices (in the order given)
// until the transaction ends. Every upload takes its device's lock before
// it reads the device's counts and keys, so that it reads them only once
// the upload before it has committed: the cap of one-time keys holds
// across daemons sharing the database. On PostgreSQL it is an advisory
// lock, which writes nothing: locking the device's row instead (SELECT ...
// FOR UPDATE) writes the lock into the row, with a WAL record and a dirty
// page, on every upload. SQLite has one writer at a time and needs none.
//
// The rare upload that changes the device's keys, and the deletion of
// devices, lock the devices' rows first and then take these locks, in
// that order, so that neither deadlocks with the other or with an upload
// of one-time keys (which takes no row lock of the devices table). A
// deletion thus waits for the uploads running, and uploads after it find
// the device gone: none stores keys for a deleted device.
func (s *Store) lockDeviceKeys(ctx context.Context, tx *txn, userID string, deviceIDs []string) error {
	if s.d.lockDeviceKeys == "" {
		return nil
	}
	for _, id := range deviceIDs {
		if _, err := tx.ExecContext(ctx, s.d.lockDeviceKeys, userID, id); err != nil {
			return err
		}
	}
	return nil
}

// insertOneTimeKeys stores keys in their order with multi-row INSERTs, so
// that ids (and so claim order) follow upload order, and adds them to the
// device's counts: on PostgreSQL in the same statement as the last INSERT.
// A key already stored is left as it is, and not counted in the number of
// keys stored that it returns.
func (s *Store) insertOneTimeKeys(ctx context.Context, tx *txn, userID, deviceID string, keys []storage.Key) (int, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	all, stored := keys, 0
	const perStatement = 200 // 5 parameters a row stays far below every limit
	for len(keys) > 0 {
		n := min(len(keys), perStatement)
		var b strings.Builder
		last := n == len(keys) && s.d.writingCTEs
		if last {
			b.WriteString(`WITH stored AS (`)
		}
		b.WriteString(`INSERT INTO one_time_keys (user_id, device_id, algorithm, key_id, key_json) VALUES `)
		params := make([]any, 0, 2+3*n+4)
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
		b.WriteString(` ON CONFLICT DO NOTHING`)
		keys = keys[n:]
		if last {
			count, countParams := countKeysQuery(all, len(params)+1)
			b.WriteString(` RETURNING 1), counted AS (`)
			b.WriteString(count)
			b.WriteString(`) SELECT COUNT(*) FROM stored`)
			params = append(params, countParams...)
			var inserted int
			if err := tx.QueryRowContext(ctx, b.String(), params...).Scan(&inserted); err != nil {
				return 0, err
			}
			return stored + inserted, nil
		}
		r, err := tx.ExecContext(ctx, b.String(), params...)
		if err != nil {
			return 0, err
		}
		inserted, err := r.RowsAffected()
		if err != nil {
			return 0, err
		}
		stored += int(inserted)
	}
	count, countParams := countKeysQuery(all, 3)
	_, err := tx.ExecContext(ctx, count, append([]any{userID, deviceID}, countParams...)...)
	return stored, err
}

// countKeysQuery adds keys to their device's counts, one row per
// algorithm. Its parameters are $1 user, $2 device, and from $from on the
// (algorithm, number) pairs it returns.
func countKeysQuery(keys []storage.Key, from int) (string, []any) {
	var algs []string
	perAlg := map[string]int{}
	for _, k := range keys {
		if perAlg[k.Algorithm] == 0 {
			algs = append(algs, k.Algorithm)
		}
		perAlg[k.Algorithm]++
	}
	var b strings.Builder
	b.WriteString(`INSERT INTO one_time_key_counts (user_id, device_id, algorithm, unclaimed) VALUES `)
	var params []any
	for i, alg := range algs {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("($1, $2, ")
		b.WriteString(placeholders(from+2*i, 2))
		b.WriteString(")")
		params = append(params, alg, perAlg[alg])
	}
	b.WriteString(` ON CONFLICT (user_id, device_id, algorithm)
		DO UPDATE SET unclaimed = one_time_key_counts.unclaimed + excluded.unclaimed`)
	return b.String(), params
}

// ClaimKeys hands out one key per request, in one transaction: the oldest
// unclaimed one-time key of the algorithm, deleted by the same statement
// that returns it so no key is ever handed out twice; when none is left,
// the fallback key, which stays stored and is marked used. Requests that
// find neither are left out of the result. Callers order the requests by
// user and device, so that concurrent claims lock count rows in one order.
//
// A claim of a single key needs no transaction around its statement: the
// statement is one by itself, count included, and PostgreSQL is spared the
// round trips of BEGIN and COMMIT.
func (s *Store) ClaimKeys(ctx context.Context, reqs []storage.ClaimRequest) (_ []storage.ClaimedKey, err error) {
	defer named("ClaimKeys", &err)
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
	if len(reqs) == 1 {
		err = s.writeStatements(ctx, func(q querier) error { return claim(q) })
	} else {
		err = s.write(ctx, func(tx *txn) error { return claim(tx) })
	}
	return out, err
}

// claimOneTimeKey deletes and returns the device's oldest key of the
// algorithm. Its parameters are user, device and algorithm.
func claimOneTimeKey(d dialect) string {
	return `DELETE FROM one_time_keys WHERE id = (` + d.oldestKey + `)
		RETURNING key_id, key_json`
}

// uncountClaimed takes a claimed key off its device's count. On SQLite a
// trigger does it.
const uncountClaimed = `UPDATE one_time_key_counts SET unclaimed = unclaimed - 1
		WHERE user_id = $1 AND device_id = $2 AND algorithm = $3`

// claimKey claims one key: a one-time key, or failing that the fallback.
func (s *Store) claimKey(ctx context.Context, q querier, r storage.ClaimRequest) (storage.ClaimedKey, bool, error) {
	c := storage.ClaimedKey{UserID: r.UserID, DeviceID: r.DeviceID, Key: storage.Key{Algorithm: r.Algorithm}}
	claim := claimOneTimeKey(s.d)
	if s.d.writingCTEs {
		claim = `WITH claimed AS (` + claim + `), counted AS (` + uncountClaimed +
			` AND EXISTS (SELECT 1 FROM claimed)) SELECT key_id, key_json FROM claimed`
	}
	err := q.QueryRowContext(ctx, claim, r.UserID, r.DeviceID, r.Algorithm).Scan(&c.Key.KeyID, &c.Key.JSON)
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
