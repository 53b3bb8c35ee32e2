package sqlstore

import (
	"context"
	"encoding/json"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"

	"github.com/keyserver/keyserver/storage"
)

// searchedTypes are the event types indexed, with the content key each
// is found by.
var searchedTypes = map[string]string{
	"m.room.message": storage.SearchKeyBody,
	"m.room.name":    storage.SearchKeyName,
	"m.room.topic":   storage.SearchKeyTopic,
}

// IndexRoomEvents implements storage.SearchIndex. The daemons sharing a
// database take turns (the position's row is locked), so each event is
// indexed once.
func (s *Store) IndexRoomEvents(ctx context.Context, limit int) (n int, err error) {
	defer named("IndexRoomEvents", &err)
	err = s.write(ctx, func(tx *txn) error {
		n = 0
		var from int64
		if err := tx.QueryRowContext(ctx, `SELECT event_nid FROM search_position WHERE id = 1`+s.d.forUpdate).Scan(&from); err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, `SELECT event_nid, room_id, event_type, event_json FROM room_events
			WHERE event_nid > $1 ORDER BY event_nid LIMIT $2`, from, limit)
		if err != nil {
			return err
		}
		type doc struct {
			nid              int64
			room, key, value string
		}
		var docs []doc
		last := from
		for rows.Next() {
			var nid int64
			var room, evType, js string
			if err := rows.Scan(&nid, &room, &evType, &js); err != nil {
				rows.Close()
				return err
			}
			n++
			last = nid
			key, ok := searchedTypes[evType]
			if !ok {
				continue
			}
			if v := contentText(js, key); v != "" {
				docs = append(docs, doc{nid, room, key, v})
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		insert := `INSERT INTO room_event_search (docid, room_id, key, value) VALUES ($1, $2, $3, $4)`
		if s.d.name == "postgres" {
			insert = `INSERT INTO room_event_search (event_nid, room_id, key, vector) VALUES ($1, $2, $3, to_tsvector('english', $4))
				ON CONFLICT DO NOTHING`
		}
		for _, d := range docs {
			if _, err := tx.ExecContext(ctx, insert, d.nid, d.room, d.key, d.value); err != nil {
				return err
			}
		}
		if last == from {
			return nil
		}
		_, err = tx.ExecContext(ctx, `UPDATE search_position SET event_nid = $1 WHERE id = 1`, last)
		return err
	})
	return n, err
}

// contentText is the string at key ("content.body") of an event's JSON,
// "" when there is none.
func contentText(eventJSON, key string) string {
	var ev struct {
		Content map[string]json.RawMessage `json:"content"`
	}
	if json.Unmarshal([]byte(eventJSON), &ev) != nil {
		return ""
	}
	var v string
	if json.Unmarshal(ev.Content[strings.TrimPrefix(key, "content.")], &v) != nil {
		return ""
	}
	return v
}

// rankCandidates bounds the matches ranked on SQLite, which has no rank
// function: the newest this many are ranked.
const rankCandidates = 500

// SearchRoomEvents implements storage.SearchIndex.
func (s *Store) SearchRoomEvents(ctx context.Context, q storage.SearchQuery) (_ []storage.SearchHit, _ int, err error) {
	defer named("SearchRoomEvents", &err)
	if len(q.Words) == 0 || len(q.Rooms) == 0 || len(q.Keys) == 0 || q.Limit <= 0 {
		return nil, 0, nil
	}
	pg := s.d.name == "postgres"
	var match string
	if pg {
		terms := make([]string, len(q.Words))
		for i, w := range q.Words {
			terms[i] = w + ":*"
		}
		match = strings.Join(terms, " & ")
	} else {
		terms := make([]string, len(q.Words))
		for i, w := range q.Words {
			terms[i] = w + "*"
		}
		match = strings.Join(terms, " ")
	}
	params := []any{match}
	cond := func(col string, values []string, not bool) string {
		if len(values) == 0 {
			return ""
		}
		op := " IN ("
		if not {
			op = " NOT IN ("
		}
		c := " AND " + col + op + placeholders(len(params)+1, len(values)) + ")"
		for _, v := range values {
			params = append(params, v)
		}
		return c
	}
	from := `FROM room_event_search s JOIN room_events e ON e.event_nid = s.docid WHERE room_event_search MATCH $1`
	rank := `0`
	if pg {
		from = `FROM room_event_search s JOIN room_events e ON e.event_nid = s.event_nid WHERE s.vector @@ to_tsquery('english', $1)`
		rank = `ts_rank(s.vector, to_tsquery('english', $1))`
	}
	where := cond("s.room_id", q.Rooms, false) + cond("s.key", q.Keys, false) +
		cond("e.sender", q.Senders, false) + cond("e.sender", q.NotSenders, true) +
		cond("e.event_type", q.Types, false) + cond("e.event_type", q.NotTypes, true) +
		` AND e.pos IS NOT NULL AND e.outlier = 0 AND e.rejected = 0 AND e.soft_failed = 0`

	var total int
	if err := s.q.QueryRowContext(ctx, `SELECT COUNT(*) `+from+where, params...).Scan(&total); err != nil {
		return nil, 0, err
	}
	order := ` ORDER BY e.pos DESC LIMIT ` + strconv.Itoa(q.Limit)
	switch {
	case q.ByRank && pg:
		order = ` ORDER BY 5 DESC, e.pos DESC LIMIT ` + strconv.Itoa(q.Limit) + ` OFFSET ` + strconv.Itoa(q.Offset)
	case q.ByRank:
		order = ` ORDER BY e.pos DESC LIMIT ` + strconv.Itoa(rankCandidates)
	case q.Before != 0:
		params = append(params, int64(q.Before))
		where += ` AND e.pos < $` + strconv.Itoa(len(params))
	}
	valueCol := `''`
	if !pg {
		valueCol = `s.value`
	}
	rows, err := s.q.QueryContext(ctx, `SELECT e.event_id, e.room_id, e.sender, e.pos, `+rank+`, `+valueCol+` `+from+where+order, params...)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var hits []storage.SearchHit
	for rows.Next() {
		var h storage.SearchHit
		var value string
		if err := rows.Scan(&h.EventID, &h.RoomID, &h.Sender, &h.Pos, &h.Rank, &value); err != nil {
			return nil, 0, err
		}
		if q.ByRank && !pg {
			h.Rank = textRank(value, q.Words)
		}
		hits = append(hits, h)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, err
	}
	if q.ByRank && !pg {
		sort.SliceStable(hits, func(i, j int) bool { return hits[i].Rank > hits[j].Rank })
		if q.Offset >= len(hits) {
			return nil, total, nil
		}
		hits = hits[q.Offset:min(len(hits), q.Offset+q.Limit)]
	}
	return hits, total, nil
}

// textRank is the relevance of text to words where the database has no
// rank function: how often the words start a word of the text, for
// shorter texts more.
func textRank(text string, words []string) float64 {
	tokens := strings.FieldsFunc(strings.ToLower(text), func(r rune) bool { return !isWordRune(r) })
	if len(tokens) == 0 {
		return 0
	}
	hits := 0
	for _, t := range tokens {
		for _, w := range words {
			if strings.HasPrefix(t, w) {
				hits++
				break
			}
		}
	}
	return float64(hits) / math.Log2(float64(len(tokens))+1)
}

func isWordRune(r rune) bool { return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) }
