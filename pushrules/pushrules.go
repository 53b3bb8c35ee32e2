// Package pushrules is users' push rules (the /pushrules endpoints): the
// spec's server-default rules, which a user may switch on and off and give
// other actions, and the user's own rules, ordered by priority within each
// kind.
//
// A user's rules are kept as their m.push_rules account data: the whole
// ruleset as it was after the user's last change, which is what clients
// expect that account data to be, so /sync hands a change out with the
// rest of the account data. Reading merges it with the current defaults:
// the stored copy decides the user's own rules and the enabled flag and
// actions of each default rule, the code decides which default rules
// exist and their order, so a default added in a later release reaches
// every user.
package pushrules

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// The kinds of rules, in the order they are evaluated.
const (
	KindOverride  = "override"
	KindContent   = "content"
	KindRoom      = "room"
	KindSender    = "sender"
	KindUnderride = "underride"
)

// Kinds lists the kinds in evaluation order.
var Kinds = []string{KindOverride, KindContent, KindRoom, KindSender, KindUnderride}

// ScopeGlobal is the only scope of rules.
const ScopeGlobal = "global"

// AccountDataType is the account data type the rules are kept and
// synced as.
const AccountDataType = "m.push_rules"

// Rule is one push rule as the API shows it. Override and underride rules
// have conditions (a default rule's may be empty), content rules a
// pattern, room and sender rules neither: their rule ID is what they
// match.
type Rule struct {
	RuleID     string            `json:"rule_id"`
	Default    bool              `json:"default"`
	Enabled    bool              `json:"enabled"`
	Conditions []json.RawMessage `json:"conditions,omitempty"`
	Pattern    *string           `json:"pattern,omitempty"`
	Actions    []json.RawMessage `json:"actions"`
}

// MarshalJSON writes conditions whenever the rule has them, an empty list
// included (the master rule's), as clients and Synapse expect of override
// and underride rules, and leaves them out of the other kinds.
func (r Rule) MarshalJSON() ([]byte, error) {
	actions := r.Actions
	if actions == nil {
		actions = []json.RawMessage{}
	}
	if r.Conditions == nil {
		return json.Marshal(struct {
			RuleID  string            `json:"rule_id"`
			Default bool              `json:"default"`
			Enabled bool              `json:"enabled"`
			Pattern *string           `json:"pattern,omitempty"`
			Actions []json.RawMessage `json:"actions"`
		}{r.RuleID, r.Default, r.Enabled, r.Pattern, actions})
	}
	return json.Marshal(struct {
		RuleID     string            `json:"rule_id"`
		Default    bool              `json:"default"`
		Enabled    bool              `json:"enabled"`
		Conditions []json.RawMessage `json:"conditions"`
		Pattern    *string           `json:"pattern,omitempty"`
		Actions    []json.RawMessage `json:"actions"`
	}{r.RuleID, r.Default, r.Enabled, r.Conditions, r.Pattern, actions})
}

// Ruleset is a scope's rules by kind, each list highest priority first.
type Ruleset struct {
	Override  []Rule `json:"override"`
	Content   []Rule `json:"content"`
	Room      []Rule `json:"room"`
	Sender    []Rule `json:"sender"`
	Underride []Rule `json:"underride"`
}

func (rs *Ruleset) list(kind string) *[]Rule {
	switch kind {
	case KindOverride:
		return &rs.Override
	case KindContent:
		return &rs.Content
	case KindRoom:
		return &rs.Room
	case KindSender:
		return &rs.Sender
	case KindUnderride:
		return &rs.Underride
	}
	return nil
}

// document is the m.push_rules content, and GET /pushrules/'s answer.
type document struct {
	Global Ruleset `json:"global"`
}

// Store is what push rules keep in the database: the account data
// (package sqlstore).
type Store interface {
	storage.AccountDataStore
}

// Service serves a user's push rules to the user.
type Service struct {
	db Store
	// changed is told the position of each change once it is committed,
	// to wake the waiting /sync requests of this daemon.
	changed func(storage.Change)
}

// New makes a Service; changed may be nil.
func New(db Store, changed func(storage.Change)) *Service {
	if changed == nil {
		changed = func(storage.Change) {}
	}
	return &Service{db: db, changed: changed}
}

// All returns the user's rules of every scope ({"global": {...}}).
func (s *Service) All(ctx context.Context, userID string) (any, error) {
	rs, err := s.load(ctx, userID)
	if err != nil {
		return nil, err
	}
	return document{Global: rs}, nil
}

// Scope returns the user's rules of one scope.
func (s *Service) Scope(ctx context.Context, userID, scope string) (any, error) {
	if err := checkScope(scope); err != nil {
		return nil, err
	}
	return s.load(ctx, userID)
}

// Kind returns the user's rules of one kind, highest priority first.
func (s *Service) Kind(ctx context.Context, userID, scope, kind string) (any, error) {
	if err := checkScopeKind(scope, kind); err != nil {
		return nil, err
	}
	rs, err := s.load(ctx, userID)
	if err != nil {
		return nil, err
	}
	return *rs.list(kind), nil
}

// Rule returns one rule.
func (s *Service) Rule(ctx context.Context, userID, scope, kind, ruleID string) (Rule, error) {
	if err := checkScopeKind(scope, kind); err != nil {
		return Rule{}, err
	}
	rs, err := s.load(ctx, userID)
	if err != nil {
		return Rule{}, err
	}
	i := find(*rs.list(kind), ruleID)
	if i < 0 {
		return Rule{}, notFound(kind, ruleID)
	}
	return (*rs.list(kind))[i], nil
}

// Enabled answers whether a rule is enabled.
func (s *Service) Enabled(ctx context.Context, userID, scope, kind, ruleID string) (bool, error) {
	r, err := s.Rule(ctx, userID, scope, kind, ruleID)
	return r.Enabled, err
}

// Actions returns a rule's actions.
func (s *Service) Actions(ctx context.Context, userID, scope, kind, ruleID string) ([]json.RawMessage, error) {
	r, err := s.Rule(ctx, userID, scope, kind, ruleID)
	return r.Actions, err
}

// SetEnabled switches a rule, default or the user's, on or off.
func (s *Service) SetEnabled(ctx context.Context, userID, scope, kind, ruleID string, enabled bool) error {
	if err := checkScopeKind(scope, kind); err != nil {
		return err
	}
	return s.updateRule(ctx, userID, kind, ruleID, func(r *Rule) { r.Enabled = enabled })
}

// SetActions replaces a rule's actions, default or the user's.
func (s *Service) SetActions(ctx context.Context, userID, scope, kind, ruleID string, actions json.RawMessage) error {
	if err := checkScopeKind(scope, kind); err != nil {
		return err
	}
	acts, err := parseActions(actions)
	if err != nil {
		return err
	}
	return s.updateRule(ctx, userID, kind, ruleID, func(r *Rule) { r.Actions = acts })
}

// updateRule changes one existing rule of a kind.
func (s *Service) updateRule(ctx context.Context, userID, kind, ruleID string, change func(*Rule)) error {
	return s.update(ctx, userID, func(rs *Ruleset) error {
		rules := *rs.list(kind)
		i := find(rules, ruleID)
		if i < 0 {
			return notFound(kind, ruleID)
		}
		change(&rules[i])
		return nil
	})
}

// NewRule is the body of PUT /pushrules/global/{kind}/{ruleId}.
type NewRule struct {
	Actions    json.RawMessage `json:"actions"`
	Conditions json.RawMessage `json:"conditions"`
	Pattern    json.RawMessage `json:"pattern"`
}

// Put adds a user's rule, or replaces one of the same ID (which keeps its
// place unless before or after names another). Without before or after a
// new rule takes the highest priority of the user's rules of its kind;
// before and after name another of the user's rules of that kind.
func (s *Service) Put(ctx context.Context, userID, scope, kind, ruleID, before, after string, body NewRule) error {
	if err := checkScopeKind(scope, kind); err != nil {
		return err
	}
	if err := checkRuleID(ruleID); err != nil {
		return err
	}
	if before != "" && after != "" {
		return mxerr.InvalidParam("give before or after, not both")
	}
	rule, err := buildRule(kind, ruleID, body)
	if err != nil {
		return err
	}
	return s.update(ctx, userID, func(rs *Ruleset) error {
		list := rs.list(kind)
		old := find(*list, ruleID)
		if old >= 0 && before == "" && after == "" {
			(*list)[old] = rule
			return nil
		}
		if old >= 0 {
			*list = append((*list)[:old:old], (*list)[old+1:]...)
		}
		pos, err := position(*list, kind, before, after)
		if err != nil {
			return err
		}
		*list = append((*list)[:pos:pos], append([]Rule{rule}, (*list)[pos:]...)...)
		return nil
	})
}

// Delete removes one of the user's rules. Server-default rules cannot be
// removed; as in Synapse, asking to is answered like a rule that is not
// there.
func (s *Service) Delete(ctx context.Context, userID, scope, kind, ruleID string) error {
	if err := checkScopeKind(scope, kind); err != nil {
		return err
	}
	return s.update(ctx, userID, func(rs *Ruleset) error {
		list := rs.list(kind)
		i := find(*list, ruleID)
		if i < 0 || (*list)[i].Default {
			return notFound(kind, ruleID)
		}
		*list = append((*list)[:i:i], (*list)[i+1:]...)
		return nil
	})
}

// position is where a new rule goes: at the top of the user's rules of
// its kind (after the defaults that come before them), or next to the
// user rule before or after names.
func position(rules []Rule, kind, before, after string) (int, error) {
	anchor := before
	if anchor == "" {
		anchor = after
	}
	if anchor == "" {
		i := 0
		for i < len(rules) && rules[i].Default {
			i++
		}
		return i, nil
	}
	i := find(rules, anchor)
	if i < 0 {
		return 0, mxerr.NotFound("no %s rule %q to place the rule next to", kind, anchor)
	}
	if rules[i].Default {
		return 0, mxerr.InvalidParam("a rule cannot be placed next to the server-default rule %q", anchor)
	}
	if after != "" {
		i++
	}
	return i, nil
}

func (s *Service) load(ctx context.Context, userID string) (Ruleset, error) {
	content, err := s.db.AccountData(ctx, userID, "", AccountDataType)
	if errors.Is(err, storage.ErrNotFound) {
		content, err = nil, nil
	}
	if err != nil {
		return Ruleset{}, err
	}
	return merge(userID, content), nil
}

func (s *Service) update(ctx context.Context, userID string, change func(*Ruleset) error) error {
	ch, err := s.db.UpdateAccountData(ctx, userID, "", AccountDataType, func(old []byte) ([]byte, error) {
		rs := merge(userID, old)
		if err := change(&rs); err != nil {
			return nil, err
		}
		return json.Marshal(document{Global: rs})
	})
	if err != nil {
		return err
	}
	s.changed(ch)
	return nil
}

// merge makes the user's ruleset from the stored copy (nil: none) and
// the current defaults. Stored rules that cannot be read are left out;
// the defaults are always there.
func merge(userID string, stored []byte) Ruleset {
	var doc document
	if len(stored) > 0 {
		// A copy that does not parse (written by hand, say) counts as no
		// change from the defaults.
		if json.Unmarshal(stored, &doc) != nil {
			doc = document{}
		}
	}
	def := defaultsFor(userID)
	var rs Ruleset
	for _, kind := range Kinds {
		saved := *doc.Global.list(kind)
		var out []Rule
		apply := func(d Rule) Rule {
			if i := find(saved, d.RuleID); i >= 0 && saved[i].Default {
				d.Enabled = saved[i].Enabled
				if saved[i].Actions != nil {
					d.Actions = saved[i].Actions
				}
			}
			return d
		}
		for _, d := range def.before[kind] {
			out = append(out, apply(d))
		}
		for _, r := range saved {
			if !r.Default && r.RuleID != "" && !strings.HasPrefix(r.RuleID, ".") {
				out = append(out, r)
			}
		}
		for _, d := range def.after[kind] {
			out = append(out, apply(d))
		}
		if out == nil {
			out = []Rule{}
		}
		*rs.list(kind) = out
	}
	return rs
}

// buildRule checks a user's new rule and gives it the shape of its kind.
func buildRule(kind, ruleID string, body NewRule) (Rule, error) {
	if len(bytes.TrimSpace(body.Actions)) == 0 {
		return Rule{}, mxerr.MissingParam("actions is required")
	}
	actions, err := parseActions(body.Actions)
	if err != nil {
		return Rule{}, err
	}
	r := Rule{RuleID: ruleID, Enabled: true, Actions: actions}
	switch kind {
	case KindOverride, KindUnderride:
		conds := []json.RawMessage{}
		if len(bytes.TrimSpace(body.Conditions)) > 0 && string(bytes.TrimSpace(body.Conditions)) != "null" {
			if err := json.Unmarshal(body.Conditions, &conds); err != nil {
				return Rule{}, mxerr.BadJSON("conditions must be an array of objects")
			}
		}
		for _, c := range conds {
			var obj map[string]json.RawMessage
			if json.Unmarshal(c, &obj) != nil || obj == nil {
				return Rule{}, mxerr.BadJSON("each condition must be an object")
			}
			var k string
			if json.Unmarshal(obj["kind"], &k) != nil || k == "" {
				return Rule{}, mxerr.MissingParam("each condition needs a kind")
			}
		}
		r.Conditions = compactAll(conds)
	case KindContent:
		var pattern string
		if len(body.Pattern) == 0 {
			return Rule{}, mxerr.MissingParam("pattern is required for a content rule")
		}
		if json.Unmarshal(body.Pattern, &pattern) != nil {
			return Rule{}, mxerr.BadJSON("pattern must be a string")
		}
		r.Pattern = &pattern
	}
	return r, nil
}

// parseActions checks an actions array: each action is one of the spec's
// strings ("notify", and "dont_notify" and "coalesce", which older clients
// still send and which mean nothing) or a set_tweak object.
func parseActions(raw json.RawMessage) ([]json.RawMessage, error) {
	var actions []json.RawMessage
	if err := json.Unmarshal(raw, &actions); err != nil || actions == nil {
		return nil, mxerr.BadJSON("actions must be an array")
	}
	for _, a := range actions {
		var s string
		if json.Unmarshal(a, &s) == nil {
			switch s {
			case "notify", "dont_notify", "coalesce":
				continue
			}
			return nil, mxerr.InvalidParam("unknown action %q", s)
		}
		var tweak struct {
			SetTweak *string `json:"set_tweak"`
		}
		if json.Unmarshal(a, &tweak) != nil || tweak.SetTweak == nil || *tweak.SetTweak == "" {
			return nil, mxerr.InvalidParam("an action must be a string or a set_tweak object")
		}
	}
	return compactAll(actions), nil
}

func compactAll(in []json.RawMessage) []json.RawMessage {
	out := make([]json.RawMessage, len(in))
	for i, v := range in {
		var b bytes.Buffer
		if json.Compact(&b, v) != nil {
			out[i] = v
			continue
		}
		out[i] = b.Bytes()
	}
	return out
}

func find(rules []Rule, ruleID string) int {
	for i, r := range rules {
		if r.RuleID == ruleID {
			return i
		}
	}
	return -1
}

func checkScope(scope string) error {
	if scope != ScopeGlobal {
		return mxerr.InvalidParam("unknown scope %q: the only scope is global", scope)
	}
	return nil
}

func checkScopeKind(scope, kind string) error {
	if err := checkScope(scope); err != nil {
		return err
	}
	for _, k := range Kinds {
		if k == kind {
			return nil
		}
	}
	return mxerr.InvalidParam("unknown kind %q of push rule", kind)
}

// checkRuleID checks the ID of a user's new rule: not empty, no slash
// (it is a path segment), and not starting with a dot, which marks the
// server's rules.
func checkRuleID(ruleID string) error {
	switch {
	case ruleID == "":
		return mxerr.InvalidParam("the rule ID is empty")
	case strings.HasPrefix(ruleID, "."):
		return mxerr.InvalidParam("rule IDs starting with '.' are reserved for the server's rules")
	case strings.ContainsAny(ruleID, "/\\"):
		return mxerr.InvalidParam("a rule ID cannot contain a slash")
	case len(ruleID) > 255:
		return mxerr.InvalidParam("a rule ID is at most 255 bytes")
	}
	return nil
}

func notFound(kind, ruleID string) error {
	return mxerr.NotFound("no %s push rule %q", kind, ruleID)
}
