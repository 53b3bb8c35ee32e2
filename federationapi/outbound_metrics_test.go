package federationapi_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/crosssigning"
	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/federationsender"
	"github.com/keyserver/keyserver/internal/iprange"
	"github.com/keyserver/keyserver/internal/metrics"
	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// A delivery that reached a failing destination counts as a failure, one
// per request. The sender keeps its own retry times: the federation
// client's backoff (for the requests of clients) does not hold it back, so
// each sign of life is a request, none skipped.
func TestOutboundFailuresCountRequestsSent(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		o := testutil.NewOrigin(t)
		var sent atomic.Int32
		o.Mux.HandleFunc("PUT /_matrix/federation/v1/send/{txn}", func(w http.ResponseWriter, r *http.Request) {
			sent.Add(1)
			w.WriteHeader(http.StatusInternalServerError)
		})
		store, err := sqlstore.Open(ctx, db.URI, "local.test")
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		alice := "@alice:local.test"
		if _, err := store.CreateAccount(ctx, alice, "x", nil); err != nil {
			t.Fatal(err)
		}
		for _, u := range []string{alice, "@bob:" + o.Name} {
			if _, err := store.SetMembership(ctx, "!r:local.test", u, storage.MembershipJoin, 0); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := store.Login(ctx, storage.NewLogin{UserID: alice, DeviceID: "D1", TokenHash: "t1"}); err != nil {
			t.Fatal(err)
		}

		log := logrus.New()
		log.SetOutput(io.Discard)
		_, key, _ := ed25519.GenerateKey(rand.Reader)
		// After one failure the client holds the destination back for an
		// hour, and so does the sender: only signs of life make it retry.
		fc := fedclient.New(fedclient.Options{ServerName: "local.test", KeyID: "ed25519:k", PrivateKey: key,
			SkipVerify: true, MinBackoff: time.Hour, MaxBackoff: time.Hour, Logger: log,
			AddressPolicy: &fedclient.AddressPolicy{Allow: iprange.MustParse([]string{"127.0.0.0/8"})}})
		sender := federationsender.New(store, fc, federationsender.Options{ServerName: "local.test", FormatUpdate: crosssigning.UpdateEDU,
			MinRetry: time.Hour, RecentRetry: time.Hour, MaxRetry: time.Hour, Sweep: time.Hour, Logger: log})
		failures0 := counterValue(t, metrics.OutboundFailures)
		skipped0 := counterValue(t, metrics.OutboundSkipped)
		failures := func() float64 { return counterValue(t, metrics.OutboundFailures) - failures0 }
		skipped := func() float64 { return counterValue(t, metrics.OutboundSkipped) - skipped0 }
		done := make(chan struct{})
		go func() { defer close(done); sender.Run(ctx) }()
		defer func() { cancel(); <-done }()

		testutil.Eventually(t, "the first delivery to fail", func() bool { return sent.Load() == 1 && failures() == 1 })
		// Each sign of life makes the worker try again, with a request,
		// although the client backs off; each request that fails counts
		// once. (A sign of life whose reset of the stored failures lands
		// after the next failure was stored can bring one more retry: so
		// at least one request per sign of life.)
		for i := 2; i <= 5; i++ {
			before := sent.Load()
			sender.DestinationAlive(o.Name)
			testutil.Eventually(t, "another failed request", func() bool {
				n := sent.Load()
				return n > before && failures() == float64(n)
			})
		}
		if s := skipped(); s != 0 {
			t.Errorf("skipped counted %v, want none", s)
		}
	})
}
