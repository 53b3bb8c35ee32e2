package sqlstore_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
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
		// Every method of the store that takes a context and returns an
		// error: the areas of storage.Database and whatever else it has.
		store := reflect.ValueOf(s)
		ctxType := reflect.TypeOf((*context.Context)(nil)).Elem()
		errType := reflect.TypeOf((*error)(nil)).Elem()
		var methods []string
		for i := 0; i < store.NumMethod(); i++ {
			m := store.Type().Method(i)
			ft := m.Func.Type() // the receiver is In(0)
			if ft.NumIn() < 2 || ft.In(1) != ctxType || ft.NumOut() == 0 {
				continue
			}
			last := ft.Out(ft.NumOut() - 1)
			if last != errType && !(last.Kind() == reflect.Func && last.NumIn() == 0 && last.NumOut() > 0 && last.Out(last.NumOut()-1) == errType) {
				continue
			}
			methods = append(methods, m.Name)
		}
		if len(methods) < reflect.TypeOf((*storage.Database)(nil)).Elem().NumMethod()-2 {
			t.Fatalf("only %d methods found: %v", len(methods), methods)
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
			call := m.Call
			if m.Type().IsVariadic() {
				call = m.CallSlice
			}
			out := call(args)
			last := out[len(out)-1]
			if last.Kind() == reflect.Func { // a write started: its wait tells
				res := last.Call(nil)
				last = res[len(res)-1]
			}
			err, _ := last.Interface().(error)
			if err == nil {
				continue // nothing to do for empty arguments
			}
			failed++
			if name == "StartRoomWrite" && strings.HasPrefix(err.Error(), "storage: WriteRoomEvents: ") {
				continue // a started write is a WriteRoomEvents
			}
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
