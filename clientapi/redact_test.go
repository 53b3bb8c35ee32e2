package clientapi_test

import (
	"net/url"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

// Redactions: of one's own events and, with the redact level, of
// others'; the redacted event is served stripped, with the redaction in
// unsigned.redacted_because; a state event stays state, stripped.
func TestRoomRedaction(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		for _, version := range []string{"10", "11", "1"} {
			roomID := createRoom(t, srv, alice, map[string]any{"preset": "public_chat", "room_version": version})
			srv.Must(t, "POST", v3+"/join/"+url.PathEscape(roomID), bob.Token, nil)
			send := func(u *testutil.User, txn, body string) string {
				t.Helper()
				return srv.Must(t, "PUT", roomPath(roomID, "/send/m.room.message/"+txn), u.Token, map[string]any{"body": body, "msgtype": "m.text"})["event_id"].(string)
			}
			event := func(id string) map[string]any {
				t.Helper()
				return srv.Must(t, "GET", roomPath(roomID, "/event/"+url.PathEscape(id)), alice.Token, nil)
			}
			redact := func(u *testutil.User, id, txn string) string {
				t.Helper()
				return srv.Must(t, "PUT", roomPath(roomID, "/redact/"+url.PathEscape(id)+"/"+txn), u.Token, map[string]any{"reason": "oops"})["event_id"].(string)
			}
			redactedBy := func(id string) string {
				t.Helper()
				ev := event(id)
				if len(ev["content"].(map[string]any)) != 0 {
					return ""
				}
				because, _ := ev["unsigned"].(map[string]any)["redacted_because"].(map[string]any)
				s, _ := because["event_id"].(string)
				return s
			}

			own := send(bob, "t1", "bob's own")
			r1 := redact(bob, own, "r1")
			if again := redact(bob, own, "r1"); again != r1 {
				t.Fatalf("v%s: a retried redaction made another event", version)
			}
			if by := redactedBy(own); by != r1 {
				t.Fatalf("v%s: bob's own message after his redaction: %v", version, event(own))
			}

			alices := send(alice, "t2", "alice's")
			expectError(t, srv, "PUT", roomPath(roomID, "/redact/"+url.PathEscape(alices)+"/r2"), bob.Token, map[string]any{}, 403, "M_FORBIDDEN")
			if body := event(alices)["content"].(map[string]any)["body"]; body != "alice's" {
				t.Fatalf("v%s: a refused redaction changed the event: %v", version, event(alices))
			}
			bobs := send(bob, "t3", "bob's")
			r3 := redact(alice, bobs, "r3") // the creator has the redact level
			if by := redactedBy(bobs); by != r3 {
				t.Fatalf("v%s: bob's message after alice's redaction: %v", version, event(bobs))
			}
			expectError(t, srv, "PUT", roomPath(roomID, "/redact/"+url.PathEscape("$nothing")+"/r4"), alice.Token, map[string]any{}, 404, "M_NOT_FOUND")
			expectError(t, srv, "PUT", roomPath(roomID, "/send/m.room.redaction/r5"), alice.Token, map[string]any{}, 400, "M_BAD_JSON")

			// The redaction names its target where clients look for it.
			red := event(r3)
			redacts, _ := red["redacts"].(string)
			if version == "11" {
				redacts, _ = red["content"].(map[string]any)["redacts"].(string)
			}
			if redacts != bobs {
				t.Fatalf("v%s: the redaction does not name its target: %v", version, red)
			}

			// A redacted state event stays state, without its content.
			topic := srv.Must(t, "PUT", roomPath(roomID, "/state/m.room.topic/"), alice.Token, map[string]any{"topic": "secret"})["event_id"].(string)
			redact(alice, topic, "r6")
			for _, ev := range roomState(t, srv, alice, roomID) {
				if ev["type"] == "m.room.topic" && (ev["event_id"] != topic || len(ev["content"].(map[string]any)) != 0) {
					t.Fatalf("v%s: the redacted topic in the state: %v", version, ev)
				}
			}
		}
	})
}
