package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"math"
	"sort"
	"strings"

	"github.com/keyserver/keyserver/storage"
)

// A /sync answer reads every part it shows of the stream in one statement:
// one round trip, and one snapshot, whose stream_position is the answer's
// position. Positions become visible in the order they were handed out
// (see nextPos), so the snapshot holds every change up to that position
// and none after it. Each part is a branch of a UNION ALL of rows of the
// same shape: (kind, three texts, a number).

// syncUpTo is the newest position in the statement's snapshot.
const syncUpTo = `(SELECT pos FROM cur)`

// syncDataQuery's parameters: $1 user, $2 the lower bound of the
// device-list range (beyond any position for an initial sync, which has
// none), $3 device, $4 since, $5 and $6 the to-device range's lower bound
// and the most messages it returns. Each is first used in that order.
var syncDataQuery = `WITH cur AS (SELECT pos FROM stream_position WHERE id = 1)
SELECT 'pos' AS kind, CAST(NULL AS TEXT) AS a, CAST(NULL AS TEXT) AS b, CAST(NULL AS TEXT) AS c, pos AS n FROM cur
UNION ALL
SELECT 'changed', ch.user_id, NULL, NULL, 0 FROM (` + strings.ReplaceAll(changedQuery, "$3", syncUpTo) + `) ch
UNION ALL
SELECT 'left', l.user_id, NULL, NULL, 0 FROM (` + strings.ReplaceAll(leftQuery, "$3", syncUpTo) + `) l
UNION ALL
SELECT 'otk', algorithm, NULL, NULL, unclaimed FROM one_time_key_counts WHERE user_id = $1 AND device_id = $3 AND unclaimed > 0
UNION ALL
SELECT 'fallback', algorithm, NULL, NULL, 0 FROM fallback_keys WHERE user_id = $1 AND device_id = $3 AND NOT used
UNION ALL
SELECT 'data', room_id, data_type, content, pos FROM account_data WHERE user_id = $1 AND pos > $4 AND pos <= ` + syncUpTo + `
UNION ALL
SELECT 'todevice', td.sender, td.event_type, td.content, td.pos FROM (
	SELECT sender, event_type, content, pos FROM to_device_inbox
	WHERE user_id = $1 AND device_id = $3 AND pos > $5 AND pos <= ` + syncUpTo + ` ORDER BY pos LIMIT $6) td
UNION ALL
SELECT 'room', c.room_id, c.membership, e.event_id, c.pos
	FROM room_current_state c JOIN room_events e ON e.event_nid = c.event_nid
	WHERE c.event_type = 'm.room.member' AND c.state_key = $1
	AND NOT EXISTS (SELECT 1 FROM room_forgotten f WHERE f.user_id = $1 AND f.room_id = c.room_id)
UNION ALL
SELECT 'roomevents', c.room_id, NULL, NULL, 0 FROM room_current_state c
	WHERE c.event_type = 'm.room.member' AND c.state_key = $1
	AND EXISTS (SELECT 1 FROM room_events e WHERE e.room_id = c.room_id AND e.pos > $4 AND e.pos <= ` + syncUpTo + `)` + syncEphemeralQuery

// SyncData reads what the stream holds for a /sync answer in one
// statement. Each part is what the method reading it alone returns
// (DeviceListChanges, KeyCounts, AccountDataChanges, ToDeviceMessages,
// UserRoomMemberships) for the range up to the snapshot's
// position.
func (s *Store) SyncData(ctx context.Context, q storage.SyncQuery) (_ storage.SyncData, err error) {
	defer named("SyncData", &err)
	listsFrom := q.Since
	if q.Since == 0 {
		listsFrom = math.MaxInt64
	}
	rows, err := s.q.QueryContext(ctx, syncDataQuery, q.UserID, listsFrom, q.DeviceID, q.Since, q.ToDeviceAfter, q.ToDeviceLimit)
	if err != nil {
		return storage.SyncData{}, err
	}
	defer rows.Close()
	d := storage.SyncData{
		DeviceLists:            storage.DeviceListChanges{Changed: []string{}, Left: []string{}},
		OneTimeKeyCounts:       map[string]int{},
		UnusedFallbackKeyTypes: []string{},
	}
	for rows.Next() {
		var kind string
		var a, b, c sql.NullString
		var n int64
		if err := rows.Scan(&kind, &a, &b, &c, &n); err != nil {
			return storage.SyncData{}, err
		}
		switch kind {
		case "pos":
			d.Pos = storage.StreamPos(n)
		case "changed":
			d.DeviceLists.Changed = append(d.DeviceLists.Changed, a.String)
		case "left":
			d.DeviceLists.Left = append(d.DeviceLists.Left, a.String)
		case "otk":
			d.OneTimeKeyCounts[a.String] = int(n)
		case "fallback":
			d.UnusedFallbackKeyTypes = append(d.UnusedFallbackKeyTypes, a.String)
		case "data":
			d.AccountData = append(d.AccountData, storage.AccountData{RoomID: a.String, Type: b.String, Content: []byte(c.String), Pos: storage.StreamPos(n)})
		case "todevice":
			d.ToDevice = append(d.ToDevice, storage.ToDeviceMessage{Sender: a.String, Type: b.String, Content: json.RawMessage(c.String), Pos: storage.StreamPos(n)})
		case "room":
			d.RoomMemberships = append(d.RoomMemberships, storage.RoomMember{RoomID: a.String, UserID: q.UserID, Membership: b.String, EventID: c.String, Pos: storage.StreamPos(n)})
		case "roomevents":
			d.RoomsWithEvents = append(d.RoomsWithEvents, a.String)
		case "receipt", "typingroom", "typing":
			syncEphemeralRow(&d, kind, a, b, c, n)
		}
	}
	if err := rows.Err(); err != nil {
		return storage.SyncData{}, err
	}
	// The orders of the methods reading each part alone.
	sort.Strings(d.DeviceLists.Changed)
	sort.Strings(d.DeviceLists.Left)
	sort.Strings(d.UnusedFallbackKeyTypes)
	sort.SliceStable(d.AccountData, func(i, j int) bool { return d.AccountData[i].Pos < d.AccountData[j].Pos })
	sort.Slice(d.ToDevice, func(i, j int) bool { return d.ToDevice[i].Pos < d.ToDevice[j].Pos })
	sort.Strings(d.RoomsWithEvents)
	sort.Strings(d.TypingRooms)
	sort.Slice(d.RoomMemberships, func(i, j int) bool { return d.RoomMemberships[i].RoomID < d.RoomMemberships[j].RoomID })
	return d, nil
}
