package pushrules

import (
	"context"
	"encoding/json"
	"strings"
)

// JoinedUpgradedRoom copies a user's rules of a room to the room that
// replaced it, when the user joins the new room (package roomserver calls
// it, the upgrading user included).
func (s *Service) JoinedUpgradedRoom(ctx context.Context, userID, oldRoomID, newRoomID string) error {
	return s.CopyRoomRules(ctx, userID, oldRoomID, newRoomID)
}

// CopyRoomRules gives a user, for newRoomID, the enabled rules they made
// for oldRoomID, as Synapse copies them on a room upgrade: the room rule
// of the old room, and every override, content, sender and underride rule
// with a condition on the old room's ID, under a rule ID and condition
// naming the new room instead. A rule the user already has under that ID
// is left as it is.
func (s *Service) CopyRoomRules(ctx context.Context, userID, oldRoomID, newRoomID string) error {
	rs, err := s.load(ctx, userID)
	if err != nil {
		return err
	}
	type copied struct {
		kind string
		rule Rule
	}
	var copies []copied
	for _, kind := range Kinds {
		for _, r := range *rs.list(kind) {
			if r.Default || !r.Enabled {
				continue
			}
			if kind == KindRoom && r.RuleID == oldRoomID {
				c := r
				c.RuleID = newRoomID
				copies = append(copies, copied{kind, c})
				continue
			}
			if conds, ok := onRoom(r.Conditions, oldRoomID, newRoomID); ok {
				c := r
				c.RuleID = strings.ReplaceAll(r.RuleID, oldRoomID, newRoomID)
				c.Conditions = conds
				copies = append(copies, copied{kind, c})
			}
		}
	}
	if len(copies) == 0 {
		return nil
	}
	return s.update(ctx, userID, func(rs *Ruleset) error {
		for _, c := range copies {
			list := rs.list(c.kind)
			if find(*list, c.rule.RuleID) >= 0 {
				continue
			}
			pos, _ := position(*list, c.kind, "", "") // no anchor: cannot fail
			*list = append((*list)[:pos:pos], append([]Rule{c.rule}, (*list)[pos:]...)...)
		}
		return nil
	})
}

// onRoom reports whether conditions hold one matching the room ID old
// exactly (an event_match on room_id with old as its pattern), and
// returns them with old replaced by new in such conditions.
func onRoom(conditions []json.RawMessage, old, new string) ([]json.RawMessage, bool) {
	found := false
	out := make([]json.RawMessage, len(conditions))
	for i, raw := range conditions {
		out[i] = raw
		var c map[string]any
		if json.Unmarshal(raw, &c) != nil || c["key"] != "room_id" || c["pattern"] != old {
			continue
		}
		c["pattern"] = new
		b, err := json.Marshal(c)
		if err != nil {
			continue
		}
		out[i], found = b, true
	}
	return out, found
}
