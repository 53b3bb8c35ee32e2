package roomserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"testing"

	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/roomserver"
)

// bodyOf reads content.body of a PDU; "" when redacted away.
func bodyOf(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	var pdu struct {
		Content struct {
			Body string `json:"body"`
		} `json:"content"`
	}
	if err := json.Unmarshal(raw, &pdu); err != nil {
		t.Fatal(err)
	}
	return pdu.Content.Body
}

// Other servers read a room's events while a user of theirs is in it, and
// those from before they left; under "joined" history visibility the
// events from before their first join come redacted; a server never in
// the room reads nothing.
func TestFederationReads(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		f := newFedRooms(t, db)
		var before string
		roomID := f.roomWithCarol(func(roomID string) {
			setState(t, f.rooms, alice, roomID, "m.room.history_visibility", `{"history_visibility":"joined"}`)
			before = send(t, f.rooms, alice, roomID, "before carol")
		})
		carolJoin := f.stateID(roomID, "m.room.member", carol)
		after := send(t, f.rooms, alice, roomID, "after carol")

		if raw, err := f.rooms.FederationEvent(ctx, remote, before); err != nil || bodyOf(t, raw) != "" {
			t.Fatalf("an event from before the join: %s %v, want it redacted", raw, err)
		}
		if raw, err := f.rooms.FederationEvent(ctx, remote, after); err != nil || bodyOf(t, raw) != "after carol" {
			t.Fatalf("an event from after the join: %s %v", raw, err)
		}
		_, err := f.rooms.FederationEvent(ctx, "other.test", after)
		wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN")
		_, err = f.rooms.FederationEvent(ctx, remote, "$unknown")
		wantErr(t, err, http.StatusNotFound, "M_NOT_FOUND")

		// The state before an event, with its auth chain.
		ids, err := f.rooms.FederationStateIDs(ctx, remote, roomID, after)
		if err != nil || !slices.Contains(ids.PDUIDs, carolJoin) || !slices.Contains(ids.PDUIDs, f.stateID(roomID, "m.room.create", "")) ||
			slices.Contains(ids.PDUIDs, after) || len(ids.AuthChainIDs) == 0 {
			t.Fatalf("state_ids %+v %v", ids, err)
		}
		_, err = f.rooms.FederationStateIDs(ctx, "other.test", roomID, after)
		wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN")

		// Missing events: between earliest and latest, oldest first.
		missing, err := f.rooms.FederationMissingEvents(ctx, remote, roomID, roomserver.MissingEventsRequest{
			EarliestEvents: []string{before}, LatestEvents: []string{after}})
		if err != nil || len(missing) != 1 || eventID(t, missing[0]) != carolJoin {
			t.Fatalf("missing events between %d events %v", len(missing), err)
		}
		zero := 0
		_, err = f.rooms.FederationMissingEvents(ctx, remote, roomID, roomserver.MissingEventsRequest{LatestEvents: []string{after}, Limit: &zero})
		wantErr(t, err, http.StatusBadRequest, "M_INVALID_PARAM")

		// Carol leaves: what follows is not remote.test's to read, what
		// came before still is.
		stateKey := carol
		leave := f.build(remoteEvent{roomID: roomID, sender: carol, evType: "m.room.member", stateKey: &stateKey,
			content: map[string]any{"membership": "leave"}, prev: []string{f.latest(roomID)}, auth: f.carolAuth(roomID)})
		if res := f.receive(leave); res[leave.EventID()] != "" {
			t.Fatalf("carol's leave: %v", res)
		}
		if m := membership(t, f.rooms, alice, roomID, carol); m != "leave" {
			t.Fatalf("carol is %s", m)
		}
		later := send(t, f.rooms, alice, roomID, "after carol left")
		_, err = f.rooms.FederationEvent(ctx, remote, later)
		wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN")
		if raw, err := f.rooms.FederationEvent(ctx, remote, after); err != nil || bodyOf(t, raw) != "after carol" {
			t.Fatalf("an event from while carol was in: %s %v", raw, err)
		}
	})
}

// eventID is the ID of a PDU of the default room version.
func eventID(t *testing.T, raw json.RawMessage) string {
	t.Helper()
	ev, err := gmslVersion().NewEventFromTrustedJSON(raw, false)
	if err != nil {
		t.Fatal(err)
	}
	return ev.EventID()
}
