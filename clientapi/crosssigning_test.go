package clientapi_test

import (
	"maps"
	"net/http"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

const (
	signingUploadPath    = "/_matrix/client/v3/keys/device_signing/upload"
	signaturesUploadPath = "/_matrix/client/v3/keys/signatures/upload"
)

// crossKeys returns master_keys, self_signing_keys and user_signing_keys
// of a query by u about users.
func crossKeys(t *testing.T, srv *testutil.Server, u *testutil.User, users ...string) (master, ssk, usk map[string]any) {
	t.Helper()
	req := map[string][]string{}
	for _, id := range users {
		req[id] = []string{}
	}
	r := queryKeys(t, srv, u, req)
	get := func(f string) map[string]any {
		m, ok := r[f].(map[string]any)
		if !ok {
			t.Fatalf("%s missing from %v", f, r)
		}
		return m
	}
	return get("master_keys"), get("self_signing_keys"), get("user_signing_keys")
}

// sigsOf returns signatures[signer] of a key object.
func sigsOf(obj any, signer string) map[string]any {
	m, _ := obj.(map[string]any)
	sigs, _ := m["signatures"].(map[string]any)
	s, _ := sigs[signer].(map[string]any)
	return s
}

func withoutSignatures(obj map[string]any) map[string]any {
	out := maps.Clone(obj)
	delete(out, "signatures")
	delete(out, "unsigned")
	return out
}

// Every malformed or wrongly signed upload of cross-signing keys is refused
// with 400 (403 for a key named like a device) and stores nothing; a
// first upload needs no password.
func TestCrossSigningUploadRejections(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		xs := testutil.NewCrossSigning(alice.UserID)
		// Another set, whose master key can be a device ID (no + or /).
		other := testutil.NewCrossSigning(alice.UserID)
		for strings.ContainsAny(testutil.PublicKey(other.Master), "+/") {
			other = testutil.NewCrossSigning(alice.UserID)
		}

		twoKeys := xs.MasterKey()
		twoKeys["keys"] = map[string]string{"ed25519:" + testutil.PublicKey(xs.Master): testutil.PublicKey(xs.Master),
			"ed25519:" + testutil.PublicKey(other.Master): testutil.PublicKey(other.Master)}
		misnamed := xs.MasterKey()
		misnamed["keys"] = map[string]string{"ed25519:abc": testutil.PublicKey(xs.Master)}
		wrongUsage := xs.MasterKey()
		wrongUsage["usage"] = []string{"self_signing"}
		noUser := xs.MasterKey()
		delete(noUser, "user_id")
		// A device whose ID is the public key of the next master key.
		srv.Login(t, alice, testutil.PublicKey(other.Master))

		for name, c := range map[string]struct {
			body    map[string]any
			status  int
			errcode string
		}{
			"another user's key":    {map[string]any{"master_key": testutil.NewCrossSigning(bob.UserID).MasterKey()}, 400, "M_INVALID_PARAM"},
			"wrong usage":           {map[string]any{"master_key": wrongUsage}, 400, "M_INVALID_PARAM"},
			"usage of another slot": {map[string]any{"master_key": xs.MasterKey(), "self_signing_key": xs.UserSigningKey(t)}, 400, "M_INVALID_PARAM"},
			"two keys in one slot":  {map[string]any{"master_key": twoKeys}, 400, "M_INVALID_PARAM"},
			"key misnamed":          {map[string]any{"master_key": misnamed}, 400, "M_INVALID_PARAM"},
			"no user_id":            {map[string]any{"master_key": noUser}, 400, "M_MISSING_PARAM"},
			"not an object":         {map[string]any{"master_key": "key"}, 400, "M_INVALID_PARAM"},
			"a list":                {map[string]any{"master_key": []any{}}, 400, "M_INVALID_PARAM"},
			"self-signing key without any master key": {map[string]any{"self_signing_key": xs.SelfSigningKey(t)}, 400, "M_MISSING_PARAM"},
			"self-signing key signed by another key": {map[string]any{"master_key": xs.MasterKey(),
				"self_signing_key": testutil.SignWith(t, testutil.KeyObject(alice.UserID, "self_signing", xs.SelfSigning), alice.UserID, other.Master)}, 400, "M_INVALID_SIGNATURE"},
			"self-signing key unsigned": {map[string]any{"master_key": xs.MasterKey(),
				"self_signing_key": testutil.KeyObject(alice.UserID, "self_signing", xs.SelfSigning)}, 400, "M_INVALID_SIGNATURE"},
			"user-signing key with a bad signature": {map[string]any{"master_key": xs.MasterKey(), "self_signing_key": xs.SelfSigningKey(t),
				"user_signing_key": tamper(xs.UserSigningKey(t), alice.UserID, testutil.PublicKey(xs.Master))}, 400, "M_INVALID_SIGNATURE"},
			"a key named like a device": {map[string]any{"master_key": testutil.KeyObject(alice.UserID, "master", other.Master)}, 403, "M_FORBIDDEN"},
		} {
			t.Run(name, func(t *testing.T) {
				acctExpectErr(t, srv.Do(t, "POST", signingUploadPath, alice.Token, c.body), c.status, c.errcode)
				master, ssk, usk := crossKeys(t, srv, alice, alice.UserID)
				if len(master)+len(ssk)+len(usk) != 0 {
					t.Errorf("stored after a refused upload: %v %v %v", master, ssk, usk)
				}
			})
		}

		// The first upload needs no auth, and is shown.
		acctExpectEmptyOK(t, srv.Do(t, "POST", signingUploadPath, alice.Token, xs.Upload(t)))
		master, ssk, usk := crossKeys(t, srv, alice, alice.UserID)
		if canonicalOf(t, master[alice.UserID]) != canonicalOf(t, xs.MasterKey()) ||
			canonicalOf(t, ssk[alice.UserID]) != canonicalOf(t, xs.SelfSigningKey(t)) ||
			canonicalOf(t, usk[alice.UserID]) != canonicalOf(t, xs.UserSigningKey(t)) {
			t.Fatalf("stored keys differ: %v %v %v", master, ssk, usk)
		}
		// Once a master key is stored, a self-signing key must be signed
		// by it.
		acctExpectErr(t, srv.Do(t, "POST", signingUploadPath, alice.Token, map[string]any{
			"self_signing_key": testutil.SignWith(t, testutil.KeyObject(alice.UserID, "self_signing", other.SelfSigning), alice.UserID, other.Master),
		}), 400, "M_INVALID_SIGNATURE")
	})
}

// tamper replaces signatures[userID]["ed25519:"+keyID] with another valid
// looking signature.
func tamper(obj map[string]any, userID, keyID string) map[string]any {
	sigs := obj["signatures"].(map[string]any)[userID].(map[string]any)
	sig := []byte(sigs["ed25519:"+keyID].(string))
	if sig[0] == 'A' {
		sig[0] = 'B'
	} else {
		sig[0] = 'A'
	}
	sigs["ed25519:"+keyID] = string(sig)
	return obj
}

// Sending the stored keys again changes nothing and needs no password;
// replacing them does, through user-interactive auth bound to the keys.
func TestCrossSigningReplacementNeedsPassword(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		carol := srv.Register(t, "carol", "")
		srv.Join(t, "!r:test.local", alice.UserID)
		srv.Join(t, "!r:test.local", carol.UserID)
		xs := testutil.NewCrossSigning(alice.UserID)
		acctExpectEmptyOK(t, srv.Do(t, "POST", signingUploadPath, alice.Token, xs.Upload(t)))

		from := syncToken(t, srv, carol)
		acctExpectEmptyOK(t, srv.Do(t, "POST", signingUploadPath, alice.Token, xs.Upload(t)))
		acctExpectEmptyOK(t, srv.Do(t, "POST", signingUploadPath, alice.Token, map[string]any{"master_key": xs.MasterKey()}))
		changed, _ := changesSince(t, srv, carol, from)
		expectUsers(t, "changed after identical uploads", changed, nil)
		changed, _ = changesSince(t, srv, alice, from)
		expectUsers(t, "alice's changes after identical uploads", changed, nil)

		next := testutil.NewCrossSigning(alice.UserID)
		body := next.Upload(t)
		session := acctExpectChallenge(t, srv.Do(t, "POST", signingUploadPath, alice.Token, body), "m.login.password")
		stillOld := func() {
			t.Helper()
			master, _, _ := crossKeys(t, srv, carol, alice.UserID)
			if canonicalOf(t, master[alice.UserID]) != canonicalOf(t, xs.MasterKey()) {
				t.Fatalf("the master key was replaced: %v", master[alice.UserID])
			}
		}
		stillOld()
		// A wrong password repeats the challenge.
		body["auth"] = acctPasswordAuth("alice", "wrong", session)
		r := srv.Do(t, "POST", signingUploadPath, alice.Token, body)
		acctExpectChallenge(t, r, "m.login.password")
		if r.Errcode() != "M_FORBIDDEN" {
			t.Errorf("wrong password: errcode %q", r.Errcode())
		}
		stillOld()
		// The session is bound to the keys it was started for.
		third := testutil.NewCrossSigning(alice.UserID).Upload(t)
		third["auth"] = acctPasswordAuth("alice", alice.Password, session)
		acctExpectErr(t, srv.Do(t, "POST", signingUploadPath, alice.Token, third), http.StatusForbidden, "M_FORBIDDEN")
		stillOld()
		// A new self-signing key alone, signed by the stored master key,
		// is a change too.
		acctExpectChallenge(t, srv.Do(t, "POST", signingUploadPath, alice.Token, map[string]any{
			"self_signing_key": testutil.SignWith(t, testutil.KeyObject(alice.UserID, "self_signing", next.SelfSigning), alice.UserID, xs.Master),
		}), "m.login.password")

		from = syncToken(t, srv, carol)
		body["auth"] = acctPasswordAuth("alice", alice.Password, session)
		acctExpectEmptyOK(t, srv.Do(t, "POST", signingUploadPath, alice.Token, body))
		master, ssk, _ := crossKeys(t, srv, carol, alice.UserID)
		if canonicalOf(t, master[alice.UserID]) != canonicalOf(t, next.MasterKey()) ||
			canonicalOf(t, ssk[alice.UserID]) != canonicalOf(t, next.SelfSigningKey(t)) {
			t.Fatalf("keys after replacement: %v %v", master, ssk)
		}
		changed, _ = changesSince(t, srv, carol, from)
		expectUsers(t, "changed after the replacement", changed, []string{alice.UserID})

		// A new user-signing key is alice's business alone.
		from = syncToken(t, srv, carol)
		usk := map[string]any{"user_signing_key": testutil.SignWith(t,
			testutil.KeyObject(alice.UserID, "user_signing", testutil.NewCrossSigning(alice.UserID).UserSigning), alice.UserID, next.Master)}
		usk["auth"] = acctPasswordAuth("alice", alice.Password, "")
		acctExpectEmptyOK(t, srv.Do(t, "POST", signingUploadPath, alice.Token, usk))
		changed, _ = changesSince(t, srv, carol, from)
		expectUsers(t, "carol's changes after alice's new user-signing key", changed, nil)
		changed, _ = changesSince(t, srv, alice, from)
		expectUsers(t, "alice's changes after her new user-signing key", changed, []string{alice.UserID})
	})
}

// Signatures are checked one by one: the good ones are stored although
// others fail, each failure named with its errcode. /keys/query shows
// them by the visibility rules, and device_lists.changed follows them.
func TestCrossSigningSignaturesUploadAndVisibility(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		bob := srv.Register(t, "bob", "")
		carol := srv.Register(t, "carol", "")
		srv.Join(t, "!r:test.local", alice.UserID)
		srv.Join(t, "!r:test.local", carol.UserID)
		for _, u := range []*testutil.User{alice, bob, carol} {
			srv.Upload(t, u, map[string]any{"device_keys": u.DeviceKeys(t)})
		}
		ax, bx := testutil.NewCrossSigning(alice.UserID), testutil.NewCrossSigning(bob.UserID)
		acctExpectEmptyOK(t, srv.Do(t, "POST", signingUploadPath, alice.Token, ax.Upload(t)))
		acctExpectEmptyOK(t, srv.Do(t, "POST", signingUploadPath, bob.Token, bx.Upload(t)))
		aliceDevice := deviceKeysOf(t, queryKeys(t, srv, alice, map[string][]string{alice.UserID: {}}), alice.UserID)[alice.DeviceID].(map[string]any)
		aliceDevice = withoutSignatures(aliceDevice)
		bobDevice := withoutSignatures(bob.DeviceKeys(t))
		aMaster, bMaster := testutil.PublicKey(ax.Master), testutil.PublicKey(bx.Master)

		signedDevice := testutil.SignWith(t, aliceDevice, alice.UserID, ax.SelfSigning)
		signedOwnMaster := testutil.Sign(t, ax.MasterKey(), alice.UserID, alice.DeviceID, alice.Key)
		signedBob := testutil.SignWith(t, bx.MasterKey(), alice.UserID, ax.UserSigning)
		otherDevice := maps.Clone(aliceDevice)
		otherDevice["algorithms"] = []string{"m.megolm.v1.aes-sha2"}

		from := syncToken(t, srv, carol)
		aliceFrom := syncToken(t, srv, alice)
		r := srv.Must(t, "POST", signaturesUploadPath, alice.Token, map[string]any{
			alice.UserID: map[string]any{
				alice.DeviceID: signedDevice,
				aMaster:        signedOwnMaster,
				"NOSUCHDEVICE": signedDevice,
			},
			bob.UserID: map[string]any{
				bMaster:      signedBob,
				bob.DeviceID: testutil.SignWith(t, bobDevice, alice.UserID, ax.SelfSigning),
			},
			carol.UserID:           map[string]any{"XYZ": signedBob},
			"@dave:remote.example": map[string]any{"K": signedBob},
		})
		failures, _ := r["failures"].(map[string]any)
		code := func(user, key string) string {
			f, _ := failures[user].(map[string]any)
			e, _ := f[key].(map[string]any)
			s, _ := e["errcode"].(string)
			if _, ok := e["error"].(string); e != nil && !ok {
				t.Errorf("failure %s %s has no error message", user, key)
			}
			return s
		}
		for _, c := range []struct{ user, key, code string }{
			{alice.UserID, alice.DeviceID, ""}, {alice.UserID, aMaster, ""}, {bob.UserID, bMaster, ""},
			{alice.UserID, "NOSUCHDEVICE", "M_NOT_FOUND"}, {carol.UserID, "XYZ", "M_NOT_FOUND"},
			{bob.UserID, bob.DeviceID, "M_UNKNOWN"}, {"@dave:remote.example", "K", "M_NOT_FOUND"},
		} {
			if got := code(c.user, c.key); got != c.code {
				t.Errorf("failure of %s %s: %q, want %q (%v)", c.user, c.key, got, c.code, failures)
			}
		}
		changed, _ := changesSince(t, srv, carol, from)
		expectUsers(t, "carol's changes after alice's signatures", changed, []string{alice.UserID})
		changed, _ = changesSince(t, srv, alice, aliceFrom)
		expectUsers(t, "alice's changes after her signatures", changed, []string{alice.UserID})
		changed, _ = changesSince(t, srv, bob, from)
		expectUsers(t, "bob's changes after alice signed his master key", changed, nil)

		// Bad signatures fail and are not stored.
		r = srv.Must(t, "POST", signaturesUploadPath, alice.Token, map[string]any{
			alice.UserID: map[string]any{alice.DeviceID: tamper(testutil.SignWith(t, withoutSignatures(aliceDevice), alice.UserID, ax.SelfSigning), alice.UserID, testutil.PublicKey(ax.SelfSigning))},
		})
		failures, _ = r["failures"].(map[string]any)
		if got := code(alice.UserID, alice.DeviceID); got != "M_INVALID_SIGNATURE" {
			t.Errorf("tampered device signature: %q", got)
		}
		r = srv.Must(t, "POST", signaturesUploadPath, alice.Token, map[string]any{
			alice.UserID: map[string]any{alice.DeviceID: testutil.SignWith(t, otherDevice, alice.UserID, ax.SelfSigning)},
			bob.UserID:   map[string]any{bMaster: testutil.SignWith(t, bx.MasterKey(), alice.UserID, ax.SelfSigning)},
		})
		failures, _ = r["failures"].(map[string]any)
		if got := code(alice.UserID, alice.DeviceID); got != "M_INVALID_SIGNATURE" {
			t.Errorf("signature over another object: %q", got)
		}
		if got := code(bob.UserID, bMaster); got != "M_INVALID_SIGNATURE" {
			t.Errorf("bob's master key signed with the self-signing key: %q", got)
		}

		// What each one sees.
		sskID, uskID := "ed25519:"+testutil.PublicKey(ax.SelfSigning), "ed25519:"+testutil.PublicKey(ax.UserSigning)
		for _, viewer := range []*testutil.User{alice, bob, carol} {
			resp := queryKeys(t, srv, viewer, map[string][]string{alice.UserID: {}, bob.UserID: {}})
			dev := deviceKeysOf(t, resp, alice.UserID)[alice.DeviceID]
			if got := sigsOf(dev, alice.UserID)[sskID]; got != sigsOf(signedDevice, alice.UserID)[sskID] {
				t.Errorf("%s: alice's device signature %v", viewer.UserID, got)
			}
			if sigsOf(deviceKeysOf(t, resp, bob.UserID)[bob.DeviceID], alice.UserID) != nil {
				t.Errorf("%s: a refused signature on bob's device is shown", viewer.UserID)
			}
			masters := resp["master_keys"].(map[string]any)
			if got := sigsOf(masters[alice.UserID], alice.UserID)["ed25519:"+alice.DeviceID]; got == nil {
				t.Errorf("%s: alice's device signature on her master key is missing: %v", viewer.UserID, masters[alice.UserID])
			}
			got := sigsOf(masters[bob.UserID], alice.UserID)[uskID]
			if viewer == alice && got != sigsOf(signedBob, alice.UserID)[uskID] {
				t.Errorf("alice does not see her signature on bob's master key: %v", masters[bob.UserID])
			}
			if viewer != alice && got != nil {
				t.Errorf("%s sees alice's user-signing signature on bob's master key", viewer.UserID)
			}
			// Only one's own user-signing key (carol has none).
			usks := resp["user_signing_keys"].(map[string]any)
			if _, own := usks[viewer.UserID]; len(usks) != 1 && viewer != carol || !own && viewer != carol || viewer == carol && len(usks) != 0 {
				t.Errorf("%s gets user-signing keys %v", viewer.UserID, usks)
			}
			if ssks := resp["self_signing_keys"].(map[string]any); len(ssks) != 2 {
				t.Errorf("%s gets self-signing keys %v", viewer.UserID, ssks)
			}
		}
	})
}

// An upload without keys is how clients learn whether cross-signing needs
// user-interactive auth (MSC3967): before the first master key it answers
// 200 and changes nothing, and the real first upload needs no auth; once
// there are keys it answers the password challenge, whose session then
// completes a change of keys (once). The stored keys again need nothing.
func TestCrossSigningAuthProbe(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		carol := srv.Register(t, "carol", "")
		srv.Join(t, "!r:test.local", alice.UserID)
		srv.Join(t, "!r:test.local", carol.UserID)
		unchanged := func(want map[string]any) {
			t.Helper()
			master, ssk, usk := crossKeys(t, srv, alice, alice.UserID)
			if want == nil {
				if len(master)+len(ssk)+len(usk) != 0 {
					t.Fatalf("keys stored: %v %v %v", master, ssk, usk)
				}
				return
			}
			if canonicalOf(t, master[alice.UserID]) != canonicalOf(t, want) {
				t.Fatalf("master key %v, want %v", master[alice.UserID], want)
			}
		}

		// No keys yet: the probe, as an empty object, an empty body, or
		// with auth, is 200 {} and stores nothing.
		from := syncToken(t, srv, carol)
		for _, body := range []any{map[string]any{}, "", map[string]any{"auth": map[string]any{"type": "m.login.dummy"}},
			map[string]any{"master_key": nil}} {
			acctExpectEmptyOK(t, srv.Do(t, "POST", signingUploadPath, alice.Token, body))
		}
		unchanged(nil)
		changed, _ := changesSince(t, srv, carol, from)
		expectUsers(t, "changed after probes", changed, nil)
		// The first upload needs no auth.
		xs := testutil.NewCrossSigning(alice.UserID)
		acctExpectEmptyOK(t, srv.Do(t, "POST", signingUploadPath, alice.Token, xs.Upload(t)))
		unchanged(xs.MasterKey())
		// The same keys again need nothing.
		acctExpectEmptyOK(t, srv.Do(t, "POST", signingUploadPath, alice.Token, xs.Upload(t)))

		// With keys, the probe and new keys get the challenge, and change
		// nothing; a wrong password repeats it.
		session := acctExpectChallenge(t, srv.Do(t, "POST", signingUploadPath, alice.Token, map[string]any{}), "m.login.password")
		acctExpectChallenge(t, srv.Do(t, "POST", signingUploadPath, alice.Token, ""), "m.login.password")
		next := testutil.NewCrossSigning(alice.UserID)
		acctExpectChallenge(t, srv.Do(t, "POST", signingUploadPath, alice.Token, next.Upload(t)), "m.login.password")
		wrong := next.Upload(t)
		wrong["auth"] = acctPasswordAuth("alice", "wrong", session)
		r := srv.Do(t, "POST", signingUploadPath, alice.Token, wrong)
		if acctExpectChallenge(t, r, "m.login.password"); r.Errcode() != "M_FORBIDDEN" {
			t.Errorf("wrong password: errcode %q", r.Errcode())
		}
		unchanged(xs.MasterKey())

		// The probe's session completes the change of keys.
		from = syncToken(t, srv, carol)
		body := next.Upload(t)
		body["auth"] = acctPasswordAuth("alice", alice.Password, session)
		acctExpectEmptyOK(t, srv.Do(t, "POST", signingUploadPath, alice.Token, body))
		unchanged(next.MasterKey())
		changed, _ = changesSince(t, srv, carol, from)
		expectUsers(t, "changed after the replacement", changed, []string{alice.UserID})
		// Once only.
		third := testutil.NewCrossSigning(alice.UserID).Upload(t)
		third["auth"] = acctPasswordAuth("alice", alice.Password, session)
		acctExpectChallenge(t, srv.Do(t, "POST", signingUploadPath, alice.Token, third), "m.login.password")
		unchanged(next.MasterKey())
		// A session started by another user's probe is not alice's.
		carolXS := testutil.NewCrossSigning(carol.UserID)
		acctExpectEmptyOK(t, srv.Do(t, "POST", signingUploadPath, carol.Token, carolXS.Upload(t)))
		carolSession := acctExpectChallenge(t, srv.Do(t, "POST", signingUploadPath, carol.Token, map[string]any{}), "m.login.password")
		third["auth"] = acctPasswordAuth("alice", alice.Password, carolSession)
		acctExpectErr(t, srv.Do(t, "POST", signingUploadPath, alice.Token, third), http.StatusForbidden, "M_FORBIDDEN")
		unchanged(next.MasterKey())
	})
}
