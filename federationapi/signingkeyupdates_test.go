package federationapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

const signingUploadPath = "/_matrix/client/v3/keys/device_signing/upload"

// eduWatcher is a third server in the room that records the EDUs it is
// sent, to see exactly what goes over the wire.
type eduWatcher struct {
	*testutil.Origin
	user string
	mu   sync.Mutex
	edus []sentEDU
}

type sentEDU struct {
	Type    string          `json:"edu_type"`
	Content json.RawMessage `json:"content"`
}

func newEDUWatcher(t *testing.T) *eduWatcher {
	w := &eduWatcher{Origin: testutil.NewOrigin(t)}
	w.user = "@watcher:" + w.Name
	w.Mux.HandleFunc("GET /_matrix/federation/v1/user/devices/{user}", func(rw http.ResponseWriter, r *http.Request) {
		writeJSON(rw, map[string]any{"user_id": w.user, "stream_id": 1, "devices": []any{}})
	})
	w.Mux.HandleFunc("PUT /_matrix/federation/v1/send/{txn}", func(rw http.ResponseWriter, r *http.Request) {
		var body struct {
			EDUs []sentEDU `json:"edus"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(rw, err.Error(), http.StatusBadRequest)
			return
		}
		w.mu.Lock()
		w.edus = append(w.edus, body.EDUs...)
		w.mu.Unlock()
		writeJSON(rw, map[string]any{"pdus": map[string]any{}})
	})
	return w
}

// received returns the EDUs of a type about userID, in arrival order.
func (w *eduWatcher) received(eduType, userID string) []map[string]json.RawMessage {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []map[string]json.RawMessage
	for _, e := range w.edus {
		var c map[string]json.RawMessage
		if e.Type != eduType || json.Unmarshal(e.Content, &c) != nil || string(c["user_id"]) != `"`+userID+`"` {
			continue
		}
		out = append(out, c)
	}
	return out
}

func (w *eduWatcher) raw() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	b, _ := json.Marshal(w.edus)
	return string(b)
}

// crossSigningOf is what a /keys/query on n by u answers of userID's
// master and self-signing keys, and its device deviceID.
func crossSigningOf(t *testing.T, n *testutil.Node, u *testutil.User, userID, deviceID string) (master, ssk, device any) {
	t.Helper()
	r := query(t, n, u, map[string][]string{userID: {}}, 10000)
	master = r["master_keys"].(map[string]any)[userID]
	ssk = r["self_signing_keys"].(map[string]any)[userID]
	if usk := r["user_signing_keys"].(map[string]any); len(usk) != 0 {
		t.Errorf("user-signing keys of others answered: %v", usk)
	}
	return master, ssk, devicesOf(t, r, userID)[deviceID]
}

// A user's new cross-signing keys reach the servers sharing a room with
// them as one m.signing_key_update each (master and self-signing key,
// never the user-signing key), so they answer the new keys and tell their
// users without fetching the list again; a self-signing signature on a
// device travels in the device's m.device_list_update; a new master key
// goes out the same way.
func TestSigningKeyUpdatesReachRemoteServers(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		p := newPair(t, db)
		w := newEDUWatcher(t)
		p.a.Join(t, sharedRoom, w.user)
		fetches := p.a.Requests.Count("GET", devicesPath)
		since := syncToken(t, p.b, p.bob)
		alice := p.alice.UserID

		ax := testutil.NewCrossSigning(alice)
		p.a.Must(t, "POST", signingUploadPath, p.alice.Token, ax.Upload(t))
		eventually(t, "B to answer alice's keys", func() bool {
			m, ssk, _ := crossSigningOf(t, p.b, p.bob, alice, "ALICE1")
			return canonical(t, m) == canonical(t, ax.MasterKey()) && canonical(t, ssk) == canonical(t, ax.SelfSigningKey(t))
		})
		s := p.b.Must(t, "GET", "/_matrix/client/v3/sync?timeout=0&since="+since, p.bob.Token, nil)
		changed, _ := s["device_lists"].(map[string]any)["changed"].([]any)
		if len(changed) != 1 || changed[0] != alice {
			t.Errorf("bob's sync after alice's new keys: changed %v", changed)
		}
		eventually(t, "the watcher to get the update", func() bool { return len(w.received("m.signing_key_update", alice)) == 1 })
		e := w.received("m.signing_key_update", alice)[0]
		if len(e) != 3 || canonical(t, e["master_key"]) != canonical(t, ax.MasterKey()) ||
			canonical(t, e["self_signing_key"]) != canonical(t, ax.SelfSigningKey(t)) {
			t.Errorf("m.signing_key_update content %v", e)
		}

		// Alice signs her device with her self-signing key: B shows the
		// signature.
		signed := testutil.SignWith(t, p.alice.DeviceKeys(t), alice, ax.SelfSigning)
		sskID := "ed25519:" + testutil.PublicKey(ax.SelfSigning)
		want := signed["signatures"].(map[string]any)[alice].(map[string]any)[sskID]
		r := p.a.Must(t, "POST", "/_matrix/client/v3/keys/signatures/upload", p.alice.Token, map[string]any{alice: map[string]any{"ALICE1": signed}})
		if f, _ := r["failures"].(map[string]any); len(f) != 0 {
			t.Fatalf("signature upload failures: %v", f)
		}
		eventually(t, "B to show the device signature", func() bool {
			_, _, d := crossSigningOf(t, p.b, p.bob, alice, "ALICE1")
			sigs, _ := d.(map[string]any)["signatures"].(map[string]any)
			mine, _ := sigs[alice].(map[string]any)
			return mine[sskID] == want
		})

		// A new master key (with a password) goes out too.
		next := testutil.NewCrossSigning(alice)
		body := next.Upload(t)
		ch := p.a.Do(t, "POST", signingUploadPath, p.alice.Token, body)
		session, _ := ch.Body["session"].(string)
		if ch.Status != http.StatusUnauthorized || session == "" {
			t.Fatalf("replacing the master key without a password: %d %s", ch.Status, ch.Raw)
		}
		body["auth"] = map[string]any{"type": "m.login.password", "session": session,
			"identifier": map[string]any{"type": "m.id.user", "user": "alice"}, "password": p.alice.Password}
		p.a.Must(t, "POST", signingUploadPath, p.alice.Token, body)
		eventually(t, "B to answer alice's new keys", func() bool {
			m, ssk, _ := crossSigningOf(t, p.b, p.bob, alice, "ALICE1")
			return canonical(t, m) == canonical(t, next.MasterKey()) && canonical(t, ssk) == canonical(t, next.SelfSigningKey(t))
		})
		eventually(t, "A's queue to empty", func() bool {
			pending, _ := p.a.Store.PendingDestinations(context.Background())
			return len(pending) == 0
		})

		if n := p.a.Requests.Count("GET", devicesPath); n != fetches {
			t.Errorf("B fetched alice's list %d times: the updates did not carry the change", n-fetches)
		}
		// Each change went out once; the device signature as a device
		// update, the user-signing keys never.
		if got := w.received("m.signing_key_update", alice); len(got) != 2 || canonical(t, got[1]["master_key"]) != canonical(t, next.MasterKey()) {
			t.Errorf("m.signing_key_update sent %d times: %v", len(got), got)
		}
		devs := w.received("m.device_list_update", alice)
		if len(devs) != 1 || !strings.Contains(string(devs[0]["keys"]), sskID) {
			t.Errorf("device updates %v, want one with the self-signing signature", devs)
		}
		for _, usk := range []string{testutil.PublicKey(ax.UserSigning), testutil.PublicKey(next.UserSigning)} {
			if raw := w.raw(); strings.Contains(raw, usk) || strings.Contains(raw, "user_signing") {
				t.Fatalf("a user-signing key left A: %s", raw)
			}
		}
	})
}

// An m.signing_key_update queued while the destination is down survives a
// restart of the sender and is delivered when the destination is back.
func TestSigningKeyUpdateSurvivesRestart(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		p := newPair(t, db)
		fetches := p.a.Requests.Count("GET", devicesPath)
		p.b.Stop()
		ax := testutil.NewCrossSigning(p.alice.UserID)
		p.a.Must(t, "POST", signingUploadPath, p.alice.Token, ax.Upload(t))
		pending, err := p.a.Store.PendingDestinations(context.Background())
		if err != nil || len(pending) != 1 || pending[0] != p.b.ServerName {
			t.Fatalf("queue while B is down: %v %v", pending, err)
		}
		p.a.Stop()
		p.a.Restart()
		p.b.Restart()
		eventually(t, "the queued update to arrive", func() bool {
			m, ssk, _ := crossSigningOf(t, p.b, p.bob, p.alice.UserID, "ALICE1")
			return canonical(t, m) == canonical(t, ax.MasterKey()) && canonical(t, ssk) == canonical(t, ax.SelfSigningKey(t))
		})
		eventually(t, "the queue to empty", func() bool {
			pending, _ := p.a.Store.PendingDestinations(context.Background())
			return len(pending) == 0
		})
		if n := p.a.Requests.Count("GET", devicesPath); n != fetches {
			t.Errorf("B fetched alice's list %d times instead of taking the update", n-fetches)
		}
	})
}
