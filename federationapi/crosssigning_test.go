package federationapi_test

import (
	"net/url"
	"testing"

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
