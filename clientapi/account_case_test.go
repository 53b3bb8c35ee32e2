package clientapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
)

// A user may name themselves by a full user ID in any case, for login and
// for the password stage of user-interactive auth; a user of another
// server keeps its case.
func TestLoginUserIDAnyCase(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		srv := testutil.NewServer(t, db, testutil.ServerOptions{})
		alice := srv.Register(t, "alice", "")
		upper := "@ALICE:" + srv.ServerName
		for _, field := range []string{"identifier", "user"} {
			body := map[string]any{"type": "m.login.password", "password": alice.Password}
			if field == "identifier" {
				body["identifier"] = map[string]any{"type": "m.id.user", "user": upper}
			} else {
				body["user"] = upper
			}
			r := srv.Do(t, "POST", acctV3+"/login", "", body)
			if r.Status != http.StatusOK || r.Body["user_id"] != alice.UserID {
				t.Fatalf("login as %s (%s): %d %s, want 200 as %s", upper, field, r.Status, r.Raw, alice.UserID)
			}
		}
		// A server name is not lower-cased: @ALICE:TEST.LOCAL is someone else.
		r := srv.Do(t, "POST", acctV3+"/login", "", map[string]any{"type": "m.login.password",
			"identifier": map[string]any{"type": "m.id.user", "user": "@alice:" + strings.ToUpper(srv.ServerName)}, "password": alice.Password})
		acctExpectErr(t, r, http.StatusForbidden, "M_FORBIDDEN")

		a2 := srv.Login(t, alice, "")
		r = srv.Do(t, "DELETE", acctV3+"/devices/"+a2.DeviceID, alice.Token,
			map[string]any{"auth": acctPasswordAuth(upper, alice.Password, "")})
		acctExpectEmptyOK(t, r)
		acctTokenDead(t, srv, a2.Token)
	})
}
