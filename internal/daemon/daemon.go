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
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/accountdata"
	"github.com/keyserver/keyserver/clientapi"
	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/dehydrated"
	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/federationapi"
	"github.com/keyserver/keyserver/initialsync"
	"github.com/keyserver/keyserver/internal/connlimit"
	"github.com/keyserver/keyserver/internal/httppark"
	"github.com/keyserver/keyserver/internal/identity"
	"github.com/keyserver/keyserver/internal/iprange"
	"github.com/keyserver/keyserver/internal/metrics"
	"github.com/keyserver/keyserver/internal/ratelimit"
	"github.com/keyserver/keyserver/internal/server"
	"github.com/keyserver/keyserver/keybackup"
	"github.com/keyserver/keyserver/keyserver"
	"github.com/keyserver/keyserver/profile"
	"github.com/keyserver/keyserver/publicrooms"
	"github.com/keyserver/keyserver/pushrules"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/storage"
	"github.com/keyserver/keyserver/storage/sqlstore"
	"github.com/keyserver/keyserver/todevice"
	"github.com/keyserver/keyserver/userdirectory"
	"github.com/keyserver/keyserver/voip"
)

// Daemon is a running server.
type Daemon struct {
	cfg        *config.Config
	log        *logrus.Logger
	store      *sqlstore.Store
	ks         *keyserver.Service
	fed        *fedclient.Client
	client     *http.Server
	parker     *httppark.Parker // the client API's parked /sync requests
	federation *http.Server
	clientLn   net.Listener
	fedLn      net.Listener
	errc       chan error
	metrics    *http.Server // nil when off
	metricsLn  net.Listener
	// the background workers (device-list sender and updater)
	stopWorkers context.CancelFunc
	workersDone chan struct{}
}

// startMetrics serves Prometheus metrics (and, when configured, pprof) on
// the operators' listener.
func (d *Daemon) startMetrics(cfg *config.Config) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewDBStatsCollector(d.store.DB(), d.store.Dialect()))
	if w := d.store.WriteDB(); w != d.store.DB() { // SQLite's single writer
		reg.MustRegister(collectors.NewDBStatsCollector(w, d.store.Dialect()+"_writer"))
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
		q, err := d.store.OutboundQueue(ctx)
		total := 0
		for _, n := range q {
			total += n
		}
		return float64(total), err
	})
	gauge("keyserver_outbound_destinations", "Destinations with device-list updates waiting.", func(ctx context.Context) (float64, error) {
		q, err := d.store.OutboundQueue(ctx)
		return float64(len(q)), err
	})
	gauge("keyserver_outbound_room_events", "Room events waiting to be sent, counted once per destination.", func(ctx context.Context) (float64, error) {
		n, err := d.store.PDUQueueDepth(ctx)
		return float64(n), err
	})
	if snd := d.ks.Sender(); snd != nil {
		reg.MustRegister(snd) // the per-destination metrics of the outbound queue
	}
	gauge("keyserver_stale_device_lists", "Remote users whose device list waits for a resync.", func(ctx context.Context) (float64, error) {
		n, err := d.store.StaleCount(ctx)
		return float64(n), err
	})
	gauge("keyserver_sync_waiting", "Users with a /sync request waiting for news.", func(context.Context) (float64, error) {
		return float64(d.ks.WaitingSyncs()), nil
	})
	// Statements per request, measured from outside (keyserver-bench reads
	// it around a phase): the cost the database sees, whatever the dialect.
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "keyserver_database_statements_total",
		Help: "Statements sent to the database, transaction begins and ends included."}, func() float64 {
		return float64(d.store.StatementsSent())
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

// serverAlive is told of each server that sent an authenticated request.
func (d *Daemon) serverAlive(origin string) {
	d.fed.MarkAlive(origin)
	d.ks.ServerAlive(origin)
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
	tune            func(*keyserver.Options, *fedclient.Options)
}

// WithTuning adjusts the domain's and the federation client's settings
// beyond the configuration (tests shorten backoffs with it).
func WithTuning(f func(*keyserver.Options, *fedclient.Options)) Option {
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
	// The database first: a start that fails on it (wrong URI, server
	// down) leaves no signing key or certificate behind, so the next start
	// does not find identity files it did not expect.
	store, err := sqlstore.Open(ctx, cfg.DatabaseURI(), cfg.ServerName)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	store.SetLogger(log)
	key, created, err := identity.LoadOrCreateSigningKey(cfg.SigningKeyFile())
	if err != nil {
		store.Close()
		return nil, err
	}
	if created {
		log.WithFields(logrus.Fields{"path": cfg.SigningKeyFile(), "key_id": key.KeyID}).Info("generated a new signing key")
	}
	cert, created, err := identity.LoadOrCreateTLS(cfg.TLSCertFile(), cfg.TLSKeyFile(), cfg.ServerName, cfg.GeneratedTLS())
	if err != nil {
		store.Close()
		return nil, err
	}
	if created {
		log.WithField("path", cfg.TLSCertFile()).Info("generated a self-signed TLS certificate for the federation listener")
	}
	d := &Daemon{cfg: cfg, log: log, store: store, errc: make(chan error, 4)}
	if cfg.Federation.TLSInsecureSkipVerify {
		log.Warn("federation.tls_insecure_skip_verify is on: other servers' certificates are not checked (for test set-ups only)")
	}
	fo := fedclient.Options{
		ServerName: cfg.ServerName, KeyID: key.KeyID, PrivateKey: key.PrivateKey,
		SkipVerify: cfg.Federation.TLSInsecureSkipVerify, Logger: log,
		// Validate has parsed both lists.
		AddressPolicy: &fedclient.AddressPolicy{
			Deny:  iprange.MustParse(cfg.Federation.IPRangeDenylist),
			Allow: iprange.MustParse(cfg.Federation.IPRangeAllowlist),
		},
	}
	ko := keyserver.Options{
		ServerName:                cfg.ServerName,
		RegistrationOpen:          cfg.ClientAPI.Registration == "open",
		BcryptCost:                cfg.ClientAPI.BcryptCost,
		MaxOneTimeKeys:            cfg.ClientAPI.MaxOneTimeKeysPerDevice,
		SyncMaxTimeout:            cfg.ClientAPI.SyncMaxTimeout.Duration(),
		DeviceNamesOverFederation: cfg.Federation.AllowDeviceNames,
		LaxKeyValidation:          !cfg.Keys.StrictValidation,
		SendWait:                  cfg.Federation.SendWait.Duration(),
		FailedLogins:              limiter(cfg.ClientAPI.FailedLoginRateLimit),
		BcryptConcurrency:         cfg.ClientAPI.BcryptConcurrency,
		AccountData:               store,
		ToDevice:                  store,
		Logger:                    log,
	}
	ko.Sender.Workers = cfg.Federation.SenderWorkers
	ko.Sender.ToDevice = store
	ko.Sender.PDUs = store
	// The to-device service tells the domain of its changes, and the
	// domain hands it the EDUs of other servers: d.ks is set below, before
	// any request is served.
	toDevice := todevice.New(store, todevice.Options{
		ServerName: cfg.ServerName, Federated: true,
		RateLimit: limiter(cfg.ClientAPI.ToDeviceRateLimit),
		Changed:   func(ch storage.Change) { d.ks.StreamAdvanced(ch) },
		Queued:    func() { d.ks.OutboundQueued() },
		Logger:    log,
	})
	ko.DirectToDevice = toDevice
	if so.tune != nil {
		so.tune(&ko, &fo)
	}
	d.fed = fedclient.New(fo)
	ko.Federation = d.fed
	d.ks = keyserver.New(store, ko)
	keyRing := fedclient.NewKeyRing(store, d.fed, cfg.ServerName, key.PublicKey())
	rooms := roomserver.New(store, roomserver.Options{ServerName: cfg.ServerName, KeyID: key.KeyID, PrivateKey: key.PrivateKey,
		Sink: d.ks, KeyRing: keyRing, Remote: d.fed, Handshakes: d.fed, Directory: d.fed, Federated: true, Logger: log})
	d.ks.SetRooms(rooms)
	d.ks.SetPDUReceiver(rooms)
	profiles := profile.New(store, cfg.ServerName, d.fed, rooms, log)
	rooms.SetProfiles(profiles)
	publicRooms := publicrooms.New(store, rooms, d.fed, cfg.ServerName, log)
	d.parker = httppark.New(httppark.Options{WriteTimeout: cfg.ClientAPI.WriteTimeout.Duration(), Logger: log})
	d.client = &http.Server{
		Handler: clientapi.NewHandler(d.ks, clientapi.Options{
			MaxRequestBytes: cfg.ClientAPI.MaxRequestBytes,
			AdminToken:      cfg.AdminToken,
			RateLimit:       ratelimit.New(float64(cfg.ClientAPI.RateLimitPerSecond), cfg.ClientAPI.RateLimitBurst, nil),
			WriteTimeout:    cfg.ClientAPI.WriteTimeout.Duration(),
			TrustedProxies:  iprange.MustParse(cfg.ClientAPI.TrustedProxies),
			LoginLimit:      limiter(cfg.ClientAPI.LoginRateLimit),
			RegisterLimit:   limiter(cfg.ClientAPI.RegistrationRateLimit),
			Logger:          log,
			KeyBackup:       keybackup.New(store, log, keybackup.Options{LaxAuthData: !cfg.Keys.StrictValidation}),
			AccountData:     accountdata.New(store, d.ks.StreamAdvanced),
			PushRules:       pushrules.New(store, d.ks.StreamAdvanced),
			PublicRooms:     publicRooms,
			InitialSync:     initialsync.New(rooms, store),
			UserDirectory:   userdirectory.New(store, cfg.ClientAPI.UserDirectory.SearchAllUsers),
			TURN: voip.New(voip.Config{URIs: cfg.ClientAPI.TURN.URIs, SharedSecret: cfg.ClientAPI.TURN.SharedSecret,
				Username: cfg.ClientAPI.TURN.Username, Password: cfg.ClientAPI.TURN.Password,
				UserLifetime: cfg.ClientAPI.TURN.UserLifetime.Duration()}, nil),
			Rooms:      rooms,
			Profiles:   profiles,
			ToDevice:   toDevice,
			Dehydrated: dehydrated.New(store, server.DehydratedKeys(d.ks), d.ks.DeviceListChanged, nil),
			Parker:     d.parker,
		}),
		ReadHeaderTimeout: cfg.ClientAPI.ReadTimeout.Duration(),
		ReadTimeout:       cfg.ClientAPI.ReadTimeout.Duration(),
		WriteTimeout:      cfg.ClientAPI.WriteTimeout.Duration(),
		IdleTimeout:       cfg.ClientAPI.IdleTimeout.Duration(),
	}
	d.federation = &http.Server{
		Handler: federationapi.NewHandler(d.ks, federationapi.Options{
			ServerName:      cfg.ServerName,
			SigningKey:      key,
			KeyValidity:     cfg.Federation.KeyValidity.Duration(),
			OldVerifyKeys:   oldVerifyKeys(cfg),
			KeyRing:         keyRing,
			Membership:      rooms,
			Profiles:        profiles,
			PublicRooms:     publicRooms,
			OnAuthenticated: d.serverAlive,
			Rooms:           rooms,
			MaxRequestBytes: cfg.ClientAPI.MaxRequestBytes,
			RateLimit:       ratelimit.New(float64(cfg.Federation.RateLimitPerSecond), cfg.Federation.RateLimitBurst, nil),
			Logger:          log,
		}),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
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
			d.parker.Shutdown(context.Background())
			store.Close()
			return nil, fmt.Errorf("client API listener: %w", err)
		}
	}
	if d.fedLn == nil {
		if d.fedLn, err = net.Listen("tcp", cfg.Federation.Listen); err != nil {
			d.clientLn.Close()
			d.parker.Shutdown(context.Background())
			store.Close()
			return nil, fmt.Errorf("federation listener: %w", err)
		}
	}
	// Reverse proxies carry many clients' connections: they are not capped.
	proxies := iprange.MustParse(cfg.ClientAPI.TrustedProxies)
	d.clientLn = connlimit.Wrap(d.clientLn, connlimit.Options{
		Name: "client", Max: cfg.ClientAPI.MaxConnectionsPerAddress, Exempt: proxies, Logger: log})
	d.fedLn = connlimit.Wrap(d.fedLn, connlimit.Options{
		Name: "federation", Max: cfg.Federation.MaxConnectionsPerAddress, Exempt: proxies, Logger: log})
	var workers context.Context
	workers, d.stopWorkers = context.WithCancel(context.Background())
	d.workersDone = make(chan struct{})
	go func() { defer close(d.workersDone); d.ks.Run(workers) }()
	if cfg.Metrics.Listen != "" {
		if err := d.startMetrics(cfg); err != nil {
			d.stopWorkers()
			d.clientLn.Close()
			d.fedLn.Close()
			d.parker.Shutdown(context.Background())
			store.Close()
			return nil, err
		}
	}
	go func() { d.errc <- serve(d.client.Serve(d.clientLn)) }()
	// Answered parked connections come back to the same server.
	go func() { d.errc <- serve(d.client.Serve(d.parker.Listener())) }()
	go func() { d.errc <- serve(d.federation.ServeTLS(d.fedLn, "", "")) }()
	log.WithFields(logrus.Fields{
		"server_name": cfg.ServerName,
		"client":      d.clientLn.Addr().String(),
		"federation":  d.fedLn.Addr().String(),
		"database":    store.Dialect(),
	}).Info("keyserver started")
	return d, nil
}

// limiter makes the limiter a rate-limit setting describes.
func limiter(rl config.RateLimit) *ratelimit.Limiter {
	return ratelimit.New(rl.PerSecond, rl.Burst, nil)
}

func oldVerifyKeys(cfg *config.Config) map[string]federationapi.OldVerifyKey {
	out := make(map[string]federationapi.OldVerifyKey, len(cfg.Federation.OldVerifyKeys))
	for id, k := range cfg.Federation.OldVerifyKeys {
		out[id] = federationapi.OldVerifyKey{Key: strings.TrimRight(k.Key, "="), ExpiredTS: k.ExpiredTS}
	}
	return out
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

// Service is the domain service (for tests and tools).
func (d *Daemon) Service() *keyserver.Service { return d.ks }

// Store is the database (for tests and tools).
func (d *Daemon) Store() *sqlstore.Store { return d.store }

// Federation is the outbound federation client (for tests and tools).
func (d *Daemon) Federation() *fedclient.Client { return d.fed }

// ParkedSyncs counts the /sync requests waiting parked, without a
// goroutine (for tests and tools).
func (d *Daemon) ParkedSyncs() int { return d.parker.Parked() }

// Errors receives a listener's failure.
func (d *Daemon) Errors() <-chan error { return d.errc }

// Shutdown stops accepting requests, lets those in flight finish (waiting
// /sync requests are answered at once), and closes the database.
func (d *Daemon) Shutdown(ctx context.Context) error {
	d.ks.Close()
	// Parked /sync requests are not the server's connections any more:
	// they are answered (and closed) first.
	errs := []error{d.parker.Shutdown(ctx), d.client.Shutdown(ctx), d.federation.Shutdown(ctx)}
	if d.metrics != nil {
		errs = append(errs, d.metrics.Shutdown(ctx))
	}
	// Then the workers: what they have not sent stays queued in the
	// database for the next start.
	d.stopWorkers()
	select {
	case <-d.workersDone:
	case <-ctx.Done():
		errs = append(errs, ctx.Err())
	}
	errs = append(errs, d.store.Close())
	d.log.Info("keyserver stopped")
	return errors.Join(errs...)
}
