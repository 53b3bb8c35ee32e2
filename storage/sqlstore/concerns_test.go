package sqlstore_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// Every write that advances the stream returns the local users it
// concerns: for a device change the user and the local users sharing a
// room with them, for a membership change the room's local members (past
// ones too) and the user; never an unrelated user or a remote one.
func TestWritesReturnTheUsersTheyConcern(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		const a, b, c, r = "@a:x", "@b:x", "@c:x", "@r:remote"
		want := func(what string, ch storage.Change, err error, users ...string) {
			t.Helper()
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if ch.Pos == 0 {
				t.Fatalf("%s: no change", what)
			}
			if users == nil {
				users = []string{}
			}
			if !slices.Equal(ch.Users, users) {
				t.Fatalf("%s concerns %q, want %q", what, ch.Users, users)
			}
		}
		for _, u := range []string{a, b, c} {
			if _, err := s.CreateAccount(ctx, u, "x", nil); err != nil {
				t.Fatal(err)
			}
		}
		join := func(room, user string) storage.Change {
			res, err := s.SetMembership(ctx, room, user, storage.MembershipJoin, 0)
			if err != nil {
				t.Fatal(err)
			}
			return res.Change
		}
		want("a joins", join("!r1:x", a), nil, a)
		want("b joins", join("!r1:x", b), nil, a, b)
		want("a remote user joins", join("!r1:x", r), nil, a, b)
		want("c joins another room", join("!r2:x", c), nil, c)

		l, err := s.Login(ctx, storage.NewLogin{UserID: a, DeviceID: "A1", TokenHash: "a1"})
		want("a logs in", l.Change, err, a, b)
		l, err = s.CreateAccount(ctx, "@d:x", "x", &storage.NewLogin{UserID: "@d:x", DeviceID: "D1", TokenHash: "d1"})
		want("d registers", l.Change, err, "@d:x")
		l, err = s.Login(ctx, storage.NewLogin{UserID: c, DeviceID: "C1", TokenHash: "c1"})
		want("c logs in", l.Change, err, c)
		up, err := s.UploadKeys(ctx, a, "A1", nil, func(storage.KeyState) (storage.KeyWrite, error) {
			return storage.KeyWrite{DeviceKeys: []byte(`{"k":1}`)}, nil
		})
		want("a uploads device keys", up.Change, err, a, b)
		ch, err := s.SetDeviceDisplayName(ctx, a, "A1", "phone")
		want("a renames a device", ch, err, a, b)
		_, ch, err = s.DeleteDevices(ctx, a, []string{"A1"})
		want("a deletes a device", ch, err, a, b)
		if _, err := s.Login(ctx, storage.NewLogin{UserID: b, DeviceID: "B1", TokenHash: "b1"}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Login(ctx, storage.NewLogin{UserID: b, DeviceID: "B2", TokenHash: "b2"}); err != nil {
			t.Fatal(err)
		}
		ch, err = s.ChangePassword(ctx, b, "y", "B1", true)
		want("b changes password, logging out B2", ch, err, a, b)

		// A remote user's change concerns the local users sharing a room.
		list := storage.RemoteDeviceList{UserID: r, StreamID: 1, Devices: []storage.RemoteDevice{{DeviceID: "R1", KeyJSON: []byte(`{"k":1}`)}}}
		if _, err := s.ReplaceRemoteDeviceList(ctx, list, "remote"); err != nil {
			t.Fatal(err)
		}
		list.StreamID = 2
		list.Devices = append(list.Devices, storage.RemoteDevice{DeviceID: "R2", KeyJSON: []byte(`{"k":2}`)})
		ch, err = s.ReplaceRemoteDeviceList(ctx, list, "remote")
		want("r's list is fetched again", ch, err, a, b)
		ap, err := s.ApplyRemoteDeviceUpdate(ctx, storage.RemoteDeviceUpdate{UserID: r, DeviceID: "R3", StreamID: 3, PrevIDs: []int64{2},
			KeyJSON: []byte(`{"k":3}`)})
		if ap.Outcome != storage.Applied {
			t.Fatalf("update outcome %v", ap.Outcome)
		}
		want("an update of r", ap.Change, err, a, b)

		// Cross-signing: public keys and signatures on them concern the
		// owner's room-mates, a user-signing key and what it signs only
		// its owner; account data only its owner.
		keys := func(user string, k map[string][]byte) (storage.Change, error) {
			return s.UploadCrossSigningKeys(ctx, user, func(map[string][]byte) (storage.CrossSigningWrite, error) {
				return storage.CrossSigningWrite{Keys: k}, nil
			})
		}
		ch, err = keys(b, map[string][]byte{storage.UsageMaster: []byte(`{"m":1}`), storage.UsageSelfSigning: []byte(`{"s":1}`)})
		want("b uploads cross-signing keys", ch, err, a, b)
		ch, err = keys(b, map[string][]byte{storage.UsageUserSigning: []byte(`{"u":1}`)})
		want("b uploads a user-signing key", ch, err, b)
		ch, err = s.StoreSignatures(ctx, []storage.CrossSigningSignature{
			{TargetUserID: b, TargetKeyID: "B1", SignerUserID: b, SignerKeyID: "ed25519:s", Signature: "x"}})
		want("b signs a device", ch, err, a, b)
		ch, err = s.StoreSignatures(ctx, []storage.CrossSigningSignature{
			{TargetUserID: c, TargetKeyID: "ed25519:cm", SignerUserID: b, SignerKeyID: "ed25519:u", Signature: "y"}})
		want("b signs c's master key", ch, err, b)
		ch, err = s.SetAccountData(ctx, c, "", "m.test", []byte(`{}`))
		want("c sets account data", ch, err, c)
		ch, err = s.UpdateRemoteCrossSigning(ctx, r, map[string][]byte{storage.UsageMaster: []byte(`{"rm":1}`)})
		want("r's cross-signing keys change", ch, err, a, b)

		// Leaving: the room's members, past ones included, and the user.
		res, err := s.SetMembership(ctx, "!r1:x", a, storage.MembershipLeave, 0)
		want("a leaves", res.Change, err, a, b)
		res, err = s.SetMembership(ctx, "!r1:x", r, storage.MembershipLeave, 0)
		want("r leaves", res.Change, err, a, b)
		ch, err = s.DeactivateAccount(ctx, c, 1)
		want("c is deactivated", ch, err, c)
	})
}

// Another daemon on the same PostgreSQL database hears each advance with
// the users it concerns, or with nil (anyone) when they are too many to
// name in a notification.
func TestWatchStreamCarriesTheUsers(t *testing.T) {
	db := testutil.Postgres(t)
	ctx := context.Background()
	writer := open(t, db)
	heard := watchStream(t, open(t, db))

	// probe makes an advance and waits until it is heard, so that every
	// advance before it has been heard too (they come in commit order).
	probes := 0
	probe := func() bool {
		probes++
		user := fmt.Sprintf("@probe%d:x", probes)
		if _, err := writer.SetMembership(ctx, "!probe:x", user, storage.MembershipJoin, 0); err != nil {
			t.Fatal(err)
		}
		for {
			select {
			case got := <-heard:
				if slices.Contains(got, user) {
					return true
				}
			case <-time.After(100 * time.Millisecond):
				return false // not listening yet: try again
			}
		}
	}
	sync := func() {
		t.Helper()
		for i := 0; !probe(); i++ {
			if i == 100 {
				t.Fatal("the watcher never heard an advance")
			}
		}
	}
	// The channels are the schema's (TestWatchStreamHearsItsSchemaOnly);
	// only advances naming our users are looked at all the same.
	ours := func(users []string) bool {
		for _, u := range users {
			if !strings.HasSuffix(u, ":x") {
				return false
			}
		}
		return users != nil
	}
	// next checks the next advance of ours heard: exactly users.
	next := func(what string, users []string) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case got := <-heard:
				if got != nil && !ours(got) {
					continue
				}
				if !slices.Equal(got, users) || got == nil {
					t.Fatalf("%s: heard %q, want %q", what, got, users)
				}
				return
			case <-deadline:
				t.Fatalf("%s: nothing heard", what)
			}
		}
	}

	const a, b, c = "@a:x", "@b:x", "@c:x"
	for _, u := range []string{a, b, c} {
		if _, err := writer.SetMembership(ctx, "!room:x", u, storage.MembershipJoin, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := writer.SetMembership(ctx, "!other:x", "@d:x", storage.MembershipJoin, 0); err != nil {
		t.Fatal(err)
	}
	sync()
	if _, err := writer.Login(ctx, storage.NewLogin{UserID: "@d:x", DeviceID: "D", TokenHash: "d"}); err != nil {
		t.Fatal(err)
	}
	next("d logs in", []string{"@d:x"})
	if _, err := writer.Login(ctx, storage.NewLogin{UserID: a, DeviceID: "A", TokenHash: "a"}); err != nil {
		t.Fatal(err)
	}
	next("a logs in", []string{a, b, c})

	// Too many to name: anyone.
	for i := 0; i < 250; i++ {
		u := fmt.Sprintf("@%s%03d:x", strings.Repeat("m", 30), i)
		if _, err := writer.SetMembership(ctx, "!big:x", u, storage.MembershipJoin, 0); err != nil {
			t.Fatal(err)
		}
	}
	sync()
	if _, err := writer.Login(ctx, storage.NewLogin{UserID: "@" + strings.Repeat("m", 30) + "000:x", DeviceID: "M", TokenHash: "m"}); err != nil {
		t.Fatal(err) // PostgreSQL refuses a payload of 8000 bytes or more
	}
	// Between the login and the next probe: an advance for anyone.
	probes++
	user := fmt.Sprintf("@probe%d:x", probes)
	if _, err := writer.SetMembership(ctx, "!probe:x", user, storage.MembershipJoin, 0); err != nil {
		t.Fatal(err)
	}
	anyone := false
	deadline := time.After(10 * time.Second)
	for {
		select {
		case got := <-heard:
			if got == nil {
				anyone = true
			} else if slices.Contains(got, user) {
				if !anyone {
					t.Fatal("the login of a big room's member was not announced to anyone")
				}
				return
			} else if ours(got) {
				t.Fatalf("heard %q for the login of a big room's member", got)
			}
		case <-deadline:
			t.Fatal("the probe was not heard")
		}
	}
}

// A watch wakes everyone once it listens: what changed before it did
// (while its daemon started, or after a watch that failed) went unheard.
func TestWatchStreamWakesEveryoneOnceListening(t *testing.T) {
	heard := watchStream(t, open(t, testutil.Postgres(t)))
	deadline := time.After(30 * time.Second)
	for {
		select {
		case users := <-heard:
			if users == nil {
				return
			}
		case <-deadline:
			t.Fatal("the watch never woke everyone")
		}
	}
}

// watchStream runs s.WatchStream until the test ends and returns what it
// hears.
// Daemons of another schema of the same PostgreSQL database (another
// deployment, another test) are not heard: their advances wake nobody
// here, and their revocations wait for nobody here.
func TestWatchStreamHearsItsSchemaOnly(t *testing.T) {
	ctx := context.Background()
	here, there := testutil.Postgres(t), testutil.Postgres(t)
	writer, elsewhere := open(t, here), open(t, there)
	watcher := open(t, here)
	heard := watchStream(t, watcher)
	change := func(s *sqlstore.Store, user string) {
		t.Helper()
		if _, err := s.SetMembership(ctx, "!"+user[1:], user, storage.MembershipJoin, 0); err != nil {
			t.Fatal(err)
		}
	}
	// Listening once an advance of this schema is heard.
	for i := 0; ; i++ {
		probe := fmt.Sprintf("@probe%d:x", i)
		change(writer, probe)
		got := waitHeard(t, heard, probe)
		if got {
			break
		}
		if i == 100 {
			t.Fatal("the watcher never heard an advance")
		}
	}
	// Another schema's advance, then this one's: the first heard is this
	// one's (advances come in commit order on one channel).
	change(elsewhere, "@there:x")
	change(writer, "@here:x")
	select {
	case got := <-heard:
		if !slices.Equal(got, []string{"@here:x"}) {
			t.Fatalf("heard %q first, want this schema's [@here:x]", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("this schema's advance was not heard")
	}
	if sqlstore.ListenerServer(writer) != sqlstore.ListenerServer(watcher) ||
		sqlstore.ListenerServer(writer) == sqlstore.ListenerServer(elsewhere) {
		t.Fatal("revocations wait for the daemons of another schema, or not for those of their own")
	}
}

// waitHeard reads heard for a while: true once an advance naming user
// comes, false when none does within 100 ms.
func waitHeard(t *testing.T, heard <-chan []string, user string) bool {
	t.Helper()
	for {
		select {
		case got := <-heard:
			if slices.Contains(got, user) {
				return true
			}
		case <-time.After(100 * time.Millisecond):
			return false
		}
	}
}

func watchStream(t *testing.T, s *sqlstore.Store) <-chan []string {
	ctx, cancel := context.WithCancel(context.Background())
	heard := make(chan []string, 1000)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.WatchStream(ctx, func(users []string) { heard <- users })
	}()
	t.Cleanup(func() { cancel(); <-done })
	return heard
}
