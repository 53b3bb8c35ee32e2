package federationsender

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/keyserver/keyserver/internal/clock"
)

const masterKey = `{"keys":{"ed25519:MSK":"MSK"},"usage":["master"],"user_id":"@a:l"}`

// Signing-key updates travel with device-list updates, in their queue
// order, at most 100 EDUs in a transaction.
func TestSigningKeyUpdatesShareBatches(t *testing.T) {
	ctx := context.Background()
	q := newFakeQueue()
	q.add("remote.test", 99)
	q.addSigningKeys("remote.test", "@a:local.test")
	q.addSigningKeys("remote.test", "@b:local.test")
	tr := &scriptedTransport{}
	s := startTest(q, tr, Options{Clock: clock.NewFake()})
	s.wake("remote.test", false)
	s.process(ctx, take(t, s))
	s.process(ctx, take(t, s))
	got := tr.delivered()
	if len(got) != 2 || len(got[0].EDUs) != 100 || len(got[1].EDUs) != 1 {
		t.Fatalf("delivered %d transactions: %v", len(got), got)
	}
	for i, want := range map[int]string{0: "m.device_list_update", 98: "m.device_list_update", 99: "m.signing_key_update"} {
		if e := got[0].EDUs[i]; e.Type != want {
			t.Errorf("EDU %d is %s, want %s", i, e.Type, want)
		}
	}
	var last struct {
		UserID    string          `json:"user_id"`
		MasterKey json.RawMessage `json:"master_key"`
	}
	if e := got[1].EDUs[0]; e.Type != "m.signing_key_update" || json.Unmarshal(e.Content, &last) != nil ||
		last.UserID != "@b:local.test" || string(last.MasterKey) != masterKey {
		t.Fatalf("second transaction: %s %s", e.Type, e.Content)
	}
	if q.left("remote.test") != 0 {
		t.Fatalf("%d updates left", q.left("remote.test"))
	}
}
