package clientapi_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

const pushRules = "/_matrix/client/v3/pushrules/"

func ruleIDs(t *testing.T, rules any) []string {
	t.Helper()
	var out []string
	for _, r := range rules.([]any) {
		out = append(out, r.(map[string]any)["rule_id"].(string))
	}
	return out
}

func TestPushRules(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		since := accountDataSync(t, srv, alice, "")["next_batch"].(string)

		// What a client asks before its first /sync, on every path it
		// may use.
		for _, p := range []string{pushRules, "/_matrix/client/v3/pushrules", "/_matrix/client/r0/pushrules/"} {
			all := srv.Must(t, "GET", p, alice.Token, nil)
			global := all["global"].(map[string]any)
			if got := ruleIDs(t, global["override"]); len(got) != 12 || got[0] != ".m.rule.master" {
				t.Fatalf("%s: override %q", p, got)
			}
			if got := ruleIDs(t, global["underride"]); len(got) != 5 || got[1] != ".m.rule.encrypted_room_one_to_one" {
				t.Fatalf("%s: underride %q", p, got)
			}
		}
		global := srv.Must(t, "GET", pushRules+"global/", alice.Token, nil)
		if len(ruleIDs(t, global["content"])) != 1 {
			t.Fatalf("global/: %v", global)
		}
		// A kind's rules are a list.
		resp, err := http.Get(srv.URL + pushRules + "global/underride/?access_token=" + alice.Token)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var under []map[string]any
		if resp.StatusCode != 200 || json.Unmarshal(raw, &under) != nil || len(under) != 5 {
			t.Fatalf("global/underride/: %d %s", resp.StatusCode, raw)
		}

		// A rule of the user's, before and after.
		rule := pushRules + "global/override/cake"
		srv.Must(t, "PUT", rule, alice.Token, map[string]any{
			"conditions": []any{map[string]any{"kind": "event_match", "key": "content.body", "pattern": "cake*"}},
			"actions":    []any{"notify", map[string]any{"set_tweak": "sound", "value": "default"}},
		})
		srv.Must(t, "PUT", pushRules+"global/override/pie?after=cake", alice.Token, map[string]any{
			"conditions": []any{}, "actions": []any{"notify"},
		})
		got := srv.Must(t, "GET", rule, alice.Token, nil)
		if got["rule_id"] != "cake" || got["default"] != false || got["enabled"] != true || len(got["conditions"].([]any)) != 1 {
			t.Fatalf("GET rule: %v", got)
		}
		order := ruleIDs(t, srv.Must(t, "GET", pushRules, alice.Token, nil)["global"].(map[string]any)["override"])
		if strings.Join(order[:4], " ") != ".m.rule.master cake pie .m.rule.suppress_notices" {
			t.Fatalf("override order %q", order)
		}

		// enabled and actions, of the user's rules and the defaults.
		srv.Must(t, "PUT", rule+"/enabled", alice.Token, map[string]any{"enabled": false})
		if e := srv.Must(t, "GET", rule+"/enabled", alice.Token, nil); e["enabled"] != false {
			t.Fatalf("enabled %v", e)
		}
		master := pushRules + "global/override/.m.rule.master"
		srv.Must(t, "PUT", master+"/enabled", alice.Token, map[string]any{"enabled": true})
		if e := srv.Must(t, "GET", master+"/enabled", alice.Token, nil); e["enabled"] != true {
			t.Fatalf("master enabled %v", e)
		}
		msg := pushRules + "global/underride/.m.rule.message"
		srv.Must(t, "PUT", msg+"/actions", alice.Token, map[string]any{"actions": []any{}})
		if a := srv.Must(t, "GET", msg+"/actions", alice.Token, nil); len(a["actions"].([]any)) != 0 {
			t.Fatalf("actions %v", a)
		}

		// The change reaches /sync as m.push_rules account data, the
		// whole ruleset; bob's rules are his own.
		events := accountDataSync(t, srv, alice, since)["account_data"].(map[string]any)["events"].([]any)
		var pushed map[string]any
		for _, e := range events {
			if ev := e.(map[string]any); ev["type"] == "m.push_rules" {
				pushed = ev["content"].(map[string]any)
			}
		}
		if pushed == nil {
			t.Fatalf("no m.push_rules in /sync account data: %v", events)
		}
		if got := ruleIDs(t, pushed["global"].(map[string]any)["override"]); len(got) != 14 || got[1] != "cake" {
			t.Fatalf("m.push_rules override %q", got)
		}
		if got := ruleIDs(t, srv.Must(t, "GET", pushRules, bob.Token, nil)["global"].(map[string]any)["override"]); len(got) != 12 {
			t.Fatalf("bob's override %q", got)
		}

		srv.Must(t, "DELETE", rule, alice.Token, nil)
		if r := srv.Do(t, "GET", rule, alice.Token, nil); r.Status != 404 || r.Errcode() != "M_NOT_FOUND" {
			t.Fatalf("deleted rule: %d %s", r.Status, r.Raw)
		}

		// Mistakes: clear errors, nothing changed.
		before := srv.Must(t, "GET", pushRules, alice.Token, nil)
		for _, c := range []struct {
			method, path string
			body         any
			status       int
			errcode      string
		}{
			{"PUT", pushRules + "global/override/.m.rule.mine", map[string]any{"actions": []any{"notify"}}, 400, "M_INVALID_PARAM"},
			{"PUT", pushRules + "global/override/x", map[string]any{"conditions": []any{}}, 400, "M_MISSING_PARAM"},
			{"PUT", pushRules + "global/override/x", map[string]any{"actions": []any{"sing"}}, 400, "M_INVALID_PARAM"},
			{"PUT", pushRules + "global/content/x", map[string]any{"actions": []any{"notify"}}, 400, "M_MISSING_PARAM"},
			{"PUT", pushRules + "global/override/x", "not json", 400, "M_NOT_JSON"},
			{"PUT", pushRules + "global/override/x?before=nope", map[string]any{"actions": []any{"notify"}}, 404, "M_NOT_FOUND"},
			{"PUT", pushRules + "global/sideways/x", map[string]any{"actions": []any{"notify"}}, 400, "M_INVALID_PARAM"},
			{"PUT", pushRules + "device/override/x", map[string]any{"actions": []any{"notify"}}, 400, "M_INVALID_PARAM"},
			{"PUT", master + "/enabled", map[string]any{}, 400, "M_MISSING_PARAM"},
			{"PUT", master + "/actions", map[string]any{}, 400, "M_MISSING_PARAM"},
			{"PUT", pushRules + "global/override/nope/enabled", map[string]any{"enabled": true}, 404, "M_NOT_FOUND"},
			{"DELETE", master, nil, 404, "M_NOT_FOUND"},
			{"GET", pushRules + "global/override/nope", nil, 404, "M_NOT_FOUND"},
			{"PUT", accountDataPath(alice.UserID, "", "m.push_rules"), map[string]any{"global": map[string]any{}}, 405, "M_BAD_JSON"},
		} {
			if r := srv.Do(t, c.method, c.path, alice.Token, c.body); r.Status != c.status || r.Errcode() != c.errcode {
				t.Fatalf("%s %s %v: %d %s, want %d %s", c.method, c.path, c.body, r.Status, r.Raw, c.status, c.errcode)
			}
		}
		if r := srv.Do(t, "GET", pushRules, "", nil); r.Status != 401 || r.Errcode() != "M_MISSING_TOKEN" {
			t.Fatalf("without a token: %d %s", r.Status, r.Raw)
		}
		if after := srv.Must(t, "GET", pushRules, alice.Token, nil); testutil.Canonical(t, after) != testutil.Canonical(t, before) {
			t.Fatal("refused requests changed the rules")
		}
	})
}
