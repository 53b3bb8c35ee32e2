package userapi_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
	"github.com/keyserver/keyserver/userapi"
)

// recorder is the change fan-out as the tests see it.
type recorder struct {
	mu          sync.Mutex
	devices     []storage.Change
	memberships []storage.Change
}

func (r *recorder) DeviceListChanged(ch storage.Change) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.devices = append(r.devices, ch)
}

func (r *recorder) MembershipChanged(ch storage.Change, _ []storage.StaleUser) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.memberships = append(r.memberships, ch)
}

func newService(t *testing.T, db testdb.Database, o userapi.Options) (*userapi.Service, *sqlstore.Store, *recorder) {
	t.Helper()
	store, err := sqlstore.Open(context.Background(), db.URI, "local.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	log := logrus.New()
	log.SetOutput(io.Discard)
	rec := &recorder{}
	o.ServerName, o.BcryptCost, o.Logger, o.Changes = "local.test", 4, log, rec
	return userapi.New(store, o), store, rec
}

func errcode(err error) string {
	var me *mxerr.Error
	if errors.As(err, &me) {
		return me.Code
	}
	if err != nil {
		return "not a Matrix error: " + err.Error()
	}
	return ""
}

func password(s string) *string { return &s }

// Registering makes an account and a device whose token authenticates
// the device; the new device is reported as a device-list change.
func TestRegisterLoginAuthenticate(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		s, _, rec := newService(t, db, userapi.Options{RegistrationOpen: true})
		reg, err := s.Register(ctx, userapi.RegisterRequest{Username: password("alice"), Password: password("pw"),
			DeviceID: password("PHONE"), Auth: &matrixid.AuthData{Type: "m.login.dummy"}})
		if err != nil {
			t.Fatal(err)
		}
		if reg.UserID != "@alice:local.test" || reg.DeviceID != "PHONE" || reg.AccessToken == "" {
			t.Fatalf("registered %+v", reg)
		}
		c, err := s.Authenticate(ctx, reg.AccessToken)
		if err != nil || c.UserID != reg.UserID || c.DeviceID != "PHONE" {
			t.Fatalf("authenticate: %+v %v", c, err)
		}
		if len(rec.devices) != 1 || rec.devices[0].Pos == 0 {
			t.Fatalf("device-list changes reported: %+v", rec.devices)
		}
		// Taken names are refused before any auth stage.
		if _, err := s.Register(ctx, userapi.RegisterRequest{Username: password("alice"), Password: password("pw")}); errcode(err) != "M_USER_IN_USE" {
			t.Fatalf("second registration: %v", err)
		}
		if _, err := s.Login(ctx, userapi.LoginRequest{Type: "m.login.password", User: "alice", Password: password("wrong")}); errcode(err) != "M_FORBIDDEN" {
			t.Fatalf("wrong password: %v", err)
		}
		login, err := s.Login(ctx, userapi.LoginRequest{Type: "m.login.password", User: "@alice:local.test", Password: password("pw"), DeviceID: password("LAPTOP")})
		if err != nil || login.DeviceID != "LAPTOP" {
			t.Fatalf("login: %+v %v", login, err)
		}
		devices, err := s.Devices(ctx, c)
		if err != nil || len(devices) != 2 {
			t.Fatalf("devices: %+v %v", devices, err)
		}
		if _, err := s.Authenticate(ctx, "not a token"); errcode(err) != "M_UNKNOWN_TOKEN" {
			t.Fatalf("unknown token: %v", err)
		}
	})
}

// Registration can be closed; admins still create users.
func TestRegistrationClosed(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		s, _, _ := newService(t, db, userapi.Options{})
		if _, err := s.Register(ctx, userapi.RegisterRequest{Username: password("bob"), Password: password("pw")}); errcode(err) != "M_FORBIDDEN" {
			t.Fatalf("closed registration: %v", err)
		}
		id, err := s.CreateUser(ctx, "Bob", "pw")
		if err != nil || id != "@bob:local.test" {
			t.Fatalf("create user: %q %v", id, err)
		}
		if _, err := s.CreateUser(ctx, "bob", "pw"); errcode(err) != "M_USER_IN_USE" {
			t.Fatalf("created twice: %v", err)
		}
		if _, err := s.Login(ctx, userapi.LoginRequest{Type: "m.login.password", User: "bob", Password: password("pw")}); err != nil {
			t.Fatalf("login of a created user: %v", err)
		}
	})
}

// Deleting a device asks for the password by user-interactive auth; the
// session completes only the request it was started for.
func TestDeleteDeviceNeedsPassword(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		s, _, rec := newService(t, db, userapi.Options{})
		user, err := s.CreateUser(ctx, "carol", "pw")
		if err != nil {
			t.Fatal(err)
		}
		var callers []matrixid.Caller
		for _, dev := range []string{"ONE", "TWO", "THREE"} {
			l, err := s.Login(ctx, userapi.LoginRequest{Type: "m.login.password", User: user, Password: password("pw"), DeviceID: password(dev)})
			if err != nil {
				t.Fatal(err)
			}
			c, err := s.Authenticate(ctx, l.AccessToken)
			if err != nil {
				t.Fatal(err)
			}
			callers = append(callers, c)
		}
		c := callers[0]
		err = s.DeleteDevice(ctx, c, "TWO", nil)
		var me *mxerr.Error
		if !errors.As(err, &me) || me.Status != http.StatusUnauthorized {
			t.Fatalf("delete without auth: %v", err)
		}
		session, _ := me.Extra["session"].(string)
		if session == "" {
			t.Fatalf("challenge without a session: %+v", me.Extra)
		}
		// The session was started for TWO: it cannot delete THREE.
		if err := s.DeleteDevice(ctx, c, "THREE", &matrixid.AuthData{Type: "m.login.password", Session: session, Password: "pw"}); errcode(err) != "M_FORBIDDEN" {
			t.Fatalf("session reused for another device: %v", err)
		}
		before := len(rec.devices)
		if err := s.DeleteDevice(ctx, c, "TWO", &matrixid.AuthData{Type: "m.login.password", Session: session, Password: "pw"}); err != nil {
			t.Fatalf("delete with the password: %v", err)
		}
		if len(rec.devices) != before+1 {
			t.Fatalf("the deletion was not reported: %+v", rec.devices)
		}
		devices, err := s.Devices(ctx, c)
		if err != nil || len(devices) != 2 {
			t.Fatalf("devices after the deletion: %+v %v", devices, err)
		}
		if _, err := s.Authenticate(ctx, "x"); err == nil {
			t.Fatal("a made-up token authenticated")
		}
	})
}

// ConfirmPassword, which the keys domain asks before a change of
// cross-signing keys, challenges first and then accepts the password.
func TestConfirmPassword(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		s, _, _ := newService(t, db, userapi.Options{})
		user, err := s.CreateUser(ctx, "dan", "pw")
		if err != nil {
			t.Fatal(err)
		}
		c := matrixid.Caller{UserID: user, DeviceID: "D"}
		req := matrixid.AuthRequest{UserID: user, Method: http.MethodPost, Path: "/keys/device_signing/upload", Params: "k"}
		err = s.ConfirmPassword(ctx, c, req, nil)
		var me *mxerr.Error
		if !errors.As(err, &me) || me.Status != http.StatusUnauthorized {
			t.Fatalf("without auth: %v", err)
		}
		session, _ := me.Extra["session"].(string)
		if err := s.ConfirmPassword(ctx, c, req, &matrixid.AuthData{Type: "m.login.password", Session: session, Password: "bad"}); !errors.As(err, &me) || me.Status != http.StatusUnauthorized || me.Code != "M_FORBIDDEN" {
			t.Fatalf("wrong password: %v", err)
		}
		if err := s.ConfirmPassword(ctx, c, req, &matrixid.AuthData{Type: "m.login.password", Session: session, Password: "pw"}); err != nil {
			t.Fatalf("right password: %v", err)
		}
		// A completed session completes one request only.
		if err := s.ConfirmPassword(ctx, c, req, &matrixid.AuthData{Type: "m.login.password", Session: session, Password: "pw"}); !errors.As(err, &me) || me.Status != http.StatusUnauthorized {
			t.Fatalf("session used twice: %v", err)
		}
	})
}

// Deactivation deletes the devices, refuses later logins, and leaves the
// user's rooms, each reported as a change.
func TestDeactivate(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		s, store, rec := newService(t, db, userapi.Options{})
		user, err := s.CreateUser(ctx, "erin", "pw")
		if err != nil {
			t.Fatal(err)
		}
		l, err := s.Login(ctx, userapi.LoginRequest{Type: "m.login.password", User: user, Password: password("pw")})
		if err != nil {
			t.Fatal(err)
		}
		c, err := s.Authenticate(ctx, l.AccessToken)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.SetMembership(ctx, "!room:local.test", user, storage.MembershipJoin, 1); err != nil {
			t.Fatal(err)
		}
		if err := s.Deactivate(ctx, c, userapi.DeactivateRequest{Auth: &matrixid.AuthData{Type: "m.login.password", Password: "pw"}}); err != nil {
			t.Fatalf("deactivate: %v", err)
		}
		if _, err := s.Authenticate(ctx, l.AccessToken); errcode(err) != "M_UNKNOWN_TOKEN" {
			t.Fatalf("token of a deactivated account: %v", err)
		}
		if _, err := s.Login(ctx, userapi.LoginRequest{Type: "m.login.password", User: user, Password: password("pw")}); errcode(err) != "M_USER_DEACTIVATED" && errcode(err) != "M_FORBIDDEN" {
			t.Fatalf("login of a deactivated account: %v", err)
		}
		rooms, err := store.JoinedRooms(ctx, user)
		if err != nil || len(rooms) != 0 {
			t.Fatalf("rooms after deactivation: %v %v", rooms, err)
		}
		if len(rec.memberships) != 1 {
			t.Fatalf("membership changes reported: %+v", rec.memberships)
		}
	})
}
