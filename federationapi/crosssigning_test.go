package federationapi_test

import (
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/testutil"
)

// Other servers get a user's master and self-signing keys (never the
// user-signing key) from /user/keys/query and /user/devices, devices and
// master key with the signatures the user made on them, and no signature
// another user made with their user-signing key.
func TestFederationAnswersCrossSigningKeys(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		b := testutil.StartNode(t, db, nil)
		origin := testutil.NewOrigin(t)
		alice := b.Register(t, "alice", "ALICEDEV")
		carol := b.Register(t, "carol", "CAROLDEV")
		b.Upload(t, alice, map[string]any{"device_keys": alice.DeviceKeys(t)})
		ax, cx := testutil.NewCrossSigning(alice.UserID), testutil.NewCrossSigning(carol.UserID)
		b.Must(t, "POST", "/_matrix/client/v3/keys/device_signing/upload", alice.Token, ax.Upload(t))
		b.Must(t, "POST", "/_matrix/client/v3/keys/device_signing/upload", carol.Token, cx.Upload(t))
		aMaster := testutil.PublicKey(ax.Master)
		signedDevice := testutil.SignWith(t, alice.DeviceKeys(t), alice.UserID, ax.SelfSigning)
		for _, up := range []struct {
			u    *testutil.User
			body map[string]any
		}{
			{alice, map[string]any{alice.UserID: map[string]any{
				"ALICEDEV": signedDevice,
				aMaster:    testutil.Sign(t, ax.MasterKey(), alice.UserID, "ALICEDEV", alice.Key),
			}}},
			{carol, map[string]any{alice.UserID: map[string]any{aMaster: testutil.SignWith(t, ax.MasterKey(), carol.UserID, cx.UserSigning)}}},
		} {
			r := b.Must(t, "POST", "/_matrix/client/v3/keys/signatures/upload", up.u.Token, up.body)
			if f, _ := r["failures"].(map[string]any); len(f) != 0 {
				t.Fatalf("signature upload failures: %v", f)
			}
		}
		sskID := "ed25519:" + testutil.PublicKey(ax.SelfSigning)
		wantDeviceSig := signedDevice["signatures"].(map[string]any)[alice.UserID].(map[string]any)[sskID]
		checkMaster := func(where string, m any) {
			t.Helper()
			if canonical(t, withoutSigs(m)) != canonical(t, withoutSigs(ax.MasterKey())) {
				t.Errorf("%s: master key %v", where, m)
			}
			sigs, _ := m.(map[string]any)["signatures"].(map[string]any)
			if mine, _ := sigs[alice.UserID].(map[string]any); mine["ed25519:ALICEDEV"] == nil {
				t.Errorf("%s: alice's device signature on her master key is missing: %v", where, m)
			}
			if sigs[carol.UserID] != nil {
				t.Errorf("%s: carol's user-signing signature is shown to another server: %v", where, m)
			}
		}
		checkDevice := func(where string, d any) {
			t.Helper()
			sigs, _ := d.(map[string]any)["signatures"].(map[string]any)
			if mine, _ := sigs[alice.UserID].(map[string]any); mine[sskID] != wantDeviceSig {
				t.Errorf("%s: device without its self-signing signature: %v", where, d)
			}
		}

		fr := testutil.SendTo(t, b, origin.SignedRequest(t, "POST", b.ServerName, "/_matrix/federation/v1/user/keys/query",
			map[string]any{"device_keys": map[string][]string{alice.UserID: {}}}, "", nil))
		if fr.Status != 200 {
			t.Fatalf("/user/keys/query: %d %s", fr.Status, fr.Raw)
		}
		checkMaster("/user/keys/query", fr.Body["master_keys"].(map[string]any)[alice.UserID])
		if ssk := fr.Body["self_signing_keys"].(map[string]any)[alice.UserID]; canonical(t, ssk) != canonical(t, ax.SelfSigningKey(t)) {
			t.Errorf("/user/keys/query: self-signing key %v", ssk)
		}
		if _, ok := fr.Body["user_signing_keys"]; ok {
			t.Errorf("/user/keys/query answers user_signing_keys: %s", fr.Raw)
		}
		checkDevice("/user/keys/query", devicesOf(t, fr.Body, alice.UserID)["ALICEDEV"])

		fr = testutil.SendTo(t, b, origin.SignedRequest(t, "GET", b.ServerName, devicesPath+url.PathEscape(alice.UserID), nil, "", nil))
		if fr.Status != 200 {
			t.Fatalf("/user/devices: %d %s", fr.Status, fr.Raw)
		}
		checkMaster("/user/devices", fr.Body["master_key"])
		if ssk := fr.Body["self_signing_key"]; canonical(t, ssk) != canonical(t, ax.SelfSigningKey(t)) {
			t.Errorf("/user/devices: self-signing key %v", ssk)
		}
		if _, ok := fr.Body["user_signing_key"]; ok {
			t.Errorf("/user/devices answers user_signing_key: %s", fr.Raw)
		}
		devices, _ := fr.Body["devices"].([]any)
		if len(devices) != 1 {
			t.Fatalf("/user/devices: %s", fr.Raw)
		}
		checkDevice("/user/devices", devices[0].(map[string]any)["keys"])
	})
}

func withoutSigs(v any) map[string]any {
	m, _ := v.(map[string]any)
	out := map[string]any{}
	for k, x := range m {
		if k != "signatures" && k != "unsigned" {
			out[k] = x
		}
	}
	return out
}

// A remote user's master and self-signing keys come with their device
// list from their server (two real daemons here), are cached with it and
// answered from the cache; their user-signing key is never asked for.
func TestRemoteCrossSigningKeysCachedWithTheList(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a := testutil.StartNode(t, db, nil)
		b := testutil.StartNode(t, testutil.SQLite(t), nil)
		bob := a.Register(t, "bob", "")
		alice := b.Register(t, "alice", "ALICEDEV")
		b.Upload(t, alice, map[string]any{"device_keys": alice.DeviceKeys(t)})
		ax := testutil.NewCrossSigning(alice.UserID)
		b.Must(t, "POST", "/_matrix/client/v3/keys/device_signing/upload", alice.Token, ax.Upload(t))

		for i := 0; i < 2; i++ {
			r := query(t, a, bob, map[string][]string{alice.UserID: {}}, 10000)
			if f := failuresOf(r); len(f) != 0 {
				t.Fatalf("failures %v", f)
			}
			if m := r["master_keys"].(map[string]any)[alice.UserID]; canonical(t, m) != canonical(t, ax.MasterKey()) {
				t.Errorf("query %d: master key %v", i, m)
			}
			if ssk := r["self_signing_keys"].(map[string]any)[alice.UserID]; canonical(t, ssk) != canonical(t, ax.SelfSigningKey(t)) {
				t.Errorf("query %d: self-signing key %v", i, ssk)
			}
			if usk := r["user_signing_keys"].(map[string]any); len(usk) != 0 {
				t.Errorf("query %d: user-signing keys %v", i, usk)
			}
		}
		if n := b.Requests.Count("GET", devicesPath); n != 1 {
			t.Errorf("%d /user/devices requests, want 1 (the second query from the cache)", n)
		}

		// Bob verifies alice: his user-signing key signs her cached master
		// key. The signature stays on A, shown to bob alone.
		bx := testutil.NewCrossSigning(bob.UserID)
		a.Must(t, "POST", "/_matrix/client/v3/keys/device_signing/upload", bob.Token, bx.Upload(t))
		carol := a.Register(t, "carol", "")
		from := a.Must(t, "GET", "/_matrix/client/v3/sync", bob.Token, nil)["next_batch"].(string)
		signed := testutil.SignWith(t, ax.MasterKey(), bob.UserID, bx.UserSigning)
		r := a.Must(t, "POST", "/_matrix/client/v3/keys/signatures/upload", bob.Token, map[string]any{
			alice.UserID: map[string]any{testutil.PublicKey(ax.Master): signed,
				"ALICEDEV": testutil.SignWith(t, withoutSigs(alice.DeviceKeys(t)), bob.UserID, bx.UserSigning)}})
		f, _ := r["failures"].(map[string]any)
		if mine, _ := f[alice.UserID].(map[string]any); len(mine) != 1 || mine["ALICEDEV"] == nil {
			t.Fatalf("failures %v, want alice's device alone", f)
		}
		uskID := "ed25519:" + testutil.PublicKey(bx.UserSigning)
		want := signed["signatures"].(map[string]any)[bob.UserID].(map[string]any)[uskID]
		for _, viewer := range []*testutil.User{bob, carol} {
			r := query(t, a, viewer, map[string][]string{alice.UserID: {}}, 10000)
			m, _ := r["master_keys"].(map[string]any)[alice.UserID].(map[string]any)
			sigs, _ := m["signatures"].(map[string]any)
			got, _ := sigs[bob.UserID].(map[string]any)
			if viewer == bob && got[uskID] != want {
				t.Errorf("bob does not see his signature on alice's master key: %v", m)
			}
			if viewer == carol && got != nil {
				t.Errorf("carol sees bob's signature on alice's master key: %v", m)
			}
			if canonical(t, withoutSigs(m)) != canonical(t, withoutSigs(ax.MasterKey())) {
				t.Errorf("alice's master key as %s sees it: %v", viewer.UserID, m)
			}
		}
		to := a.Must(t, "GET", "/_matrix/client/v3/sync", bob.Token, nil)["next_batch"].(string)
		ch := a.Must(t, "GET", "/_matrix/client/v3/keys/changes?from="+from+"&to="+to, bob.Token, nil)["changed"].([]any)
		if len(ch) != 1 || ch[0] != bob.UserID {
			t.Errorf("bob's changes after signing alice: %v", ch)
		}
	})
}

// crossSigningRemote is a remote server whose user's cross-signing keys the
// test controls: /user/devices answers them, and EDUs announce new ones.
type crossSigningRemote struct {
	*testutil.Origin
	user string
	keys *testutil.CrossSigning
	txn  int
}

func newCrossSigningRemote(t *testing.T) *crossSigningRemote {
	f := &crossSigningRemote{Origin: testutil.NewOrigin(t)}
	f.user = "@xavier:" + f.Name
	f.keys = testutil.NewCrossSigning(f.user)
	f.Mux.HandleFunc("GET /_matrix/federation/v1/user/devices/{user}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, map[string]any{"user_id": f.user, "stream_id": 1, "devices": []any{},
			"master_key": f.keys.MasterKey(), "self_signing_key": f.keys.SelfSigningKey(t)})
	})
	return f
}

func (f *crossSigningRemote) send(t *testing.T, n *testutil.Node, content map[string]any) {
	t.Helper()
	f.txn++
	body := map[string]any{"origin": f.Name, "origin_server_ts": time.Now().UnixMilli(), "pdus": []any{},
		"edus": []any{map[string]any{"edu_type": "m.signing_key_update", "content": content}}}
	r := testutil.SendTo(t, n, f.SignedRequest(t, "PUT", n.ServerName, f.SendPath(fmt.Sprintf("x%d", f.txn)), body, "", nil))
	if r.Status != 200 {
		t.Fatalf("/send: %d %s", r.Status, r.Raw)
	}
}

// An incoming m.signing_key_update replaces the cached keys once /send has
// answered, and is a change for local users sharing a room with its user;
// one with keys that do not check out, or about a user of another server,
// changes nothing.
func TestIncomingSigningKeyUpdate(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a := testutil.StartNode(t, db, nil)
		alice := a.Register(t, "alice", "")
		x := newCrossSigningRemote(t)
		a.Join(t, "!room:x", alice.UserID)
		a.Join(t, "!room:x", x.user)
		firstFetch(t, a, alice, x.user)
		masterOf := func() any {
			t.Helper()
			r := query(t, a, alice, map[string][]string{x.user: {}}, 10000)
			return r["master_keys"].(map[string]any)[x.user]
		}
		if m := masterOf(); canonical(t, m) != canonical(t, x.keys.MasterKey()) {
			t.Fatalf("cached master key %v", m)
		}
		changedSince := func(from string) []any {
			t.Helper()
			to := a.Must(t, "GET", "/_matrix/client/v3/sync", alice.Token, nil)["next_batch"].(string)
			r := a.Must(t, "GET", "/_matrix/client/v3/keys/changes?from="+from+"&to="+to, alice.Token, nil)
			return r["changed"].([]any)
		}

		next := testutil.NewCrossSigning(x.user)
		other := testutil.NewCrossSigning(x.user)
		from := a.Must(t, "GET", "/_matrix/client/v3/sync", alice.Token, nil)["next_batch"].(string)
		// Refused: a self-signing key not signed by the master key, a
		// master key of another user, an update about another server's user.
		x.send(t, a, map[string]any{"user_id": x.user, "master_key": next.MasterKey(),
			"self_signing_key": testutil.SignWith(t, testutil.KeyObject(x.user, "self_signing", next.SelfSigning), x.user, other.Master)})
		x.send(t, a, map[string]any{"user_id": x.user, "master_key": testutil.NewCrossSigning("@else:" + x.Name).MasterKey()})
		x.send(t, a, map[string]any{"user_id": "@xavier:elsewhere.example", "master_key": next.MasterKey()})
		if m := masterOf(); canonical(t, m) != canonical(t, x.keys.MasterKey()) {
			t.Fatalf("a refused update changed the master key: %v", m)
		}
		if ch := changedSince(from); len(ch) != 0 {
			t.Fatalf("refused updates are changes: %v", ch)
		}

		x.send(t, a, map[string]any{"user_id": x.user, "master_key": next.MasterKey(), "self_signing_key": next.SelfSigningKey(t)})
		if m := masterOf(); canonical(t, m) != canonical(t, next.MasterKey()) {
			t.Fatalf("master key after the update %v", m)
		}
		r := query(t, a, alice, map[string][]string{x.user: {}}, 10000)
		if ssk := r["self_signing_keys"].(map[string]any)[x.user]; canonical(t, ssk) != canonical(t, next.SelfSigningKey(t)) {
			t.Errorf("self-signing key after the update %v", ssk)
		}
		if ch := changedSince(from); len(ch) != 1 || ch[0] != x.user {
			t.Errorf("changed after the update: %v, want [%s]", ch, x.user)
		}
		// The same keys again are no change.
		from = a.Must(t, "GET", "/_matrix/client/v3/sync", alice.Token, nil)["next_batch"].(string)
		x.send(t, a, map[string]any{"user_id": x.user, "master_key": next.MasterKey()})
		if ch := changedSince(from); len(ch) != 0 {
			t.Errorf("an identical update is a change: %v", ch)
		}
	})
}
