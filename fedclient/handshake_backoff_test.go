package fedclient

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// The membership handshakes a user asks for (joins, leaves, knocks) are
// sent to a server that backs off after failures; other requests wait.
func TestHandshakesIgnoreBackoff(t *testing.T) {
	var handshakes, others atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/make_") {
			handshakes.Add(1)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"room_version":"11","event":{"type":"m.room.member"}}`))
			return
		}
		others.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(`{"errcode":"M_UNKNOWN","error":"down"}`))
	})
	c, dest, clk := newTestClient(t, h, Options{MinBackoff: time.Minute, MaxBackoff: time.Hour})
	ctx := context.Background()
	if err := c.Do(ctx, "GET", dest, "/x", nil, nil); err == nil {
		t.Fatal("the failing request succeeded")
	}
	if !c.Backoff(dest).After(clk.Now()) {
		t.Fatal("no backoff after a failure")
	}
	var be *BackoffError
	if err := c.Do(ctx, "GET", dest, "/x", nil, nil); !errors.As(err, &be) {
		t.Fatalf("a background request sent while backing off: %v", err)
	}
	if _, err := c.MakeJoin(ctx, dest, "!r:x", "@u:y", []string{"11"}); err != nil {
		t.Fatalf("make_join while backing off: %v", err)
	}
	if _, _, err := c.MakeLeave(ctx, dest, "!r:x", "@u:y"); err != nil {
		t.Fatalf("make_leave while backing off: %v", err)
	}
	if _, _, err := c.MakeKnock(ctx, dest, "!r:x", "@u:y", []string{"11"}); err != nil {
		t.Fatalf("make_knock while backing off: %v", err)
	}
	if handshakes.Load() != 3 || others.Load() != 1 {
		t.Fatalf("%d handshakes and %d other requests reached the server, want 3 and 1", handshakes.Load(), others.Load())
	}
}
