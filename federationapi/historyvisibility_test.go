package federationapi_test

import (
	"net/url"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/keyserver/keyserver/internal/testutil"
)

// TestFederationHistoryVisibility: under "joined" and "invited", another
// server reads the events from before any of its users joined (or was
// invited) redacted, whole from then on; under "shared", everything whole.
func TestFederationHistoryVisibility(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a := testutil.StartNode(t, db, nil)
		r := newFedRoom(t, a, "hv")
		b, c := testutil.StartNode(t, testutil.SQLite(t), nil), testutil.StartNode(t, testutil.SQLite(t), nil)
		peerB, peerC := asNode(t, b), asNode(t, c)
		setVisibility := func(v string) string {
			return a.Must(t, "PUT", r.path("/state/m.room.history_visibility/"), r.alice.Token, map[string]any{"history_visibility": v})["event_id"].(string)
		}
		shared := r.send(t)
		setVisibility("joined")
		hidden := r.send(t)
		r.joinFrom(t, b, b.Register(t, "bob", ""), "#hv:"+a.ServerName)
		seenByB := r.send(t)
		setVisibility("invited")
		hiddenFromC := r.send(t)
		carol := c.Register(t, "carol", "")
		a.Must(t, "POST", r.path("/invite"), r.alice.Token, map[string]any{"user_id": carol.UserID})
		r.memberEvent(t, carol.UserID, "invite")
		whileInvited := r.send(t)
		r.joinFrom(t, c, carol, "#hv:"+a.ServerName)
		latest := r.send(t)

		// whole reports, per event backfill returned, whether its content
		// came whole. Only messages are looked at: the state events here
		// keep all their content when redacted.
		whole := func(o requester) map[string]bool {
			t.Helper()
			ans := fedMust(t, a, o, "GET", fedV1+"/backfill/"+url.PathEscape(r.roomID)+"?limit=100&v="+url.QueryEscape(latest), nil)
			out := map[string]bool{}
			for _, ev := range pdusOf(t, a, r.roomID, ans["pdus"]) {
				out[ev.EventID()] = string(ev.Content()) != "{}"
			}
			return out
		}
		for i, c := range []struct {
			who   string
			o     requester
			event string
			whole bool
		}{
			{"B", peerB, shared, true},
			{"B", peerB, hidden, false},
			{"B", peerB, seenByB, true},
			{"B", peerB, hiddenFromC, true},
			{"C", peerC, shared, true},
			{"C", peerC, hidden, false},
			{"C", peerC, seenByB, false},
			{"C", peerC, hiddenFromC, false},
			{"C", peerC, whileInvited, true},
			{"C", peerC, latest, true},
		} {
			got, ok := whole(c.o)[c.event]
			if !ok {
				t.Fatalf("backfill for %s lacks %s", c.who, c.event)
			}
			if got != c.whole {
				t.Errorf("case %d: %s reads %s whole: %v, want %v", i, c.who, c.event, got, c.whole)
			}
		}

		// /event and /get_missing_events serve the same way; a redacted
		// event keeps its ID and its place in the graph.
		ev := pdusOf(t, a, r.roomID, []any{mustEvent(t, a, peerC, hidden)})[0]
		if ev.EventID() != hidden || string(ev.Content()) != "{}" {
			t.Fatalf("/event of a hidden message for C: %s", ev.JSON())
		}
		if ev := pdusOf(t, a, r.roomID, []any{mustEvent(t, a, peerB, seenByB)})[0]; string(ev.Content()) == "{}" {
			t.Fatalf("/event of a message B may read came redacted: %s", ev.JSON())
		}
		missing := fedMust(t, a, peerC, "POST", fedV1+"/get_missing_events/"+url.PathEscape(r.roomID),
			map[string]any{"earliest_events": []string{hiddenFromC}, "latest_events": []string{latest}})
		byID := map[string]gomatrixserverlib.PDU{}
		for _, ev := range pdusOf(t, a, r.roomID, missing["events"]) {
			byID[ev.EventID()] = ev
		}
		if ev, ok := byID[whileInvited]; !ok || string(ev.Content()) == "{}" {
			t.Fatalf("get_missing_events for C: %v", missing["events"])
		}
	})
}
