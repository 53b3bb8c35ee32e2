// Package metrics holds the server's Prometheus metrics. They are served
// on a listener of their own (metrics.listen), off the public ports.
// Label values are bounded: endpoints are route templates, destinations
// are limited to the busiest few.
package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	// Registry holds every metric of the server.
	Registry = prometheus.NewRegistry()

	// HTTPRequests observes the HTTP requests (see package httpmetrics,
	// which keeps the router out of this package and of the domain).
	HTTPRequests = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "keyserver_http_request_duration_seconds",
		Help:    "HTTP requests by API, endpoint (route template), method and status, with their latency.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10, 30},
	}, []string{"api", "endpoint", "method", "status"})

	// OneTimeKeysUploaded counts one-time keys stored.
	OneTimeKeysUploaded = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "keyserver_one_time_keys_uploaded_total", Help: "One-time keys stored."})
	// KeysClaimed counts keys handed out, by kind (one_time, fallback).
	KeysClaimed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "keyserver_keys_claimed_total", Help: "Keys handed out by claims, by kind."}, []string{"kind"})
	// Resyncs counts remote device-list resyncs by result (started, succeeded, failed).
	Resyncs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "keyserver_device_list_resyncs_total", Help: "Remote device-list resyncs, by result."}, []string{"result"})
	// SendWait observes how long incoming /send transactions took.
	SendWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "keyserver_federation_send_seconds", Help: "Time to process an incoming /send transaction.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 9)})
	// OutboundFailures counts deliveries of device-list updates that were
	// tried and failed.
	OutboundFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "keyserver_outbound_delivery_failures_total", Help: "Failed deliveries of device-list update transactions (requests that were sent)."})
	// OutboundSkipped counts deliveries the federation client refused
	// without a request, because the destination was backing off.
	OutboundSkipped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "keyserver_outbound_delivery_skipped_total", Help: "Deliveries of device-list update transactions not tried because the destination was backing off."})
	// FederationFailures counts failed outbound federation requests by
	// destination (the label is "other" once many destinations were seen).
	FederationFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "keyserver_federation_request_failures_total", Help: "Failed outbound federation requests by destination."},
		[]string{"destination"})
)

func init() {
	Registry.MustRegister(HTTPRequests, OneTimeKeysUploaded, KeysClaimed, Resyncs, SendWait, OutboundFailures, OutboundSkipped, FederationFailures,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
}

// maxDestinationLabels bounds the destination label's values.
const maxDestinationLabels = 50

var (
	destinationsMu   sync.Mutex
	destinationsSeen = map[string]bool{}
)

// FederationFailure records a failed request to dest.
func FederationFailure(dest string) {
	destinationsMu.Lock()
	defer destinationsMu.Unlock()
	label := dest
	if !destinationsSeen[dest] {
		if len(destinationsSeen) >= maxDestinationLabels {
			label = "other"
		} else {
			destinationsSeen[dest] = true
		}
	}
	FederationFailures.WithLabelValues(label).Inc()
}
