package sqlstore

import (
	"context"
	"encoding/json"
	"sort"

	"github.com/keyserver/keyserver/storage"
)

// toDeviceSendRetention is how long a send's transaction ID is kept to
// spot a retry: clients and servers retry within minutes, not days.
const toDeviceSendRetention = 24 * 60 * 60 * 1000

// StoreToDevice stores a send of to-device messages in one transaction:
// each local recipient device gets the message in its inbox at a new
// stream position, and the EDUs for other servers are queued. A send
// whose transaction ID was stored already stores nothing and reports
// duplicate.
func (s *Store) StoreToDevice(ctx context.Context, send storage.ToDeviceSend) (_ storage.Change, duplicate bool, err error) {
	defer named("StoreToDevice", &err)
	ch, err := s.writeChange(ctx, func(tx *txn) error {
		duplicate = false
		if send.TxnID != "" {
			if _, err := tx.ExecContext(ctx, `DELETE FROM to_device_sends WHERE received_ts < $1`,
				send.Now-toDeviceSendRetention); err != nil {
				return err
			}
			r, err := tx.ExecContext(ctx, `INSERT INTO to_device_sends (origin, device_id, txn_id, received_ts)
				VALUES ($1, $2, $3, $4) ON CONFLICT (origin, device_id, txn_id) DO NOTHING`,
				send.Origin, send.DeviceID, send.TxnID, send.Now)
			if err != nil {
				return err
			}
			if n, err := r.RowsAffected(); err != nil || n == 0 {
				duplicate = err == nil
				return err
			}
		}
		users := make([]string, 0, len(send.Local))
		for u := range send.Local {
			users = append(users, u)
		}
		sort.Strings(users)
		var pos storage.StreamPos
		for _, u := range users {
			targets, err := s.toDeviceTargets(ctx, tx, u, send.Local[u])
			if err != nil {
				return err
			}
			if len(targets) == 0 {
				continue
			}
			if pos == 0 {
				if pos, err = s.nextPos(ctx, tx); err != nil {
					return err
				}
			}
			for _, t := range targets {
				if _, err := tx.ExecContext(ctx, `INSERT INTO to_device_inbox (user_id, device_id, pos, sender, event_type, content)
					VALUES ($1, $2, $3, $4, $5, $6)`, u, t.device, pos, send.Sender, send.Type, string(t.content)); err != nil {
					return err
				}
			}
			tx.concern(u)
		}
		for _, e := range send.Remote {
			if _, err := tx.ExecContext(ctx, `INSERT INTO outbound_to_device (destination, content) VALUES ($1, $2)`,
				e.Destination, string(e.Content)); err != nil {
				return err
			}
		}
		return nil
	})
	return ch, duplicate, err
}

type toDeviceTarget struct {
	device  string
	content json.RawMessage
}

// toDeviceTargets resolves one user's messages to the devices that exist,
// in device order: "*" reaches every device, and a device also named
// alone gets the content addressed to it.
func (s *Store) toDeviceTargets(ctx context.Context, tx *txn, userID string, byDevice map[string]json.RawMessage) ([]toDeviceTarget, error) {
	devices, err := s.txUserList(ctx, tx, `SELECT device_id FROM devices WHERE user_id = $1 ORDER BY device_id`, userID)
	if err != nil {
		return nil, err
	}
	all, hasAll := byDevice["*"]
	var out []toDeviceTarget
	for _, d := range devices {
		if c, ok := byDevice[d]; ok {
			out = append(out, toDeviceTarget{d, c})
		} else if hasAll {
			out = append(out, toDeviceTarget{d, all})
		}
	}
	return out, nil
}

// ToDeviceMessages returns up to limit messages of a device's inbox with
// a position in (after, upTo], in order.
func (s *Store) ToDeviceMessages(ctx context.Context, userID, deviceID string, after, upTo storage.StreamPos, limit int) (_ []storage.ToDeviceMessage, err error) {
	defer named("ToDeviceMessages", &err)
	rows, err := s.q.QueryContext(ctx, `SELECT pos, sender, event_type, content FROM to_device_inbox
		WHERE user_id = $1 AND device_id = $2 AND pos > $3 AND pos <= $4 ORDER BY pos LIMIT $5`,
		userID, deviceID, after, upTo, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.ToDeviceMessage
	for rows.Next() {
		var m storage.ToDeviceMessage
		var content string
		if err := rows.Scan(&m.Pos, &m.Sender, &m.Type, &content); err != nil {
			return nil, err
		}
		m.Content = json.RawMessage(content)
		out = append(out, m)
	}
	return out, rows.Err()
}

// AckToDevice deletes a device's messages at or before a position: the
// device received them. Nothing is written when there are none.
func (s *Store) AckToDevice(ctx context.Context, userID, deviceID string, upTo storage.StreamPos) (err error) {
	defer named("AckToDevice", &err)
	var n int
	if err := s.q.QueryRowContext(ctx, `SELECT COUNT(*) FROM to_device_inbox WHERE user_id = $1 AND device_id = $2 AND pos <= $3`,
		userID, deviceID, upTo).Scan(&n); err != nil || n == 0 {
		return err
	}
	return s.write(ctx, func(tx *txn) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM to_device_inbox WHERE user_id = $1 AND device_id = $2 AND pos <= $3`,
			userID, deviceID, upTo)
		return err
	})
}

// ToDeviceDestinations lists the servers with to-device EDUs waiting.
func (s *Store) ToDeviceDestinations(ctx context.Context) (_ []string, err error) {
	defer named("ToDeviceDestinations", &err)
	return s.userList(ctx, `SELECT DISTINCT destination FROM outbound_to_device`)
}

// PendingToDevice returns up to limit to-device EDUs waiting for a
// destination, oldest first.
func (s *Store) PendingToDevice(ctx context.Context, destination string, limit int) (_ []storage.OutboundEDU, err error) {
	defer named("PendingToDevice", &err)
	rows, err := s.q.QueryContext(ctx, `SELECT id, edu_type, content FROM outbound_to_device WHERE destination = $1 ORDER BY id LIMIT $2`,
		destination, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []storage.OutboundEDU
	for rows.Next() {
		e := storage.OutboundEDU{Destination: destination}
		var content string
		if err := rows.Scan(&e.ID, &e.Type, &content); err != nil {
			return nil, err
		}
		e.Content = json.RawMessage(content)
		out = append(out, e)
	}
	return out, rows.Err()
}

// MarkToDeviceSent removes delivered to-device EDUs from the queue.
func (s *Store) MarkToDeviceSent(ctx context.Context, destination string, sent []storage.OutboundEDU) (err error) {
	defer named("MarkToDeviceSent", &err)
	if len(sent) == 0 {
		return nil
	}
	return s.deleteSentEDUs(ctx, "outbound_to_device", destination, sent)
}

// deleteUserInboxes deletes the inboxes of every device of a user, in tx.
func deleteUserInboxes(ctx context.Context, tx *txn, userID string) error {
	_, err := tx.ExecContext(ctx, `DELETE FROM to_device_inbox WHERE user_id = $1`, userID)
	return err
}

// deleteSentEDUs removes delivered entries of an EDU queue (table
// outbound_to_device or outbound_presence) by their IDs, in one
// transaction; entries queued meanwhile stay.
func (s *Store) deleteSentEDUs(ctx context.Context, table, destination string, sent []storage.OutboundEDU) error {
	return s.write(ctx, func(tx *txn) error {
		for _, e := range sent {
			if _, err := tx.ExecContext(ctx, `DELETE FROM `+table+` WHERE destination = $1 AND id = $2`,
				destination, e.ID); err != nil {
				return err
			}
		}
		return nil
	})
}
