package pushrules

import (
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// Event is what the rules are evaluated against: one room event as a
// given user receives it, with the facts about the room the conditions
// ask for.
type Event struct {
	// JSON is the event (client or federation format: the keys the
	// conditions name, type, content, sender, state_key, room_id, are
	// the same in both).
	JSON map[string]any
	// UserDisplayName is the receiving user's display name in the room
	// ("" when none: contains_display_name never matches).
	UserDisplayName string
	// MemberCount is the number of users joined to the room.
	MemberCount int
	// SenderPowerLevel is the sender's power level in the room.
	SenderPowerLevel int
	// NotificationLevels are the power levels the room requires to
	// notify (power_levels' notifications: "room" defaults to 50).
	NotificationLevels map[string]int
}

// Outcome is what the first matching enabled rule says of an event.
type Outcome struct {
	// RuleID is the rule that matched ("" when none did).
	RuleID string
	// Notify: the event notifies the user (the actions hold notify or
	// the legacy coalesce).
	Notify bool
	// Tweaks are the rule's set_tweak actions: "highlight" (true when
	// the tweak is given without a value), "sound", and any other.
	Tweaks map[string]any
}

// Highlight reports whether the outcome highlights the event.
func (o Outcome) Highlight() bool {
	h, _ := o.Tweaks["highlight"].(bool)
	return o.Notify && h
}

// Ruleset returns the user's rules as evaluated: the defaults merged with
// the user's changes.
func (s *Service) Ruleset(ctx context.Context, userID string) (Ruleset, error) {
	return s.load(ctx, userID)
}

// Evaluate runs a user's rules against an event: the kinds in order
// (override, content, room, sender, underride), each's rules by priority,
// and the first enabled rule whose conditions all hold decides. A rule
// with a condition of an unknown kind does not match (as the spec says).
// userID is the receiving user, whose own events are not evaluated by
// callers.
func Evaluate(rs Ruleset, ev Event) Outcome {
	for _, kind := range Kinds {
		for _, r := range *rs.list(kind) {
			if r.Enabled && matches(kind, r, ev) {
				return outcome(r)
			}
		}
	}
	return Outcome{}
}

func matches(kind string, r Rule, ev Event) bool {
	switch kind {
	case KindContent:
		if r.Pattern == nil {
			return false
		}
		body, ok := lookup(ev.JSON, "content.body")
		s, isStr := body.(string)
		return ok && isStr && globMatch(*r.Pattern, s, true)
	case KindRoom:
		room, _ := ev.JSON["room_id"].(string)
		return room == r.RuleID
	case KindSender:
		sender, _ := ev.JSON["sender"].(string)
		return sender == r.RuleID
	}
	for _, c := range r.Conditions {
		if !conditionHolds(c, ev) {
			return false
		}
	}
	return true
}

type condition struct {
	Kind    string          `json:"kind"`
	Key     string          `json:"key"`
	Pattern *string         `json:"pattern"`
	Value   json.RawMessage `json:"value"`
	Is      string          `json:"is"`
}

func conditionHolds(raw json.RawMessage, ev Event) bool {
	var c condition
	if json.Unmarshal(raw, &c) != nil {
		return false
	}
	switch c.Kind {
	case "event_match":
		if c.Pattern == nil {
			return false
		}
		v, ok := lookup(ev.JSON, c.Key)
		s, isStr := v.(string)
		return ok && isStr && globMatch(*c.Pattern, s, c.Key == "content.body")
	case "event_property_is":
		v, ok := lookup(ev.JSON, c.Key)
		return ok && scalarEqual(v, c.Value)
	case "event_property_contains":
		v, ok := lookup(ev.JSON, c.Key)
		list, isList := v.([]any)
		if !ok || !isList {
			return false
		}
		for _, item := range list {
			if scalarEqual(item, c.Value) {
				return true
			}
		}
		return false
	case "contains_display_name":
		if ev.UserDisplayName == "" {
			return false
		}
		body, _ := lookup(ev.JSON, "content.body")
		s, isStr := body.(string)
		return isStr && wordMatch(regexp.QuoteMeta(ev.UserDisplayName), s)
	case "room_member_count":
		return memberCountMatches(c.Is, ev.MemberCount)
	case "sender_notification_permission":
		if c.Key == "" {
			return false
		}
		need, ok := ev.NotificationLevels[c.Key]
		if !ok {
			need = 50
			if c.Key != "room" {
				return false
			}
		}
		return ev.SenderPowerLevel >= need
	}
	return false
}

// lookup follows a dotted key into the event; a dot escaped with a
// backslash is part of a name (content.m\.mentions), as is an escaped
// backslash.
func lookup(obj map[string]any, key string) (any, bool) {
	var cur any = obj
	for _, part := range splitKey(key) {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[part]; !ok {
			return nil, false
		}
	}
	return cur, true
}

func splitKey(key string) []string {
	var parts []string
	var b strings.Builder
	for i := 0; i < len(key); i++ {
		switch {
		case key[i] == '\\' && i+1 < len(key) && (key[i+1] == '.' || key[i+1] == '\\'):
			b.WriteByte(key[i+1])
			i++
		case key[i] == '.':
			parts = append(parts, b.String())
			b.Reset()
		default:
			b.WriteByte(key[i])
		}
	}
	return append(parts, b.String())
}

// scalarEqual compares an event's value with a condition's: strings,
// integers, booleans and null, exactly (no case folding).
func scalarEqual(v any, want json.RawMessage) bool {
	if len(want) == 0 {
		return false
	}
	var w any
	d := json.NewDecoder(strings.NewReader(string(want)))
	d.UseNumber()
	if d.Decode(&w) != nil {
		return false
	}
	switch w := w.(type) {
	case nil:
		return v == nil
	case bool:
		b, ok := v.(bool)
		return ok && b == w
	case string:
		s, ok := v.(string)
		return ok && s == w
	case json.Number:
		want, err := w.Int64()
		if err != nil {
			return false
		}
		switch n := v.(type) {
		case float64:
			return n == float64(want)
		case json.Number:
			got, err := n.Int64()
			return err == nil && got == want
		}
	}
	return false
}

func memberCountMatches(is string, count int) bool {
	op := "=="
	for _, p := range []string{"==", "<=", ">=", "<", ">"} {
		if strings.HasPrefix(is, p) {
			op, is = p, is[len(p):]
			break
		}
	}
	n, err := strconv.Atoi(is)
	if err != nil {
		return false
	}
	switch op {
	case "<":
		return count < n
	case ">":
		return count > n
	case "<=":
		return count <= n
	case ">=":
		return count >= n
	}
	return count == n
}

var globCache sync.Map // "w"+pattern or "e"+pattern -> *regexp.Regexp

// globMatch matches a glob (* any run of characters, ? one character),
// case-insensitively: against the whole value, or, for the body of a
// message (wordBoundary), against any run of whole words in it, as
// Synapse does, so "@room" matches "hello @room!".
func globMatch(pattern, value string, wordBoundary bool) bool {
	key := "e" + pattern
	if wordBoundary {
		key = "w" + pattern
	}
	if re, ok := globCache.Load(key); ok {
		return re.(*regexp.Regexp).MatchString(value)
	}
	var b strings.Builder
	for _, r := range pattern {
		switch r {
		case '*':
			b.WriteString(".*?")
		case '?':
			b.WriteString(".")
		default:
			b.WriteString(regexp.QuoteMeta(string(r)))
		}
	}
	var expr string
	if wordBoundary {
		expr = wordExpr(b.String())
	} else {
		expr = `(?is)\A` + b.String() + `\z`
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		return false
	}
	globCache.Store(key, re)
	return re.MatchString(value)
}

// wordExpr is an expression finding inner as whole words: preceded and
// followed by the ends of the value or by characters that are not letters,
// digits or underscores.
func wordExpr(inner string) string {
	return `(?is)(?:\A|[^\pL\pN_])(?:` + inner + `)(?:[^\pL\pN_]|\z)`
}

func wordMatch(quoted, value string) bool {
	if !utf8.ValidString(value) {
		return false
	}
	re, err := regexp.Compile(wordExpr(quoted))
	return err == nil && re.MatchString(value)
}

func outcome(r Rule) Outcome {
	o := Outcome{RuleID: r.RuleID, Tweaks: map[string]any{}}
	for _, raw := range r.Actions {
		var name string
		if json.Unmarshal(raw, &name) == nil {
			switch name {
			case "notify", "coalesce":
				o.Notify = true
			}
			continue
		}
		var tweak struct {
			SetTweak string          `json:"set_tweak"`
			Value    json.RawMessage `json:"value"`
		}
		if json.Unmarshal(raw, &tweak) != nil || tweak.SetTweak == "" {
			continue
		}
		var v any = true
		if len(tweak.Value) > 0 {
			if json.Unmarshal(tweak.Value, &v) != nil {
				continue
			}
		} else if tweak.SetTweak != "highlight" {
			continue
		}
		o.Tweaks[tweak.SetTweak] = v
	}
	if !o.Notify {
		o.Tweaks = map[string]any{}
	}
	return o
}
