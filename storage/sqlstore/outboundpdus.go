package sqlstore

import (
	"context"
	"slices"
	"strconv"
	"strings"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/storage"
)

// The outbound PDU queue (table outbound_pdus, migration 16): our room
// events waiting for the other servers of their rooms. The device-list
// sender (package federationsender, its PDUQueue) delivers them in the
// transactions of its EDUs.

// txQueueRoomPDUs queues events of a room for the other servers in it, in
// the caller's transaction, after the events and the room's current state
// are written there: an event is never committed without its delivery
// being due, and a restart loses nothing.
//
// Each event goes to every server with a member whose membership is
// "join" among members (those of the room's current state in tx, from
// txRoomMembers), and an m.room.member event but an invite also to the
// server of its state_key, so that a user who left, was kicked or banned
// hears of it. Never to this server, nor to the servers in skip (the origin of an event received from another server,
// which has it already). events must be stored in room_events (in tx or
// before); each destination's queue takes them in the order given. An
// event already queued for a destination is not queued twice. It reports
// whether anything was queued: the caller pokes the sender after the
// commit (storage.RoomWriteResult.PDUsQueued).
func (s *Store) txQueueRoomPDUs(ctx context.Context, tx *txn, members memberList, events []storage.RoomEvent, skip []string) (bool, error) {
	if len(events) == 0 {
		return false, nil
	}
	joined := slices.DeleteFunc(slices.Clone(members.servers), func(server string) bool { return slices.Contains(skip, server) })
	queued := false
	for _, ev := range events {
		dests := slices.Clone(joined)
		// An invite reached the invitee's server through /invite: it is
		// sent again only to servers in the room.
		if ev.Type == "m.room.member" && ev.StateKey != nil && ev.Membership != storage.MembershipInvite {
			if server := matrixid.Server(*ev.StateKey); server != "" && server != s.serverName && !slices.Contains(skip, server) && !slices.Contains(joined, server) {
				dests = append(dests, server)
			}
		}
		if len(dests) == 0 {
			continue
		}
		slices.Sort(dests)
		var nid int64
		if err := tx.QueryRowContext(ctx, `SELECT event_nid FROM room_events WHERE event_id = $1`, ev.EventID).Scan(&nid); err != nil {
			return false, notFound(err)
		}
		// One statement per event, up to 500 destinations at a time.
		for len(dests) > 0 {
			n := min(len(dests), 500)
			// SQLite numbers parameters in the order they first appear:
			// each row has its own.
			var b strings.Builder
			var params []any
			for i, d := range dests[:n] {
				if i > 0 {
					b.WriteString(", ")
				}
				b.WriteString("($" + strconv.Itoa(len(params)+1) + ", $" + strconv.Itoa(len(params)+2) + ")")
				params = append(params, d, nid)
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO outbound_pdus (destination, event_nid) VALUES `+b.String()+`
				ON CONFLICT DO NOTHING`, params...); err != nil {
				return false, err
			}
			dests = dests[n:]
		}
		queued = true
	}
	return queued, nil
}

// PDUQueueDepth counts the PDUs waiting, once per destination.
func (s *Store) PDUQueueDepth(ctx context.Context) (_ int, err error) {
	defer named("PDUQueueDepth", &err)
	var n int
	err = s.q.QueryRowContext(ctx, `SELECT COUNT(*) FROM outbound_pdus`).Scan(&n)
	return n, err
}

// PDUDestinations lists the servers with PDUs waiting.
func (s *Store) PDUDestinations(ctx context.Context) (_ []string, err error) {
	defer named("PDUDestinations", &err)
	return s.userList(ctx, `SELECT DISTINCT destination FROM outbound_pdus`)
}

// PendingPDUs returns up to limit PDUs waiting for a destination, oldest
// first.
func (s *Store) PendingPDUs(ctx context.Context, destination string, limit int) (_ []storage.OutboundPDU, err error) {
	defer named("PendingPDUs", &err)
	rows, err := s.q.QueryContext(ctx, `SELECT o.id, e.event_id, e.event_json
		FROM outbound_pdus o JOIN room_events e ON e.event_nid = o.event_nid
		WHERE o.destination = $1 ORDER BY o.id LIMIT $2`, destination, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.OutboundPDU
	for rows.Next() {
		p := storage.OutboundPDU{Destination: destination}
		var js string
		if err := rows.Scan(&p.ID, &p.EventID, &js); err != nil {
			return nil, err
		}
		p.JSON = []byte(js)
		out = append(out, p)
	}
	return out, rows.Err()
}

// MarkPDUsSent removes delivered PDUs from a destination's queue.
func (s *Store) MarkPDUsSent(ctx context.Context, destination string, sent []storage.OutboundPDU) (err error) {
	defer named("MarkPDUsSent", &err)
	if len(sent) == 0 {
		return nil
	}
	return s.write(ctx, func(tx *txn) error {
		for len(sent) > 0 {
			n := min(len(sent), 500)
			params := []any{destination}
			for _, p := range sent[:n] {
				params = append(params, p.ID)
			}
			if _, err := tx.ExecContext(ctx, `DELETE FROM outbound_pdus WHERE destination = $1 AND id IN (`+placeholders(2, n)+`)`,
				params...); err != nil {
				return err
			}
			sent = sent[n:]
		}
		return nil
	})
}
