package federationsender

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/keyserver/keyserver/internal/clock"
	"github.com/keyserver/keyserver/storage"
)

// The per-destination metrics: what waits, the failed attempts, the
// seconds to the next try, and whether this daemon holds the lease.
func TestDestinationMetrics(t *testing.T) {
	q := newFakeQueue()
	clk := clock.NewFake()
	now := clk.Now().UnixMilli()
	q.add("down.test", 3)
	q.add("busy.test", 2)
	q.retries["down.test"] = storage.DestinationRetry{Destination: "down.test", Attempts: 6, FailingSince: now - 60_000, RetryAt: now + 12_500}
	s := startTest(q, &scriptedTransport{}, Options{Clock: clk})
	q.leases["busy.test"] = fakeLease{s.owner, now + 60_000}
	q.leases["down.test"] = fakeLease{s.owner, 0} // paused: waiting to retry
	reg := prometheus.NewRegistry()
	reg.MustRegister(s)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			got[f.GetName()+" "+m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	want := map[string]float64{
		"keyserver_outbound_destination_pending down.test":          3,
		"keyserver_outbound_destination_failed_attempts down.test":  6,
		"keyserver_outbound_destination_next_try_seconds down.test": 12.5,
		"keyserver_outbound_destination_lease_held down.test":       0,
		"keyserver_outbound_destination_pending busy.test":          2,
		"keyserver_outbound_destination_failed_attempts busy.test":  0,
		"keyserver_outbound_destination_next_try_seconds busy.test": 0,
		"keyserver_outbound_destination_lease_held busy.test":       1,
	}
	if len(got) != len(want) {
		t.Fatalf("metrics %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	clk.Advance(20 * time.Second)
	families, _ = reg.Gather()
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if f.GetName() == "keyserver_outbound_destination_next_try_seconds" && m.GetGauge().GetValue() != 0 {
				t.Errorf("next try of %s in %v once due", m.GetLabel()[0].GetValue(), m.GetGauge().GetValue())
			}
		}
	}
}
