// Package daemon assembles the server from its configuration: identity
// files, database, domain service and the two HTTP listeners; and takes it
// down again in order (listeners, then waiting requests, then database).
package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/internal/connlimit"
	"github.com/keyserver/keyserver/internal/iprange"
	"github.com/keyserver/keyserver/internal/metrics"
	"github.com/keyserver/keyserver/internal/server"
	"github.com/keyserver/keyserver/keyserver"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

// Daemon is a running server.
type Daemon struct {
	cfg        *config.Config
	log        *logrus.Logger
	srv        *server.Server
	client     *http.Server
	federation *http.Server
	clientLn   net.Listener
	fedLn      net.Listener
	errc       chan error
	metrics    *http.Server // nil when off
	metricsLn  net.Listener
}

// startMetrics serves Prometheus metrics (and, when configured, pprof) on
// the operators' listener.
func (d *Daemon) startMetrics(cfg *config.Config) error {
	reg := prometheus.NewRegistry()
	store := d.srv.Store
	reg.MustRegister(collectors.NewDBStatsCollector(store.DB(), store.Dialect()))
	if w := store.WriteDB(); w != store.DB() { // SQLite's single writer
		reg.MustRegister(collectors.NewDBStatsCollector(w, store.Dialect()+"_writer"))
	}
	gauge := func(name, help string, read func(ctx context.Context) (float64, error)) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			v, err := read(ctx)
			if err != nil {
				return -1
			}
			return v
		}))
	}
	gauge("keyserver_outbound_queue_depth", "Device-list updates waiting to be sent, all destinations.", func(ctx context.Context) (float64, error) {
		q, err := store.OutboundQueue(ctx)
		total := 0
		for _, n := range q {
			total += n
		}
		return float64(total), err
	})
	gauge("keyserver_outbound_destinations", "Destinations with device-list updates waiting.", func(ctx context.Context) (float64, error) {
		q, err := store.OutboundQueue(ctx)
		return float64(len(q)), err
	})
	gauge("keyserver_outbound_room_events", "Room events waiting to be sent, counted once per destination.", func(ctx context.Context) (float64, error) {
		n, err := store.PDUQueueDepth(ctx)
		return float64(n), err
	})
	if snd := d.srv.Sender; snd != nil {
		reg.MustRegister(snd) // the per-destination metrics of the outbound queue
	}
	gauge("keyserver_stale_device_lists", "Remote users whose device list waits for a resync.", func(ctx context.Context) (float64, error) {
		n, err := store.StaleCount(ctx)
		return float64(n), err
	})
	gauge("keyserver_sync_waiting", "Users with a /sync request waiting for news.", func(context.Context) (float64, error) {
		return float64(d.srv.Notifier.Waiting()), nil
	})
	// Statements per request, measured from outside (keyserver-bench reads
	// it around a phase): the cost the database sees, whatever the dialect.
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "keyserver_database_statements_total",
		Help: "Statements sent to the database, transaction begins and ends included."}, func() float64 {
		return float64(store.StatementsSent())
	}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(prometheus.Gatherers{metrics.Registry, reg}, promhttp.HandlerOpts{}))
	if cfg.Metrics.PProf {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	ln, err := net.Listen("tcp", cfg.Metrics.Listen)
	if err != nil {
		return fmt.Errorf("metrics listener: %w", err)
	}
	d.metricsLn = ln
	d.metrics = &http.Server{Handler: mux, ReadHeaderTimeout: 30 * time.Second}
	go func() { d.errc <- serve(d.metrics.Serve(ln)) }()
	return nil
}

// MetricsAddr is the metrics listener's address ("" when off).
func (d *Daemon) MetricsAddr() string {
	if d.metricsLn == nil {
		return ""
	}
	return d.metricsLn.Addr().String()
}

// NewLogger makes the logger the configuration asks for.
func NewLogger(cfg *config.Config) (*logrus.Logger, error) {
	log := logrus.New()
	lvl, err := logrus.ParseLevel(cfg.Log.Level)
	if err != nil {
		return nil, err
	}
	log.SetLevel(lvl)
	if cfg.Log.Format == "json" {
		log.SetFormatter(&logrus.JSONFormatter{})
	}
	return log, nil
}

// Option adjusts how a daemon starts; tests use them.
type Option func(*startOptions)

type startOptions struct {
	clientLn, fedLn net.Listener
	fedMiddleware   func(http.Handler) http.Handler
	tune            func(*server.Tuning)
}

// WithTuning adjusts the domain's, the federation client's and the
// workers' settings beyond the configuration (tests shorten backoffs with
// it).
func WithTuning(f func(*server.Tuning)) Option {
	return func(o *startOptions) { o.tune = f }
}

// WithListeners serves on listeners already open instead of the configured
// addresses (so a test can name a server after its port before it starts).
func WithListeners(client, federation net.Listener) Option {
	return func(o *startOptions) { o.clientLn, o.fedLn = client, federation }
}

// WithFederationMiddleware wraps the federation handler (tests count
// requests with it).
func WithFederationMiddleware(m func(http.Handler) http.Handler) Option {
	return func(o *startOptions) { o.fedMiddleware = m }
}

// Start brings the server up: the configuration must be valid. It returns
// once both listeners accept connections.
func Start(ctx context.Context, cfg *config.Config, log *logrus.Logger, options ...Option) (*Daemon, error) {
	var so startOptions
	for _, o := range options {
		o(&so)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	if cfg.Federation.TLSInsecureSkipVerify {
		log.Warn("federation.tls_insecure_skip_verify is on: other servers' certificates are not checked (for test set-ups only)")
	}
	srv, err := server.Build(ctx, cfg, server.Options{Logger: log, Identity: true, Federated: true, ParkSyncs: true, Tune: so.tune})
	if err != nil {
		return nil, err
	}
	d := &Daemon{cfg: cfg, log: log, srv: srv, errc: make(chan error, 4)}
	d.client = &http.Server{
		Handler:           srv.Client,
		ReadHeaderTimeout: cfg.ClientAPI.ReadTimeout.Duration(),
		ReadTimeout:       cfg.ClientAPI.ReadTimeout.Duration(),
		WriteTimeout:      cfg.ClientAPI.WriteTimeout.Duration(),
		IdleTimeout:       cfg.ClientAPI.IdleTimeout.Duration(),
	}
	d.federation = &http.Server{
		Handler:           srv.FederationAPI,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{*srv.TLS}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: cfg.Federation.ReadTimeout.Duration(),
		ReadTimeout:       cfg.Federation.ReadTimeout.Duration(),
		WriteTimeout:      cfg.Federation.WriteTimeout.Duration(),
		IdleTimeout:       cfg.Federation.IdleTimeout.Duration(),
	}
	if so.fedMiddleware != nil {
		d.federation.Handler = so.fedMiddleware(d.federation.Handler)
	}
	d.clientLn, d.fedLn = so.clientLn, so.fedLn
	if d.clientLn == nil {
		if d.clientLn, err = net.Listen("tcp", cfg.ClientAPI.Listen); err != nil {
			srv.Close(context.Background())
			return nil, fmt.Errorf("client API listener: %w", err)
		}
	}
	if d.fedLn == nil {
		if d.fedLn, err = net.Listen("tcp", cfg.Federation.Listen); err != nil {
			d.clientLn.Close()
			srv.Close(context.Background())
			return nil, fmt.Errorf("federation listener: %w", err)
		}
	}
	// Reverse proxies carry many clients' connections: they are not capped.
	proxies := iprange.MustParse(cfg.ClientAPI.TrustedProxies)
	d.clientLn = connlimit.Wrap(d.clientLn, connlimit.Options{
		Name: "client", Max: cfg.ClientAPI.MaxConnectionsPerAddress, Exempt: proxies, Logger: log})
	d.fedLn = connlimit.Wrap(d.fedLn, connlimit.Options{
		Name: "federation", Max: cfg.Federation.MaxConnectionsPerAddress, Exempt: proxies, Logger: log})
	srv.Start()
	if cfg.Metrics.Listen != "" {
		if err := d.startMetrics(cfg); err != nil {
			d.clientLn.Close()
			d.fedLn.Close()
			srv.Close(context.Background())
			return nil, err
		}
	}
	go func() { d.errc <- serve(d.client.Serve(d.clientLn)) }()
	// Answered parked connections come back to the same server.
	go func() { d.errc <- serve(d.client.Serve(srv.Parker.Listener())) }()
	go func() { d.errc <- serve(d.federation.ServeTLS(d.fedLn, "", "")) }()
	log.WithFields(logrus.Fields{
		"server_name": cfg.ServerName,
		"client":      d.clientLn.Addr().String(),
		"federation":  d.fedLn.Addr().String(),
		"database":    srv.Store.Dialect(),
	}).Info("keyserver started")
	return d, nil
}

func serve(err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// ClientAddr is the client API's address.
func (d *Daemon) ClientAddr() string { return d.clientLn.Addr().String() }

// FederationAddr is the federation API's address.
func (d *Daemon) FederationAddr() string { return d.fedLn.Addr().String() }

// Server is the server the daemon serves (for tests and tools).
func (d *Daemon) Server() *server.Server { return d.srv }

// Service is the keys domain (for tests and tools).
func (d *Daemon) Service() *keyserver.Service { return d.srv.Keys }

// Store is the database (for tests and tools).
func (d *Daemon) Store() *sqlstore.Store { return d.srv.Store }

// Federation is the outbound federation client (for tests and tools).
func (d *Daemon) Federation() *fedclient.Client { return d.srv.Federation }

// ParkedSyncs counts the /sync requests waiting parked, without a
// goroutine (for tests and tools).
func (d *Daemon) ParkedSyncs() int { return d.srv.Parker.Parked() }

// Errors receives a listener's failure.
func (d *Daemon) Errors() <-chan error { return d.errc }

// Shutdown stops accepting requests, lets those in flight finish (waiting
// /sync requests are answered at once), and closes the database.
func (d *Daemon) Shutdown(ctx context.Context) error {
	d.srv.ReleaseWaiting()
	// Parked /sync requests are not the server's connections any more:
	// they are answered (and closed) first.
	errs := []error{d.srv.Parker.Shutdown(ctx), d.client.Shutdown(ctx), d.federation.Shutdown(ctx)}
	if d.metrics != nil {
		errs = append(errs, d.metrics.Shutdown(ctx))
	}
	// Then the workers (what they have not sent stays queued in the
	// database for the next start), then the database.
	errs = append(errs, d.srv.Close(ctx))
	d.log.Info("keyserver stopped")
	return errors.Join(errs...)
}
