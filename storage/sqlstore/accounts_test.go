package sqlstore_test

import (
	"context"
	"errors"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
)

// A deactivated account keeps its ID and takes no logins, not even one
// whose password was checked before the deactivation.
func TestDeactivatedAccount(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		const alice = "@alice:x"
		if _, err := s.CreateAccount(ctx, alice, "hash", &storage.NewLogin{UserID: alice, DeviceID: "D1", TokenHash: "t1", TS: 1}); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateUIASession(ctx, storage.UIASession{ID: "s", UserID: alice, RequestHash: "h", ExpiresTS: 10}, 1); err != nil {
			t.Fatal(err)
		}
		pos, err := s.DeactivateAccount(ctx, alice, 5)
		if err != nil || pos == 0 {
			t.Fatalf("DeactivateAccount = %d, %v; want a device-list change", pos, err)
		}
		if _, err := s.PasswordHash(ctx, alice); !errors.Is(err, storage.ErrDeactivated) {
			t.Errorf("PasswordHash: %v, want ErrDeactivated", err)
		}
		if _, err := s.Login(ctx, storage.NewLogin{UserID: alice, DeviceID: "D2", TokenHash: "t2", TS: 6}); !errors.Is(err, storage.ErrDeactivated) {
			t.Errorf("Login: %v, want ErrDeactivated", err)
		}
		if ds, err := s.Devices(ctx, alice); err != nil || len(ds) != 0 {
			t.Errorf("devices %v (%v), want none", ds, err)
		}
		if _, _, err := s.TokenOwner(ctx, "t1"); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("the token outlived the account: %v", err)
		}
		if _, err := s.UIASession(ctx, "s", 2); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("the session outlived the account: %v", err)
		}
		if exists, err := s.AccountExists(ctx, alice); err != nil || !exists {
			t.Errorf("AccountExists = %v, %v; want true", exists, err)
		}
		if _, err := s.CreateAccount(ctx, alice, "hash", nil); !errors.Is(err, storage.ErrUserExists) {
			t.Errorf("CreateAccount again: %v, want ErrUserExists", err)
		}
		if _, err := s.ChangePassword(ctx, alice, "new", "D1", true); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("ChangePassword: %v, want ErrNotFound", err)
		}
		if _, err := s.DeactivateAccount(ctx, alice, 7); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("DeactivateAccount again: %v, want ErrNotFound", err)
		}
	})
}
