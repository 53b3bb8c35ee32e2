package metrics

import "github.com/prometheus/client_golang/prometheus"

// ConnectionsRefused counts connections closed at once because their
// remote address already held as many as a listener allows, by listener
// (client, federation).
var ConnectionsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "keyserver_connections_refused_total",
	Help: "Connections refused because their address held the most a listener allows, by listener.",
}, []string{"listener"})

func init() { Registry.MustRegister(ConnectionsRefused) }
