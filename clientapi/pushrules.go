package clientapi

import (
	"encoding/json"
	"net/http"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/pushrules"
)

// pushRuleRoutes serves the caller's push rules. Clients ask for them
// before their first /sync, with and without the trailing slash.
func (a *API) pushRuleRoutes(s prefixed) {
	if a.opts.PushRules == nil {
		return
	}
	all := a.authed(func(r *http.Request, c matrixid.Caller) (any, error) {
		return a.opts.PushRules.All(r.Context(), c.UserID)
	})
	s.Handle("/pushrules/", all).Methods(http.MethodGet)
	s.Handle("/pushrules", all).Methods(http.MethodGet)
	scope := a.authed(func(r *http.Request, c matrixid.Caller) (any, error) {
		v, err := pathVars(r, "scope")
		if err != nil {
			return nil, err
		}
		return a.opts.PushRules.Scope(r.Context(), c.UserID, v[0])
	})
	s.Handle("/pushrules/{scope}/", scope).Methods(http.MethodGet)
	s.Handle("/pushrules/{scope}", scope).Methods(http.MethodGet)
	kind := a.authed(func(r *http.Request, c matrixid.Caller) (any, error) {
		v, err := pathVars(r, "scope", "kind")
		if err != nil {
			return nil, err
		}
		return a.opts.PushRules.Kind(r.Context(), c.UserID, v[0], v[1])
	})
	s.Handle("/pushrules/{scope}/{kind}/", kind).Methods(http.MethodGet)
	s.Handle("/pushrules/{scope}/{kind}", kind).Methods(http.MethodGet)

	const rule = "/pushrules/{scope}/{kind}/{ruleId}"
	s.Handle(rule, a.authed(a.pushRule)).Methods(http.MethodGet)
	s.Handle(rule, a.authed(a.putPushRule)).Methods(http.MethodPut)
	s.Handle(rule, a.authed(a.deletePushRule)).Methods(http.MethodDelete)
	s.Handle(rule+"/enabled", a.authed(a.pushRuleEnabled)).Methods(http.MethodGet)
	s.Handle(rule+"/enabled", a.authed(a.setPushRuleEnabled)).Methods(http.MethodPut)
	s.Handle(rule+"/actions", a.authed(a.pushRuleActions)).Methods(http.MethodGet)
	s.Handle(rule+"/actions", a.authed(a.setPushRuleActions)).Methods(http.MethodPut)
}

func pushRulePath(r *http.Request) (scope, kind, ruleID string, err error) {
	v, err := pathVars(r, "scope", "kind", "ruleId")
	if err != nil {
		return "", "", "", err
	}
	return v[0], v[1], v[2], nil
}

func (a *API) pushRule(r *http.Request, c matrixid.Caller) (any, error) {
	scope, kind, id, err := pushRulePath(r)
	if err != nil {
		return nil, err
	}
	return a.opts.PushRules.Rule(r.Context(), c.UserID, scope, kind, id)
}

func (a *API) putPushRule(r *http.Request, c matrixid.Caller) (any, error) {
	scope, kind, id, err := pushRulePath(r)
	if err != nil {
		return nil, err
	}
	var body pushrules.NewRule
	if err := a.decode(r, &body); err != nil {
		return nil, err
	}
	q := r.URL.Query()
	return empty, a.opts.PushRules.Put(r.Context(), c.UserID, scope, kind, id, q.Get("before"), q.Get("after"), body)
}

func (a *API) deletePushRule(r *http.Request, c matrixid.Caller) (any, error) {
	scope, kind, id, err := pushRulePath(r)
	if err != nil {
		return nil, err
	}
	return empty, a.opts.PushRules.Delete(r.Context(), c.UserID, scope, kind, id)
}

func (a *API) pushRuleEnabled(r *http.Request, c matrixid.Caller) (any, error) {
	scope, kind, id, err := pushRulePath(r)
	if err != nil {
		return nil, err
	}
	enabled, err := a.opts.PushRules.Enabled(r.Context(), c.UserID, scope, kind, id)
	if err != nil {
		return nil, err
	}
	return map[string]bool{"enabled": enabled}, nil
}

func (a *API) setPushRuleEnabled(r *http.Request, c matrixid.Caller) (any, error) {
	scope, kind, id, err := pushRulePath(r)
	if err != nil {
		return nil, err
	}
	var body struct {
		Enabled *bool `json:"enabled"`
	}
	if err := a.decode(r, &body); err != nil {
		return nil, err
	}
	if body.Enabled == nil {
		return nil, mxerr.MissingParam("enabled is required")
	}
	return empty, a.opts.PushRules.SetEnabled(r.Context(), c.UserID, scope, kind, id, *body.Enabled)
}

func (a *API) pushRuleActions(r *http.Request, c matrixid.Caller) (any, error) {
	scope, kind, id, err := pushRulePath(r)
	if err != nil {
		return nil, err
	}
	actions, err := a.opts.PushRules.Actions(r.Context(), c.UserID, scope, kind, id)
	if err != nil {
		return nil, err
	}
	return map[string]any{"actions": actions}, nil
}

func (a *API) setPushRuleActions(r *http.Request, c matrixid.Caller) (any, error) {
	scope, kind, id, err := pushRulePath(r)
	if err != nil {
		return nil, err
	}
	var body struct {
		Actions json.RawMessage `json:"actions"`
	}
	if err := a.decode(r, &body); err != nil {
		return nil, err
	}
	if len(body.Actions) == 0 {
		return nil, mxerr.MissingParam("actions is required")
	}
	return empty, a.opts.PushRules.SetActions(r.Context(), c.UserID, scope, kind, id, body.Actions)
}
