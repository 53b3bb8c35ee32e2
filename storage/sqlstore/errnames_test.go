package sqlstore_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/accountdata"
	"github.com/keyserver/keyserver/federationsender"
	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/keybackup"
	"github.com/keyserver/keyserver/keyserver"
	"github.com/keyserver/keyserver/publicrooms"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/userdirectory"
)

// An error out of the store names the operation that met it, and still
// is what it was to errors.Is.
func TestErrorsNameTheOperation(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		if _, err := s.CreateAccount(ctx, "@a:x", "hash", nil); err != nil {
			t.Fatal(err)
		}
		_, err := s.CreateAccount(ctx, "@a:x", "hash", nil)
		if !errors.Is(err, storage.ErrUserExists) || err.Error() != "storage: CreateAccount: user exists" {
			t.Errorf("second account: %v", err)
		}
		_, err = s.PasswordHash(ctx, "@nobody:x")
		if !errors.Is(err, storage.ErrNotFound) || err.Error() != "storage: PasswordHash: not found" {
			t.Errorf("unknown user: %v", err)
		}

		// On a closed store every method fails, each under its own name.
		s.Close()
		store := reflect.ValueOf(s)
		// The Database interface, and the narrower ones of the packages
		// that keep their own data.
		var methods []string
		for _, iface := range []reflect.Type{
			reflect.TypeOf((*storage.Database)(nil)).Elem(),
			reflect.TypeOf((*keybackup.Store)(nil)).Elem(),
			reflect.TypeOf((*accountdata.Store)(nil)).Elem(),
			reflect.TypeOf((*keyserver.AccountDataSource)(nil)).Elem(),
			reflect.TypeOf((*federationsender.PDUQueue)(nil)).Elem(),
			reflect.TypeOf((*roomserver.Store)(nil)).Elem(),
			reflect.TypeOf((*publicrooms.Store)(nil)).Elem(),
			reflect.TypeOf((*userdirectory.Store)(nil)).Elem(),
		} {
			for i := 0; i < iface.NumMethod(); i++ {
				methods = append(methods, iface.Method(i).Name)
			}
		}
		failed := 0
		for _, name := range methods {
			m := store.MethodByName(name)
			if name == "WatchStream" || name == "WatchOutbound" || name == "Close" {
				continue // listens until its context ends; closes
			}
			var args []reflect.Value
			for j := 0; j < m.Type().NumIn(); j++ {
				if j == 0 {
					args = append(args, reflect.ValueOf(ctx))
				} else {
					args = append(args, reflect.Zero(m.Type().In(j)))
				}
			}
			out := m.Call(args)
			err, _ := out[len(out)-1].Interface().(error)
			if err == nil {
				continue // nothing to do for empty arguments
			}
			failed++
			if !strings.HasPrefix(err.Error(), "storage: "+name+": ") {
				t.Errorf("%s: error %q does not name it", name, err)
			}
		}
		if failed < len(methods)/2 {
			t.Errorf("only %d of %d methods failed on a closed store", failed, len(methods))
		}

		// SQLite statements are not canceled (see stmtCache.uncancelable).
		if db.Name != "postgres" {
			return
		}
		s = open(t, db)
		canceled, cancel := context.WithCancel(ctx)
		cancel()
		_, err = s.Login(canceled, storage.NewLogin{UserID: "@a:x", DeviceID: "D", TokenHash: "t"})
		if !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "storage: Login: ") {
			t.Errorf("canceled login: %v", err)
		}
		_, err = s.DueStaleUsers(canceled, 0, 10)
		if !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "storage: DueStaleUsers: ") {
			t.Errorf("canceled read: %v", err)
		}
	})
}
