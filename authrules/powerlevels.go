package authrules

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// level is a user's power level: an integer, or infinite for the room's
// creators, which is greater than every integer.
type level struct {
	n        int64
	infinite bool
}

var infiniteLevel = level{infinite: true}

// atLeast reports l >= n.
func (l level) atLeast(n int64) bool { return l.infinite || l.n >= n }

// below reports l < m.
func (l level) below(m level) bool {
	switch {
	case l.infinite:
		return false
	case m.infinite:
		return true
	default:
		return l.n < m.n
	}
}

func (l level) String() string {
	if l.infinite {
		return "infinite (creator)"
	}
	return strconv.FormatInt(l.n, 10)
}

// The levels of a power levels event's content, as present in it: a key
// that is absent is absent from these maps, the accessors give its default.
type levels struct {
	scalars       map[string]int64 // users_default, events_default, state_default, ban, redact, kick, invite
	users         map[string]int64
	events        map[string]int64
	notifications map[string]int64
}

// scalarKeys are the single-integer levels, with their defaults when absent.
var scalarKeys = []struct {
	key string
	def int64
}{
	{"users_default", 0},
	{"events_default", 0},
	{"state_default", 50},
	{"ban", 50},
	{"redact", 50},
	{"kick", 50},
	{"invite", 0},
}

// parseLevels reads and validates a power levels event's content (rules
// 10.1 to 10.3): every level must be a JSON integer, events and
// notifications objects of integers, users an object of valid user IDs to
// integers. The error names the rule that failed.
func parseLevels(content []byte) (*levels, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(content, &fields); err != nil || fields == nil {
		return nil, &contentError{"10", "content is not a JSON object"}
	}
	l := &levels{scalars: map[string]int64{}}
	// Rule 10.1: the single levels are integers.
	for _, sk := range scalarKeys {
		raw, ok := fields[sk.key]
		if !ok {
			continue
		}
		n, err := parseInteger(raw)
		if err != nil {
			return nil, &contentError{"10.1", fmt.Sprintf("%s is %s, not an integer", sk.key, raw)}
		}
		l.scalars[sk.key] = n
	}
	// Rule 10.2: events and notifications map to integers.
	var err error
	if l.events, err = parseLevelMap(fields, "events", "10.2", nil); err != nil {
		return nil, err
	}
	if l.notifications, err = parseLevelMap(fields, "notifications", "10.2", nil); err != nil {
		return nil, err
	}
	// Rule 10.3: users maps valid user IDs to integers.
	if l.users, err = parseLevelMap(fields, "users", "10.3", validPowerLevelsUserID); err != nil {
		return nil, err
	}
	return l, nil
}

// parseLevelMap reads the object fields[key], whose values must be integers
// and whose keys, when validKey is set, must pass it.
func parseLevelMap(fields map[string]json.RawMessage, key, rule string, validKey func(string) bool) (map[string]int64, error) {
	out := map[string]int64{}
	raw, ok := fields[key]
	if !ok {
		return out, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return nil, &contentError{rule, fmt.Sprintf("%s is not an object", key)}
	}
	for k, v := range m {
		if validKey != nil && !validKey(k) {
			return nil, &contentError{rule, fmt.Sprintf("%s has the key %q, which is not a valid user ID", key, k)}
		}
		n, err := parseInteger(v)
		if err != nil {
			return nil, &contentError{rule, fmt.Sprintf("%s[%q] is %s, not an integer", key, k, v)}
		}
		out[k] = n
	}
	return out, nil
}

// parseInteger reads a JSON integer: no string, float, exponent, null or bool.
func parseInteger(raw json.RawMessage) (int64, error) {
	s := strings.TrimSpace(string(raw))
	if s == "" || (s[0] != '-' && (s[0] < '0' || s[0] > '9')) {
		return 0, fmt.Errorf("not a number")
	}
	return strconv.ParseInt(s, 10, 64)
}

// validPowerLevelsUserID is the user ID check of the users keys: a "@"
// sigil and a domain after a ":", as the servers of the federation check it.
func validPowerLevelsUserID(userID string) bool {
	if len(userID) < 2 || userID[0] != '@' {
		return false
	}
	i := strings.IndexByte(userID, ':')
	return i > 0 && i < len(userID)-1
}

// scalar gives a single level, or its default when absent. Works on nil
// (the room has no power levels event).
func (l *levels) scalar(key string) int64 {
	if l != nil {
		if n, ok := l.scalars[key]; ok {
			return n
		}
	}
	for _, sk := range scalarKeys {
		if sk.key == key {
			return sk.def
		}
	}
	panic("authrules: unknown power level key " + key)
}

func (l *levels) invite() int64 { return l.scalar("invite") }
func (l *levels) kick() int64   { return l.scalar("kick") }
func (l *levels) ban() int64    { return l.scalar("ban") }

// userLevel is the level of a user who is not a creator.
func (l *levels) userLevel(userID string) int64 {
	if l != nil {
		if n, ok := l.users[userID]; ok {
			return n
		}
	}
	return l.scalar("users_default")
}

// eventLevel is the level required to send an event of type eventType
// (rule 8): events[eventType], else state_default or events_default. With
// no power levels event, state events need 50 and others 0.
func (l *levels) eventLevel(eventType string, isState bool) int64 {
	if l != nil {
		if n, ok := l.events[eventType]; ok {
			return n
		}
	}
	if isState {
		return l.scalar("state_default")
	}
	return l.scalar("events_default")
}

// powerLevelsAllowed applies rule 10 to a power levels event whose sender
// has senderLevel in the room's current power levels.
func (st *authState) powerLevelsAllowed(senderLevel level) error {
	ev := st.ev
	// Rules 10.1 to 10.3: the new content is valid.
	next, err := parseLevels(ev.Content())
	if err != nil {
		rule := "10"
		var bad *contentError
		if errors.As(err, &bad) {
			rule = bad.rule
		}
		return notAllowed(rule, "power levels %v", err)
	}
	// Rule 10.4: creators cannot be given a power level.
	for _, creator := range st.creators {
		if _, ok := next.users[creator]; ok {
			return notAllowed("10.4", "power levels list the room creator %s in users", creator)
		}
	}
	// Rule 10.5: the first power levels event is allowed.
	if st.levelsEvent == nil {
		return nil
	}
	prev := st.levels

	// Rule 10.6: changed single levels, old and new, are at most the sender's.
	for _, sk := range scalarKeys {
		old, hadOld := prev.scalars[sk.key]
		now, hasNew := next.scalars[sk.key]
		if hadOld == hasNew && old == now {
			continue
		}
		if hadOld && !senderLevel.atLeast(old) {
			return notAllowed("10.6", "sender %s (power level %s) may not change %s from %d", ev.SenderID(), senderLevel, sk.key, old)
		}
		if hasNew && !senderLevel.atLeast(now) {
			return notAllowed("10.6", "sender %s (power level %s) may not set %s to %d", ev.SenderID(), senderLevel, sk.key, now)
		}
	}

	// Rules 10.7 and 10.8: events and notifications entries.
	for _, group := range []struct {
		name      string
		old, next map[string]int64
	}{{"events", prev.events, next.events}, {"notifications", prev.notifications, next.notifications}} {
		for _, k := range changedKeys(group.old, group.next) {
			old, hadOld := group.old[k]
			now, hasNew := group.next[k]
			if hadOld && !senderLevel.atLeast(old) {
				return notAllowed("10.7", "sender %s (power level %s) may not change %s[%q] from %d", ev.SenderID(), senderLevel, group.name, k, old)
			}
			if hasNew && !senderLevel.atLeast(now) {
				return notAllowed("10.8", "sender %s (power level %s) may not set %s[%q] to %d", ev.SenderID(), senderLevel, group.name, k, now)
			}
		}
	}

	// Rules 10.9 and 10.10: users entries.
	for _, userID := range changedKeys(prev.users, next.users) {
		old, hadOld := prev.users[userID]
		now, hasNew := next.users[userID]
		if hadOld && userID != string(ev.SenderID()) && !finiteLevel(old).below(senderLevel) {
			return notAllowed("10.9", "sender %s (power level %s) may not change the power level %d of %s", ev.SenderID(), senderLevel, old, userID)
		}
		if hasNew && !senderLevel.atLeast(now) {
			return notAllowed("10.10", "sender %s (power level %s) may not give %s the power level %d", ev.SenderID(), senderLevel, userID, now)
		}
	}
	// Rule 10.11: otherwise, allow.
	return nil
}

func finiteLevel(n int64) level { return level{n: n} }

// changedKeys lists, in order, the keys added, removed or changed between
// two level maps.
func changedKeys(old, next map[string]int64) []string {
	var keys []string
	for k, v := range old {
		if w, ok := next[k]; !ok || w != v {
			keys = append(keys, k)
		}
	}
	for k := range next {
		if _, ok := old[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}
