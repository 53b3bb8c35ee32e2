package federationsender

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The per-destination metrics, read from the database at each scrape, for
// the destinations with work waiting or failures (so their number is
// bounded by those).
var (
	destPendingDesc = prometheus.NewDesc("keyserver_outbound_destination_pending",
		"Items waiting to be sent to a destination: device-list and signing-key updates, to-device messages, room events.",
		[]string{"destination"}, nil)
	destAttemptsDesc = prometheus.NewDesc("keyserver_outbound_destination_failed_attempts",
		"Failed deliveries to a destination since it was last reached or heard from (shared by the daemons of the database).",
		[]string{"destination"}, nil)
	destNextTryDesc = prometheus.NewDesc("keyserver_outbound_destination_next_try_seconds",
		"Seconds until a failing destination is tried again (0: due now or not failing).",
		[]string{"destination"}, nil)
	destLeaseDesc = prometheus.NewDesc("keyserver_outbound_destination_lease_held",
		"1 while this daemon holds the destination's lease (it is sending to it), else 0.",
		[]string{"destination"}, nil)
)

// Describe and Collect make the Sender a prometheus.Collector of the
// per-destination metrics.
func (s *Sender) Describe(ch chan<- *prometheus.Desc) {
	ch <- destPendingDesc
	ch <- destAttemptsDesc
	ch <- destNextTryDesc
	ch <- destLeaseDesc
}

// Collect reads the destinations from the database; on an error it
// reports none (the error is logged).
func (s *Sender) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dests, err := s.db.OutboundDestinations(ctx)
	if err != nil {
		s.dbError(ctx, s.o.Logger, err, "reading the destinations for the metrics")
		return
	}
	owner, _, held := s.holder()
	now := s.o.Clock.Now().UnixMilli()
	for _, d := range dests {
		name := d.Destination
		ch <- prometheus.MustNewConstMetric(destPendingDesc, prometheus.GaugeValue, float64(d.Updates+d.ToDevice+d.PDUs), name)
		ch <- prometheus.MustNewConstMetric(destAttemptsDesc, prometheus.GaugeValue, float64(d.Retry.Attempts), name)
		next := 0.0
		if d.Retry.Attempts > 0 && d.Retry.RetryAt > now {
			next = float64(d.Retry.RetryAt-now) / 1000
		}
		ch <- prometheus.MustNewConstMetric(destNextTryDesc, prometheus.GaugeValue, next, name)
		lease := 0.0
		if held && d.LeaseOwner == owner && d.LeaseExpires > now {
			lease = 1
		}
		ch <- prometheus.MustNewConstMetric(destLeaseDesc, prometheus.GaugeValue, lease, name)
	}
}
