package sqlstore

import (
	"database/sql"
	"strconv"
	"strings"

	"github.com/keyserver/keyserver/storage"
)

// The receipts and typing of /sync, branches of syncDataQuery: the
// receipts stored in the range in the rooms the user ($1) is joined to
// (private ones only the user's), the rooms there whose typing changed in
// the range, and who is typing in those. A receipt's row carries its
// type, event and thread in one text, separated by newlines, which none
// of them holds (they are printable).

// syncJoinedRooms are the rooms the user $1 is joined to, as j: each
// branch starts from them (the index of members by state key), so that an
// initial sync reads only those rooms' receipts and typing.
const syncJoinedRooms = `room_current_state j`
const syncJoined = `j.event_type = 'm.room.member' AND j.state_key = :user AND j.membership = 'join'`

// The fragment names its parameters :user ($1) and :since ($4): its
// placeholders appear in order only within syncDataQuery.
var syncEphemeralQuery = strings.NewReplacer(":user", param(1), ":since", param(4)).Replace(`
UNION ALL
SELECT 'receipt', r.room_id, r.user_id, r.receipt_type || '` + "\n" + `' || r.event_id || '` + "\n" + `' || r.thread_id, r.ts
	FROM ` + syncJoinedRooms + ` JOIN receipts r ON r.room_id = j.room_id
	WHERE ` + syncJoined + ` AND r.pos > :since AND r.pos <= ` + syncUpTo + `
	AND (r.receipt_type <> '` + storage.ReceiptPrivate + `' OR r.user_id = :user)
UNION ALL
SELECT 'typingroom', tr.room_id, NULL, NULL, tr.pos FROM ` + syncJoinedRooms + ` JOIN typing_rooms tr ON tr.room_id = j.room_id
	WHERE ` + syncJoined + ` AND tr.pos > :since AND tr.pos <= ` + syncUpTo + `
UNION ALL
SELECT 'typing', t.room_id, t.user_id, NULL, t.expires_ts
	FROM ` + syncJoinedRooms + ` JOIN typing_rooms tr ON tr.room_id = j.room_id JOIN typing t ON t.room_id = tr.room_id
	WHERE ` + syncJoined + ` AND tr.pos > :since AND tr.pos <= ` + syncUpTo)

// param is the placeholder $n.
func param(n int) string { return "$" + strconv.Itoa(n) }

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
