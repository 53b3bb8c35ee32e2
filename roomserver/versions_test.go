package roomserver_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/roomserver"
)

// Every stable room version can be created, joined, written to, redacted
// in and read: event IDs have the version's format (v1 and v2 name their
// server, later ones are hashes), and the auth rules of each apply.
func TestEveryStableRoomVersion(t *testing.T) {
	forEachDatabase(t, func(t *testing.T, rooms *roomserver.Service) {
		ctx := context.Background()
		var versions []string
		for v, stability := range roomserver.RoomVersions() {
			if stability == "stable" {
				versions = append(versions, v)
			}
		}
		slices.Sort(versions)
		if len(versions) < 11 {
			t.Fatalf("stable versions %v", versions)
		}
		for _, v := range versions {
			r, err := rooms.CreateRoom(ctx, alice, roomserver.CreateRoomRequest{Preset: "public_chat", RoomVersion: v})
			if err != nil {
				t.Fatalf("v%s: %v", v, err)
			}
			if c := stateContent(t, rooms, alice, r, "m.room.create", ""); c["room_version"] != v {
				t.Fatalf("v%s: create %v", v, c)
			}
			mustJoin(t, rooms, bob, r)
			id := send(t, rooms, alice, r, "in v"+v)
			if named := strings.HasSuffix(id, ":"+local); named != (v == "1" || v == "2") {
				t.Fatalf("v%s: event ID %s", v, id)
			}
			if _, err := rooms.Redact(ctx, bob, "D", r, id, "r"+v, ""); err == nil {
				t.Fatalf("v%s: bob redacted alice's message", v)
			} else {
				wantStatus(t, err, http.StatusForbidden)
			}
			if _, err := rooms.Redact(ctx, alice, "D", r, id, "r"+v, ""); err != nil {
				t.Fatalf("v%s: redacting: %v", v, err)
			}
			ev, err := rooms.Event(ctx, bob, r, id)
			if err != nil || string(ev.Content) != "{}" {
				t.Fatalf("v%s: the redacted message %s %v", v, ev.Content, err)
			}
			res, err := rooms.Messages(ctx, roomserver.MessagesRequest{UserID: bob, RoomID: r, Dir: "b", Limit: "1"})
			if err != nil || len(res.Chunk) != 1 || res.Chunk[0].Type != "m.room.redaction" || res.Chunk[0].Redacts != id {
				t.Fatalf("v%s: the last event %+v %v", v, res.Chunk, err)
			}
			var c map[string]any
			_ = json.Unmarshal(res.Chunk[0].Content, &c)
			// content.redacts (read from v11 on) in every version.
			if c["redacts"] != id {
				t.Fatalf("v%s: a redaction's content %v lacks redacts", v, c)
			}
		}
	})
}
