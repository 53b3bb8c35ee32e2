package sqlstore

import (
	"database/sql"
	"strings"

	"github.com/keyserver/keyserver/storage"
)

// The receipts and typing of /sync, branches of syncDataQuery: the
// receipts stored in the range in the rooms the user ($1) is joined to
// (private ones only the user's), the rooms there whose typing changed in
// the range, and who is typing in those. A receipt's row carries its
// type, event and thread in one text, separated by newlines, which none
// of them holds (they are printable).

// syncJoined is true when the user $1 is joined to the room in column col.
const syncJoined = `EXISTS (SELECT 1 FROM room_current_state j WHERE j.room_id = %s
	AND j.event_type = 'm.room.member' AND j.state_key = $1 AND j.membership = 'join')`

var syncEphemeralQuery = `
UNION ALL
SELECT 'receipt', r.room_id, r.user_id, r.receipt_type || '` + "\n" + `' || r.event_id || '` + "\n" + `' || r.thread_id, r.ts
	FROM receipts r WHERE r.pos > $4 AND r.pos <= ` + syncUpTo + `
	AND (r.receipt_type <> '` + storage.ReceiptPrivate + `' OR r.user_id = $1)
	AND ` + strings.ReplaceAll(syncJoined, "%s", "r.room_id") + `
UNION ALL
SELECT 'typingroom', tr.room_id, NULL, NULL, tr.pos FROM typing_rooms tr
	WHERE tr.pos > $4 AND tr.pos <= ` + syncUpTo + ` AND ` + strings.ReplaceAll(syncJoined, "%s", "tr.room_id") + `
UNION ALL
SELECT 'typing', t.room_id, t.user_id, NULL, t.expires_ts FROM typing t JOIN typing_rooms tr ON tr.room_id = t.room_id
	WHERE tr.pos > $4 AND tr.pos <= ` + syncUpTo + ` AND ` + strings.ReplaceAll(syncJoined, "%s", "t.room_id")

// syncEphemeralRow reads a row of syncEphemeralQuery into d.
func syncEphemeralRow(d *storage.SyncData, kind string, a, b, c sql.NullString, n int64) {
	switch kind {
	case "receipt":
		parts := strings.SplitN(c.String, "\n", 3)
		if len(parts) != 3 {
			return
		}
		d.Receipts = append(d.Receipts, storage.Receipt{RoomID: a.String, UserID: b.String,
			Type: parts[0], EventID: parts[1], ThreadID: parts[2], TS: n})
	case "typingroom":
		d.TypingRooms = append(d.TypingRooms, a.String)
	case "typing":
		d.Typing = append(d.Typing, storage.TypingUser{RoomID: a.String, UserID: b.String, ExpiresTS: n})
	}
}
