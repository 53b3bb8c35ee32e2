package federationapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/fclient"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/internal/identity"
	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
)

const (
	fedV1     = "/_matrix/federation/v1"
	clientV3  = "/_matrix/client/v3"
	stateType = "m.room.topic"
)

// fedRoom is a room of node a made through the client API, with the
// IDs of the messages sent in it, oldest first.
type fedRoom struct {
	a        *testutil.Node
	alice    *testutil.User
	roomID   string
	messages []string
	txn      int
}

func newFedRoom(t *testing.T, a *testutil.Node, alias string) *fedRoom {
	alice := a.Register(t, "alice", "")
	body := map[string]any{"preset": "public_chat", "room_alias_name": alias, "topic": "first"}
	roomID := a.Must(t, "POST", clientV3+"/createRoom", alice.Token, body)["room_id"].(string)
	return &fedRoom{a: a, alice: alice, roomID: roomID}
}

func (r *fedRoom) path(rest string) string {
	return clientV3 + "/rooms/" + url.PathEscape(r.roomID) + rest
}

// send sends a message and returns its ID.
func (r *fedRoom) send(t *testing.T) string {
	r.txn++
	id := r.a.Must(t, "PUT", r.path(fmt.Sprintf("/send/m.room.message/t%d", r.txn)), r.alice.Token,
		map[string]any{"msgtype": "m.text", "body": fmt.Sprintf("message %d", r.txn)})["event_id"].(string)
	r.messages = append(r.messages, id)
	return id
}

// setTopic changes the topic and returns the event's ID.
func (r *fedRoom) setTopic(t *testing.T, topic string) string {
	return r.a.Must(t, "PUT", r.path("/state/"+stateType), r.alice.Token, map[string]any{"topic": topic})["event_id"].(string)
}

// stateIDs is the room's current state as its client API shows it.
func (r *fedRoom) stateIDs(t *testing.T) []string {
	req, _ := http.NewRequest("GET", r.a.URL+r.path("/state"), nil)
	req.Header.Set("Authorization", "Bearer "+r.alice.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var evs []struct {
		EventID string `json:"event_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&evs); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, ev := range evs {
		ids = append(ids, ev.EventID)
	}
	return sorted(ids)
}

// requester signs a request to dest as some server.
type requester func(t *testing.T, method, dest, path string, body any) *http.Request

// asOrigin signs as a stand-in server.
func asOrigin(o *testutil.Origin) requester {
	return func(t *testing.T, method, dest, path string, body any) *http.Request {
		return o.SignedRequest(t, method, dest, path, body, "", nil)
	}
}

// asNode signs as a daemon, with its own signing key.
func asNode(t *testing.T, n *testutil.Node) requester {
	key, _, err := identity.LoadOrCreateSigningKey(n.Config.SigningKeyFile())
	if err != nil {
		t.Fatal(err)
	}
	return func(t *testing.T, method, dest, path string, body any) *http.Request {
		t.Helper()
		fr := fclient.NewFederationRequest(method, spec.ServerName(n.ServerName), spec.ServerName(dest), path)
		if body != nil {
			if err := fr.SetContent(body); err != nil {
				t.Fatal(err)
			}
		}
		if err := fr.Sign(spec.ServerName(n.ServerName), key.KeyID, key.PrivateKey); err != nil {
			t.Fatal(err)
		}
		req, err := fr.HTTPRequest()
		if err != nil {
			t.Fatal(err)
		}
		return req
	}
}

// joinFrom joins u of n to the room by its alias, over federation, and
// returns the join's event ID as the room's server stored it.
func (r *fedRoom) joinFrom(t *testing.T, n *testutil.Node, u *testutil.User, alias string) string {
	t.Helper()
	if got := n.Must(t, "POST", clientV3+"/join/"+url.PathEscape(alias), u.Token, map[string]any{})["room_id"]; got != r.roomID {
		t.Fatalf("%s joined %v, want %s", u.UserID, got, r.roomID)
	}
	return r.memberEvent(t, u.UserID, spec.Join)
}

// memberEvent waits for the room's server to hold a user's membership,
// and returns the event's ID.
func (r *fedRoom) memberEvent(t *testing.T, userID, membership string) string {
	t.Helper()
	ctx := context.Background()
	var id string
	testutil.Eventually(t, userID+"'s "+membership+" to reach "+r.a.ServerName, func() bool {
		evs, err := r.a.Store.RoomStateEvents(ctx, r.roomID, []storage.StateKey{{Type: spec.MRoomMember, StateKey: userID}})
		if err != nil || len(evs) != 1 || evs[0].Membership != membership {
			return false
		}
		id = evs[0].EventID
		return true
	})
	return id
}

// flag marks a stored event the way the inbound path would (an outlier
// has no state before it).
func flag(t *testing.T, n *testutil.Node, eventID, set string) {
	t.Helper()
	if _, err := n.Store.DB().Exec(`UPDATE room_events SET `+set+` WHERE event_id = $1`, eventID); err != nil {
		t.Fatal(err)
	}
}

// fedDo sends n a request signed by from.
func fedDo(t *testing.T, n *testutil.Node, from requester, method, path string, body any) testutil.Response {
	t.Helper()
	return testutil.SendTo(t, n, from(t, method, n.ServerName, path, body))
}

func fedMust(t *testing.T, n *testutil.Node, o requester, method, path string, body any) map[string]any {
	t.Helper()
	r := fedDo(t, n, o, method, path, body)
	if r.Status != http.StatusOK {
		t.Fatalf("%s %s: %d %s", method, path, r.Status, r.Raw)
	}
	return r.Body
}

func expectFedError(t *testing.T, n *testutil.Node, o requester, method, path string, body any, status int, errcode string) {
	t.Helper()
	r := fedDo(t, n, o, method, path, body)
	if r.Status != status || r.Errcode() != errcode {
		t.Fatalf("%s %s: %d %s, want %d %s", method, path, r.Status, r.Raw, status, errcode)
	}
}

// pdusOf checks that every PDU of an answer is a well-formed event of the
// room version whose reference hash is its event ID, and returns them.
func pdusOf(t *testing.T, n *testutil.Node, roomID string, raw any) []gomatrixserverlib.PDU {
	t.Helper()
	room, err := n.Store.Room(context.Background(), roomID)
	if err != nil {
		t.Fatal(err)
	}
	impl := gomatrixserverlib.MustGetRoomVersion(gomatrixserverlib.RoomVersion(room.RoomVersion))
	list, ok := raw.([]any)
	if !ok {
		t.Fatalf("not a list of PDUs: %v", raw)
	}
	var out []gomatrixserverlib.PDU
	for _, item := range list {
		js, _ := json.Marshal(item)
		ev, err := impl.NewEventFromUntrustedJSON(js)
		if err != nil {
			t.Fatalf("a PDU does not check: %v: %s", err, js)
		}
		if ev.RoomID().String() != roomID {
			t.Fatalf("PDU of room %s, want %s", ev.RoomID(), roomID)
		}
		out = append(out, ev)
	}
	return out
}

func idsOf(evs []gomatrixserverlib.PDU) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.EventID())
	}
	return out
}

func strs(v any) []string {
	var out []string
	for _, s := range v.([]any) {
		out = append(out, s.(string))
	}
	return out
}

func sorted(s []string) []string { s = slices.Clone(s); slices.Sort(s); return s }

// authClosure is every event reachable over auth_events from the given
// ones, read from the events the answer carried; a reference to an event
// the answer lacks fails the test.
func authClosure(t *testing.T, from, chain []gomatrixserverlib.PDU) []string {
	t.Helper()
	byID := map[string]gomatrixserverlib.PDU{}
	for _, ev := range chain {
		byID[ev.EventID()] = ev
	}
	seen := map[string]bool{}
	pending := slices.Clone(from)
	for len(pending) > 0 {
		ev := pending[0]
		pending = pending[1:]
		for _, id := range ev.AuthEventIDs() {
			if seen[id] {
				continue
			}
			seen[id] = true
			next, ok := byID[id]
			if !ok {
				t.Fatalf("the auth chain lacks %s, an auth event of %s", id, ev.EventID())
			}
			pending = append(pending, next)
		}
	}
	var out []string
	for id := range seen {
		out = append(out, id)
	}
	return sorted(out)
}

// Other servers read a room's events, its state before an event with the
// auth chain, missing events and history, when one of their users is in
// it; others are refused, and rejected events are never served.
func TestFederationRoomReads(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a := testutil.StartNode(t, db, nil)
		r := newFedRoom(t, a, "reads")
		// B's user joins; C's user is in the room while `during` is sent
		// only; the stranger has no user in it.
		b, c := testutil.StartNode(t, testutil.SQLite(t), nil), testutil.StartNode(t, testutil.SQLite(t), nil)
		peer, former, stranger := asNode(t, b), asNode(t, c), asOrigin(testutil.NewOrigin(t))
		r.send(t)
		r.setTopic(t, "second")
		before := r.stateIDs(t)
		m := r.send(t) // the state before m is `before`
		bobJoin := r.joinFrom(t, b, b.Register(t, "bob", ""), "#reads:"+a.ServerName)
		carol := c.Register(t, "carol", "")
		r.joinFrom(t, c, carol, "#reads:"+a.ServerName)
		during := r.send(t)
		// C has the message before carol leaves: her leave follows it.
		testutil.Eventually(t, "C to receive the message", func() bool {
			_, err := c.Store.RoomEvent(context.Background(), during)
			return err == nil
		})
		c.Must(t, "POST", clientV3+"/rooms/"+url.PathEscape(r.roomID)+"/leave", carol.Token, map[string]any{})
		r.memberEvent(t, carol.UserID, spec.Leave)
		r.setTopic(t, "third")
		for range 105 {
			r.send(t)
		}
		latest := r.messages[len(r.messages)-1]
		esc := url.PathEscape
		q := url.QueryEscape

		// /event
		ans := fedMust(t, a, peer, "GET", fedV1+"/event/"+esc(m), nil)
		if ans["origin"] != a.ServerName || ans["origin_server_ts"] == nil {
			t.Fatalf("/event: %v", ans)
		}
		if got := idsOf(pdusOf(t, a, r.roomID, ans["pdus"])); !slices.Equal(got, []string{m}) {
			t.Fatalf("/event returned %v, want %s", got, m)
		}
		expectFedError(t, a, peer, "GET", fedV1+"/event/"+esc("$unknown"), nil, 404, "M_NOT_FOUND")

		// /state_ids and /state: the state before m, which bob's join
		// and the later topic do not change, and its whole auth chain.
		ids := fedMust(t, a, peer, "GET", fedV1+"/state_ids/"+esc(r.roomID)+"?event_id="+q(m), nil)
		if got := sorted(strs(ids["pdu_ids"])); !slices.Equal(got, before) {
			t.Fatalf("state_ids before %s: %v, want %v", m, got, before)
		}
		st := fedMust(t, a, peer, "GET", fedV1+"/state/"+esc(r.roomID)+"?event_id="+q(m), nil)
		state, chain := pdusOf(t, a, r.roomID, st["pdus"]), pdusOf(t, a, r.roomID, st["auth_chain"])
		if got := sorted(idsOf(state)); !slices.Equal(got, before) {
			t.Fatalf("state before %s: %v, want %v", m, got, before)
		}
		closure := authClosure(t, state, chain)
		if got := sorted(idsOf(chain)); !slices.Equal(got, closure) {
			t.Fatalf("auth chain %v, want exactly the auth events' closure %v", got, closure)
		}
		if got := sorted(strs(ids["auth_chain_ids"])); !slices.Equal(got, closure) {
			t.Fatalf("auth_chain_ids %v, want %v", got, closure)
		}
		if len(closure) < 3 {
			t.Fatalf("auth chain too short: %v", closure)
		}

		// /event_auth: the auth chain of bob's join.
		ea := fedMust(t, a, peer, "GET", fedV1+"/event_auth/"+esc(r.roomID)+"/"+esc(bobJoin), nil)
		joinEv := pdusOf(t, a, r.roomID, []any{mustEvent(t, a, peer, bobJoin)})
		chain = pdusOf(t, a, r.roomID, ea["auth_chain"])
		if got, want := sorted(idsOf(chain)), authClosure(t, joinEv, chain); !slices.Equal(got, want) || len(want) == 0 {
			t.Fatalf("event_auth %v, want %v", got, want)
		}

		// /get_missing_events: breadth-first from the latest, stopping at
		// the earliest, oldest first.
		gme := func(body map[string]any) []string {
			t.Helper()
			ans := fedMust(t, a, peer, "POST", fedV1+"/get_missing_events/"+esc(r.roomID), body)
			return idsOf(pdusOf(t, a, r.roomID, ans["events"]))
		}
		n := len(r.messages)
		got := gme(map[string]any{"earliest_events": []string{r.messages[n-5]}, "latest_events": []string{latest}})
		if want := r.messages[n-4 : n-1]; !slices.Equal(got, want) {
			t.Fatalf("missing events %v, want %v", got, want)
		}
		got = gme(map[string]any{"earliest_events": []string{r.messages[n-5]}, "latest_events": []string{latest}, "limit": 2})
		if want := r.messages[n-3 : n-1]; !slices.Equal(got, want) {
			t.Fatalf("missing events with limit 2: %v, want %v", got, want)
		}
		if got := gme(map[string]any{"earliest_events": []string{}, "latest_events": []string{latest}}); !slices.Equal(got, r.messages[n-11:n-1]) {
			t.Fatalf("missing events with the default limit: %v, want the 10 before the latest", got)
		}
		if got := gme(map[string]any{"earliest_events": []string{}, "latest_events": []string{latest}, "limit": 1000}); !slices.Equal(got, r.messages[n-21:n-1]) {
			t.Fatalf("missing events with limit 1000: %d events, want the 20 before the latest", len(got))
		}
		depths := map[string]int64{}
		for _, ev := range pdusOf(t, a, r.roomID, fedMust(t, a, peer, "POST", fedV1+"/get_missing_events/"+esc(r.roomID),
			map[string]any{"earliest_events": []string{}, "latest_events": []string{latest}})["events"]) {
			depths[ev.EventID()] = ev.Depth()
		}
		got = gme(map[string]any{"earliest_events": []string{}, "latest_events": []string{latest}, "min_depth": depths[r.messages[n-3]]})
		if want := r.messages[n-3 : n-1]; !slices.Equal(got, want) {
			t.Fatalf("missing events above min_depth: %v, want %v", got, want)
		}

		// /backfill: the v events and their ancestors, newest first.
		bfPDUs := func(limit string, v ...string) []gomatrixserverlib.PDU {
			t.Helper()
			path := fedV1 + "/backfill/" + esc(r.roomID) + "?limit=" + limit
			for _, id := range v {
				path += "&v=" + q(id)
			}
			ans := fedMust(t, a, peer, "GET", path, nil)
			if ans["origin"] != a.ServerName || ans["origin_server_ts"] == nil {
				t.Fatalf("/backfill: %v", ans)
			}
			return pdusOf(t, a, r.roomID, ans["pdus"])
		}
		bf := func(limit string, v ...string) []string { t.Helper(); return idsOf(bfPDUs(limit, v...)) }
		if got, want := bf("3", latest), []string{latest, r.messages[n-2], r.messages[n-3]}; !slices.Equal(got, want) {
			t.Fatalf("backfill: %v, want %v", got, want)
		}
		if got, want := bf("2", r.messages[n-3], latest), []string{latest, r.messages[n-3]}; !slices.Equal(got, want) {
			t.Fatalf("backfill from two events: %v, want %v", got, want)
		}
		all := bf("1000", latest)
		if len(all) != 100 {
			t.Fatalf("backfill with limit 1000 returned %d events, want the cap of 100", len(all))
		}
		if !slices.Equal(all[:100], reversed(r.messages[n-100:])) {
			t.Fatalf("backfill did not return the 100 latest messages, newest first")
		}
		// Back to the room's creation: the room is one chain, an event
		// at each depth.
		first := bfPDUs("1000", r.messages[0])
		if last := first[len(first)-1]; last.Type() != spec.MRoomCreate || int64(len(first)) != first[0].Depth() {
			t.Fatalf("backfill to the start returned %d events down to a %s", len(first), last.Type())
		}

		// Bad requests.
		expectFedError(t, a, peer, "GET", fedV1+"/state_ids/"+esc(r.roomID), nil, 400, "M_MISSING_PARAM")
		expectFedError(t, a, peer, "GET", fedV1+"/state/"+esc(r.roomID), nil, 400, "M_MISSING_PARAM")
		expectFedError(t, a, peer, "GET", fedV1+"/backfill/"+esc(r.roomID)+"?limit=5", nil, 400, "M_MISSING_PARAM")
		expectFedError(t, a, peer, "GET", fedV1+"/backfill/"+esc(r.roomID)+"?v="+q(latest), nil, 400, "M_MISSING_PARAM")
		expectFedError(t, a, peer, "GET", fedV1+"/backfill/"+esc(r.roomID)+"?limit=x&v="+q(latest), nil, 400, "M_INVALID_PARAM")
		expectFedError(t, a, peer, "POST", fedV1+"/get_missing_events/"+esc(r.roomID), map[string]any{"earliest_events": []string{}}, 400, "M_BAD_JSON")
		expectFedError(t, a, peer, "POST", fedV1+"/get_missing_events/"+esc(r.roomID),
			map[string]any{"latest_events": []string{"$a\u0000"}}, 400, "M_BAD_JSON")

		// Unknown rooms and events, events of another room.
		other := newFedRoomFor(t, a, r.alice)
		expectFedError(t, a, peer, "GET", fedV1+"/state_ids/"+esc("!nowhere:x")+"?event_id="+q(m), nil, 404, "M_NOT_FOUND")
		expectFedError(t, a, peer, "GET", fedV1+"/state_ids/"+esc(r.roomID)+"?event_id="+q("$unknown"), nil, 404, "M_NOT_FOUND")
		expectFedError(t, a, peer, "GET", fedV1+"/state_ids/"+esc(r.roomID)+"?event_id="+q(other), nil, 404, "M_NOT_FOUND")
		expectFedError(t, a, peer, "GET", fedV1+"/event_auth/"+esc(r.roomID)+"/"+esc(other), nil, 404, "M_NOT_FOUND")
		// bob is not in the other room.
		expectFedError(t, a, peer, "GET", fedV1+"/event/"+esc(other), nil, 403, "M_FORBIDDEN")

		// A server without users in the room may read nothing.
		for _, c := range []struct{ method, path string }{
			{"GET", fedV1 + "/event/" + esc(m)},
			{"GET", fedV1 + "/state_ids/" + esc(r.roomID) + "?event_id=" + q(m)},
			{"GET", fedV1 + "/state/" + esc(r.roomID) + "?event_id=" + q(m)},
			{"GET", fedV1 + "/event_auth/" + esc(r.roomID) + "/" + esc(m)},
			{"GET", fedV1 + "/backfill/" + esc(r.roomID) + "?limit=5&v=" + q(latest)},
			{"POST", fedV1 + "/get_missing_events/" + esc(r.roomID)},
		} {
			var body any
			if c.method == "POST" {
				body = map[string]any{"earliest_events": []string{}, "latest_events": []string{latest}}
			}
			expectFedError(t, a, stranger, c.method, c.path, body, 403, "M_FORBIDDEN")
		}
		// A server that left reads the events it was there for, and no other.
		fedMust(t, a, former, "GET", fedV1+"/state_ids/"+esc(r.roomID)+"?event_id="+q(during), nil)
		fedMust(t, a, former, "GET", fedV1+"/event/"+esc(during), nil)
		expectFedError(t, a, former, "GET", fedV1+"/state_ids/"+esc(r.roomID)+"?event_id="+q(m), nil, 403, "M_FORBIDDEN")
		expectFedError(t, a, former, "GET", fedV1+"/event/"+esc(latest), nil, 403, "M_FORBIDDEN")

		// A soft-failed event is in the graph: found over prev_events.
		flag(t, a, r.messages[n-4], "soft_failed = 1")
		if got, want := gme(map[string]any{"earliest_events": []string{r.messages[n-5]}, "latest_events": []string{latest}}),
			r.messages[n-4:n-1]; !slices.Equal(got, want) {
			t.Fatalf("missing events with a soft-failed one: %v, want %v", got, want)
		}
		fedMust(t, a, peer, "GET", fedV1+"/event/"+esc(r.messages[n-4]), nil)

		// An outlier is served by /event, but has no state.
		flag(t, a, r.messages[n-2], "outlier = 1, state_before = NULL")
		fedMust(t, a, peer, "GET", fedV1+"/event/"+esc(r.messages[n-2]), nil)
		expectFedError(t, a, peer, "GET", fedV1+"/state_ids/"+esc(r.roomID)+"?event_id="+q(r.messages[n-2]), nil, 404, "M_NOT_FOUND")
		expectFedError(t, a, peer, "GET", fedV1+"/state/"+esc(r.roomID)+"?event_id="+q(r.messages[n-2]), nil, 404, "M_NOT_FOUND")

		// A rejected event is never served.
		rejected := r.messages[n-3]
		flag(t, a, rejected, "rejected = 1")
		expectFedError(t, a, peer, "GET", fedV1+"/event/"+esc(rejected), nil, 404, "M_NOT_FOUND")
		expectFedError(t, a, peer, "GET", fedV1+"/state_ids/"+esc(r.roomID)+"?event_id="+q(rejected), nil, 404, "M_NOT_FOUND")
		expectFedError(t, a, peer, "GET", fedV1+"/event_auth/"+esc(r.roomID)+"/"+esc(rejected), nil, 404, "M_NOT_FOUND")
		if got := gme(map[string]any{"earliest_events": []string{r.messages[n-5]}, "latest_events": []string{latest}}); slices.Contains(got, rejected) {
			t.Fatalf("get_missing_events served the rejected event: %v", got)
		}
		if got := bf("5", latest); slices.Contains(got, rejected) {
			t.Fatalf("backfill served the rejected event: %v", got)
		}
		if got := bf("5", rejected); len(got) != 0 {
			t.Fatalf("backfill from the rejected event: %v", got)
		}

		// A redacted event is served redacted, still under its ID.
		a.Must(t, "PUT", r.path("/redact/"+esc(r.messages[1])+"/r1"), r.alice.Token, map[string]any{})
		redacted := pdusOf(t, a, r.roomID, []any{mustEvent(t, a, peer, r.messages[1])})[0]
		if redacted.EventID() != r.messages[1] || string(redacted.Content()) != "{}" {
			t.Fatalf("redacted event served as %s", redacted.JSON())
		}
	})
}

func mustEvent(t *testing.T, n *testutil.Node, o requester, eventID string) any {
	t.Helper()
	return fedMust(t, n, o, "GET", fedV1+"/event/"+url.PathEscape(eventID), nil)["pdus"].([]any)[0]
}

// newFedRoomFor creates another room of u and returns its last event.
func newFedRoomFor(t *testing.T, n *testutil.Node, u *testutil.User) string {
	roomID := n.Must(t, "POST", clientV3+"/createRoom", u.Token, map[string]any{})["room_id"].(string)
	return n.Must(t, "PUT", clientV3+"/rooms/"+url.PathEscape(roomID)+"/send/m.room.message/x", u.Token,
		map[string]any{"msgtype": "m.text", "body": "elsewhere"})["event_id"].(string)
}

func reversed(s []string) []string { s = slices.Clone(s); slices.Reverse(s); return s }

// /query/directory answers for this server's aliases: the room, this
// server first, then the other servers with joined users.
func TestFederationQueryDirectory(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a := testutil.StartNode(t, db, nil)
		r := newFedRoom(t, a, "dir")
		b := testutil.StartNode(t, testutil.SQLite(t), nil)
		peer := asOrigin(testutil.NewOrigin(t)) // any server may ask
		alias := "#dir:" + a.ServerName
		path := func(alias string) string { return fedV1 + "/query/directory?room_alias=" + url.QueryEscape(alias) }
		ans := fedMust(t, a, peer, "GET", path(alias), nil)
		if ans["room_id"] != r.roomID || !slices.Equal(strs(ans["servers"]), []string{a.ServerName}) {
			t.Fatalf("query/directory: %v", ans)
		}
		r.joinFrom(t, b, b.Register(t, "bob", ""), alias)
		ans = fedMust(t, a, peer, "GET", path(alias), nil)
		if ans["room_id"] != r.roomID || !slices.Equal(strs(ans["servers"]), []string{a.ServerName, b.ServerName}) {
			t.Fatalf("query/directory with a remote member: %v", ans)
		}
		expectFedError(t, a, peer, "GET", path("#nope:"+a.ServerName), nil, 404, "M_NOT_FOUND")
		expectFedError(t, a, peer, "GET", path("#dir:elsewhere.example"), nil, 404, "M_NOT_FOUND")
		expectFedError(t, a, peer, "GET", path("nonsense"), nil, 400, "M_INVALID_PARAM")
		expectFedError(t, a, peer, "GET", fedV1+"/query/directory", nil, 400, "M_MISSING_PARAM")
	})
}

// A client of B resolves an alias of A through A (/query/directory), and
// a join by that alias uses the same answer to join through A; A's "not found" is the
// client's, and a server that is down or failing is a 502 with an
// errcode, never a 500.
func TestRemoteAliasResolution(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a := testutil.StartNode(t, testutil.SQLite(t), nil)
		b := testutil.StartNode(t, db, nil)
		r := newFedRoom(t, a, "remote")
		bob := b.Register(t, "bob", "")
		dir := func(alias string) string { return clientV3 + "/directory/room/" + url.PathEscape(alias) }

		ans := b.Must(t, "GET", dir("#remote:"+a.ServerName), bob.Token, nil)
		if ans["room_id"] != r.roomID || !slices.Equal(strs(ans["servers"]), []string{a.ServerName}) {
			t.Fatalf("remote alias: %v", ans)
		}
		if n := a.Requests.Count("GET", fedV1+"/query/directory"); n != 1 {
			t.Fatalf("A answered %d directory queries, want 1", n)
		}
		// Joining by the alias resolves it the same way, and joins
		// through the servers A named.
		join := b.Must(t, "POST", clientV3+"/join/"+url.PathEscape("#remote:"+a.ServerName), bob.Token, map[string]any{})
		if join["room_id"] != r.roomID {
			t.Fatalf("join by a remote alias: %v", join)
		}
		if n := a.Requests.Count("GET", fedV1+"/query/directory"); n != 2 {
			t.Fatalf("A answered %d directory queries, want 2", n)
		}
		// Now both servers are in the room, A first.
		ans = b.Must(t, "GET", dir("#remote:"+a.ServerName), bob.Token, nil)
		if !slices.Equal(strs(ans["servers"]), []string{a.ServerName, b.ServerName}) {
			t.Fatalf("servers of the joined room: %v", ans)
		}

		expectStatus := func(alias string, status int, errcode string) {
			t.Helper()
			got := b.Do(t, "GET", dir(alias), bob.Token, nil)
			if got.Status != status || got.Errcode() != errcode {
				t.Fatalf("GET %s: %d %s, want %d %s", alias, got.Status, got.Raw, status, errcode)
			}
		}
		expectStatus("#nope:"+a.ServerName, 404, "M_NOT_FOUND")
		join404 := b.Do(t, "POST", clientV3+"/join/"+url.PathEscape("#nope:"+a.ServerName), bob.Token, map[string]any{})
		if join404.Status != http.StatusNotFound || join404.Errcode() != "M_NOT_FOUND" {
			t.Fatalf("join by an unknown remote alias: %d %s", join404.Status, join404.Raw)
		}

		// A server answering 500, and one that is down.
		failing := testutil.NewOrigin(t)
		failing.Mux.HandleFunc("GET /_matrix/federation/v1/query/directory", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"errcode":"M_UNKNOWN","error":"internal address 10.1.2.3 failed"}`))
		})
		got := b.Do(t, "GET", dir("#x:"+failing.Name), bob.Token, nil)
		if got.Status != http.StatusBadGateway || got.Errcode() != "M_UNKNOWN" || strings.Contains(string(got.Raw), "10.1.2.3") {
			t.Fatalf("failing server: %d %s", got.Status, got.Raw)
		}
		// A server answering nonsense.
		odd := testutil.NewOrigin(t)
		odd.Mux.HandleFunc("GET /_matrix/federation/v1/query/directory", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"room_id":"not a room","servers":[]}`))
		})
		expectStatus("#x:"+odd.Name, http.StatusBadGateway, "M_UNKNOWN")
		down := a.ServerName
		a.Stop()
		expectStatus("#remote:"+down, http.StatusBadGateway, "M_UNKNOWN")
		// Backing off now: at once, the same answer.
		expectStatus("#remote:"+down, http.StatusBadGateway, "M_UNKNOWN")
	})
}
