package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"strings"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/storage"
)

// UserDirectoryCandidates returns the users searcher may find in the user
// directory: the users joined to a room searcher is joined to or to a
// room of the public room directory, with the display name and avatar of
// their member event there; and, with allLocal, the local users whose ID
// or display name contains term (lower case), with their profile. A user
// may come more than once (from several rooms).
func (s *Store) UserDirectoryCandidates(ctx context.Context, searcher, term string, allLocal bool) (_ []storage.DirectoryUser, err error) {
	defer named("UserDirectoryCandidates", &err)
	rows, err := s.q.QueryContext(ctx, `SELECT c.state_key, e.event_json
		FROM room_current_state c JOIN room_events e ON e.event_nid = c.event_nid
		WHERE c.event_type = 'm.room.member' AND c.membership = 'join' AND c.room_id IN (
			SELECT m.room_id FROM room_current_state m
				WHERE m.event_type = 'm.room.member' AND m.state_key = $1 AND m.membership = 'join'
			UNION SELECT r.room_id FROM rooms r WHERE r.published = 1)`, searcher)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.DirectoryUser
	for rows.Next() {
		var u storage.DirectoryUser
		var js string
		if err := rows.Scan(&u.UserID, &js); err != nil {
			return nil, err
		}
		var ev struct {
			Content struct {
				DisplayName any `json:"displayname"`
				AvatarURL   any `json:"avatar_url"`
			} `json:"content"`
		}
		if json.Unmarshal([]byte(js), &ev) == nil {
			// Other servers' member events may hold anything there.
			u.DisplayName, _ = ev.Content.DisplayName.(string)
			u.AvatarURL, _ = ev.Content.AvatarURL.(string)
		}
		out = append(out, u)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if !allLocal {
		return out, nil
	}
	pattern := "%" + likeEscaper.Replace(strings.ToLower(term)) + "%"
	locals, err := s.q.QueryContext(ctx, `SELECT a.user_id, p.displayname, p.avatar_url
		FROM accounts a LEFT JOIN profiles p ON p.user_id = a.user_id
		WHERE a.deactivated_ts = 0 AND (LOWER(a.user_id) LIKE $1 ESCAPE '\' OR LOWER(p.displayname) LIKE $1 ESCAPE '\')`, pattern)
	if err != nil {
		return nil, err
	}
	defer locals.Close()
	for locals.Next() {
		var u storage.DirectoryUser
		var name, avatar sql.NullString
		if err := locals.Scan(&u.UserID, &name, &avatar); err != nil {
			return nil, err
		}
		u.DisplayName, u.AvatarURL = name.String, avatar.String
		if !name.Valid { // no profile yet: the default name
			u.DisplayName = matrixid.Localpart(u.UserID)
		}
		out = append(out, u)
	}
	return out, locals.Err()
}

// likeEscaper escapes LIKE's wildcards (and its escape character) in a
// search term.
var likeEscaper = strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
