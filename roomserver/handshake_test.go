package roomserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/matrix-org/gomatrixserverlib"

	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/roomserver"
)

// A user of another server joins only where the auth rules let them, in
// a room version their server supports, and leaves through
// /make_leave and /send_leave.
func TestRemoteJoinAndLeave(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		f := newFedRooms(t, db)
		versions := []string{string(roomserver.DefaultRoomVersion)}

		private := createRoom(t, f.rooms, alice, roomserver.CreateRoomRequest{Preset: "private_chat"})
		_, err := f.rooms.MakeJoin(ctx, remote, private, carol, versions)
		wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN")
		_, err = f.rooms.MakeJoin(ctx, remote, "!nowhere:local.test", carol, versions)
		wantErr(t, err, http.StatusNotFound, "M_NOT_FOUND")

		public := createRoom(t, f.rooms, alice, roomserver.CreateRoomRequest{Preset: "public_chat"})
		_, err = f.rooms.MakeJoin(ctx, remote, public, carol, []string{"1", "2"})
		wantErr(t, err, http.StatusBadRequest, "M_INCOMPATIBLE_ROOM_VERSION")
		// Another server's user is not remote.test's to join.
		_, err = f.rooms.MakeJoin(ctx, remote, public, "@dan:third.test", versions)
		wantStatus(t, err, http.StatusForbidden)

		if err := f.rooms.Ban(ctx, alice, public, carol, ""); err != nil {
			t.Fatal(err)
		}
		_, err = f.rooms.MakeJoin(ctx, remote, public, carol, versions)
		wantErr(t, err, http.StatusForbidden, "M_FORBIDDEN")

		// Joined, carol leaves.
		roomID := f.roomWithCarol()
		tmpl, err := f.rooms.MakeLeave(ctx, remote, roomID, carol)
		if err != nil {
			t.Fatal(err)
		}
		leave, err := gomatrixserverlib.MustGetRoomVersion(gomatrixserverlib.RoomVersion(tmpl.RoomVersion)).
			NewEventBuilderFromProtoEvent(&tmpl.Event).Build(t0, remote, remoteID, f.remoteKey)
		if err != nil {
			t.Fatal(err)
		}
		wantErr(t, f.rooms.SendLeave(ctx, "third.test", roomID, leave.EventID(), leave.JSON()), http.StatusBadRequest, "M_INVALID_PARAM")
		wantErr(t, f.rooms.SendLeave(ctx, remote, roomID, "$other", leave.JSON()), http.StatusBadRequest, "M_INVALID_PARAM")
		if m := membership(t, f.rooms, alice, roomID, carol); m != "join" {
			t.Fatalf("refused leaves made carol %s", m)
		}
		if err := f.rooms.SendLeave(ctx, remote, roomID, leave.EventID(), leave.JSON()); err != nil {
			t.Fatal(err)
		}
		if m := membership(t, f.rooms, alice, roomID, carol); m != "leave" {
			t.Fatalf("after send_leave carol is %s", m)
		}
	})
}

// An invite of a local user to a room of another server is signed by
// this server and kept: the invitee sees it with the stripped state it
// came with. Invites that are not for this server's users, or not from
// the requesting server, are refused.
func TestReceiveInvite(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		f := newFedRooms(t, db)
		const remoteRoom = "!elsewhere:remote.test"
		invite := func(target string) gomatrixserverlib.PDU {
			return f.build(remoteEvent{roomID: remoteRoom, sender: carol, evType: "m.room.member", stateKey: &target,
				content: map[string]any{"membership": "invite"}, prev: []string{"$prev"}, auth: []string{"$create", "$pl", "$carol"}, depth: 7})
		}
		stripped := []json.RawMessage{
			json.RawMessage(`{"type":"m.room.create","state_key":"","sender":"` + carol + `","content":{"room_version":"10"}}`),
			json.RawMessage(`{"type":"m.room.name","state_key":"","sender":"` + carol + `","content":{"name":"Elsewhere"}}`),
		}
		version := string(roomserver.DefaultRoomVersion)

		ev := invite(alice)
		signed, err := f.rooms.ReceiveInvite(ctx, remote, remoteRoom, ev.EventID(),
			roomserver.InviteRequest{RoomVersion: version, Event: ev.JSON(), InviteRoomState: stripped})
		if err != nil {
			t.Fatal(err)
		}
		var sigs struct {
			Signatures map[string]map[string]string `json:"signatures"`
		}
		_ = json.Unmarshal(signed, &sigs)
		if sigs.Signatures[local]["ed25519:k"] == "" || sigs.Signatures[remote][string(remoteID)] == "" {
			t.Fatalf("the signed invite's signatures %v", sigs.Signatures)
		}

		res, _ := syncRooms(t, f.rooms, f.store, alice, 0, roomserver.Filter{})
		inv := res.Invite[remoteRoom]
		if inv == nil {
			t.Fatalf("alice's invites %v", sortedKeys(res.Invite))
		}
		seen := map[string]bool{}
		for _, st := range inv.InviteState.Events {
			seen[st.Type()] = true
		}
		if !seen["m.room.create"] || !seen["m.room.name"] || !seen["m.room.member"] {
			t.Fatalf("invite state %v", seen)
		}
		if got, _ := f.rooms.JoinedRooms(ctx, alice); len(got) != 0 {
			t.Fatalf("an invite joined alice to %v", got)
		}

		for name, c := range map[string]struct {
			origin, eventID, version string
			ev                       gomatrixserverlib.PDU
			status                   int
			code                     string
		}{
			"a remote invitee":    {remote, "", version, invite("@dan:third.test"), 400, "M_INVALID_PARAM"},
			"another origin":      {"third.test", "", version, invite(bob), 400, "M_INVALID_PARAM"},
			"another event ID":    {remote, "$other", version, invite(bob), 400, "M_INVALID_PARAM"},
			"unsupported version": {remote, "", "999", invite(bob), 400, "M_UNSUPPORTED_ROOM_VERSION"},
		} {
			id := c.eventID
			if id == "" {
				id = c.ev.EventID()
			}
			_, err := f.rooms.ReceiveInvite(ctx, c.origin, remoteRoom, id, roomserver.InviteRequest{RoomVersion: c.version, Event: c.ev.JSON()})
			if err == nil {
				t.Fatalf("%s: accepted", name)
			}
			wantErr(t, err, c.status, c.code)
		}
		if res, _ := syncRooms(t, f.rooms, f.store, bob, 0, roomserver.Filter{}); len(res.Invite) != 0 {
			t.Fatalf("a refused invite reached bob: %v", sortedKeys(res.Invite))
		}
	})
}
