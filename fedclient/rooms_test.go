package fedclient

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
)

// An alias travels percent-encoded in the query of a signed request; the
// answer's room and servers come back, a 404 as an HTTPError.
func TestLookupRoomAlias(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/_matrix/federation/v1/query/directory" || r.Header.Get("Authorization") == "" {
			t.Errorf("unexpected request %s %q", r.URL.Path, r.Header.Get("Authorization"))
		}
		switch r.URL.Query().Get("room_alias") {
		case "#room&x=1:remote.test":
			_, _ = w.Write([]byte(`{"room_id":"!r:remote.test","servers":["remote.test","other.test"]}`))
		default:
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"errcode":"M_NOT_FOUND","error":"no such alias"}`))
		}
	})
	c, dest, _ := newTestClient(t, h, Options{})
	roomID, servers, err := c.LookupRoomAlias(context.Background(), dest, "#room&x=1:remote.test")
	if err != nil || roomID != "!r:remote.test" || !slices.Equal(servers, []string{"remote.test", "other.test"}) {
		t.Fatalf("lookup: %q %v %v", roomID, servers, err)
	}
	_, _, err = c.LookupRoomAlias(context.Background(), dest, "#nope:remote.test")
	var he *HTTPError
	if !errors.As(err, &he) || he.Status != http.StatusNotFound || he.Errcode != "M_NOT_FOUND" {
		t.Fatalf("unknown alias: %v", err)
	}
}
