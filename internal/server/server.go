// Package server builds the server from its configuration: the database,
// the identity, the domain services, the background workers and the two
// HTTP handlers. The daemon, the test helpers and the admin commands all
// build it here, with Build.
//
// Each part is built once what it needs exists: first the notifier that
// wakes waiting /sync requests and the signals of the background workers
// (changes), which the domains that write the stream are given; then the
// rooms, the to-device messages, accounts and the other domains; then the
// keys domain; then /sync (package syncapi), which reads from them; then
// the router of other servers' transactions; then the HTTP handlers. No part is
// handed another after it was built.
package server

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/accountdata"
	"github.com/keyserver/keyserver/clientapi"
	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/crosssigning"
	"github.com/keyserver/keyserver/dehydrated"
	"github.com/keyserver/keyserver/devicelist"
	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/federationapi"
	"github.com/keyserver/keyserver/federationsender"
	"github.com/keyserver/keyserver/fedrouter"
	"github.com/keyserver/keyserver/initialsync"
	"github.com/keyserver/keyserver/internal/httppark"
	"github.com/keyserver/keyserver/internal/identity"
	"github.com/keyserver/keyserver/internal/iprange"
	"github.com/keyserver/keyserver/internal/ratelimit"
	"github.com/keyserver/keyserver/keybackup"
	"github.com/keyserver/keyserver/keyserver"
	"github.com/keyserver/keyserver/media"
	"github.com/keyserver/keyserver/presence"
	"github.com/keyserver/keyserver/profile"
	"github.com/keyserver/keyserver/publicrooms"
	"github.com/keyserver/keyserver/pusher"
	"github.com/keyserver/keyserver/pushrules"
	"github.com/keyserver/keyserver/receipts"
	"github.com/keyserver/keyserver/relations"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/search"
	"github.com/keyserver/keyserver/spaces"
	"github.com/keyserver/keyserver/storage/sqlstore"
	"github.com/keyserver/keyserver/syncapi"
	"github.com/keyserver/keyserver/syncnotify"
	"github.com/keyserver/keyserver/todevice"
	"github.com/keyserver/keyserver/typing"
	"github.com/keyserver/keyserver/userapi"
	"github.com/keyserver/keyserver/userdirectory"
	"github.com/keyserver/keyserver/voip"
)

// Options say how the server is built beyond its configuration.
type Options struct {
	Logger *logrus.Logger
	// Now is the clock of the domains and the rate limits; time.Now when
	// nil.
	Now func() time.Time
	// Identity loads the signing key and the TLS certificate from the data
	// directory, creating them when missing (the daemon). Without, the
	// server signs with a key made for the run and has no certificate.
	Identity bool
	// Federated talks to other servers: a federation client, the outbound
	// queue and the updater of remote device lists. Without, other
	// servers' users are answered with a failure and nothing is sent.
	Federated bool
	// ParkSyncs parks the connections of waiting /sync requests (the
	// daemon); without, they wait in their handlers.
	ParkSyncs bool
	// Tune adjusts settings beyond the configuration (tests shorten the
	// workers' backoffs with it).
	Tune func(*Tuning)
}

// Tuning are the settings Options.Tune may adjust.
type Tuning struct {
	Users      *userapi.Options
	Keys       *keyserver.Options
	Federation *fedclient.Options
	Sender     *federationsender.Options
	Updater    *devicelist.Options
	Tracker    *devicelist.TrackerOptions
}

// Server is the built server: its parts, and what takes them down.
type Server struct {
	Config *config.Config
	Log    *logrus.Logger
	Store  *sqlstore.Store
	// SigningKey signs events and federation requests; TLS is the
	// federation listener's certificate (nil without Options.Identity).
	SigningKey identity.SigningKey
	TLS        *tls.Certificate
	// Notifier wakes waiting /sync requests.
	Notifier *syncnotify.Notifier
	// Federation, Sender and Updater are nil unless Options.Federated.
	Federation *fedclient.Client
	Sender     *federationsender.Sender
	Updater    *devicelist.Updater
	// DeviceLists tracks other servers' users' device lists.
	DeviceLists *devicelist.Tracker
	KeyRing     *gomatrixserverlib.KeyRing

	Users       *userapi.Service
	Keys        *keyserver.Service
	Rooms       *roomserver.Service
	Profiles    *profile.Service
	PublicRooms *publicrooms.Service
	Spaces      *spaces.Service
	ToDevice    *todevice.Service
	AccountData *accountdata.Service
	// Sync assembles /sync and answers /keys/changes.
	Sync       *syncapi.Service
	Dehydrated *dehydrated.Service
	PushRules  *pushrules.Service
	Pushers    *pusher.Service
	Media      *media.Service
	// Presence keeps the users' presence (off, it answers as Synapse
	// does with presence off).
	Presence *presence.Service
	// Typing and Receipts are the rooms' ephemeral events.
	Typing   *typing.Service
	Receipts *receipts.Service
	// Transactions routes other servers' transactions to the domains.
	Transactions *fedrouter.Router
	// Parker holds parked /sync connections (nil without
	// Options.ParkSyncs).
	Parker *httppark.Parker

	// Client and FederationAPI are the two HTTP handlers.
	Client        http.Handler
	FederationAPI http.Handler

	// cleanup is undone last in, first out by Close.
	mu      sync.Mutex
	cleanup []func(context.Context) error
}

// Build builds the server cfg describes. The configuration must be valid.
// The database is opened first, so that a start that fails on it leaves
// no identity files behind. On failure what was built is taken down.
func Build(ctx context.Context, cfg *config.Config, o Options) (_ *Server, err error) {
	if o.Logger == nil {
		o.Logger = logrus.StandardLogger()
	}
	log := o.Logger
	s := &Server{Config: cfg, Log: log}
	defer func() {
		if err != nil {
			_ = s.Close(context.Background())
		}
	}()
	store, err := sqlstore.Open(ctx, cfg.DatabaseURI(), cfg.ServerName)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	store.SetLogger(log)
	s.Store = store
	s.push(func(context.Context) error { return store.Close() })
	if err := s.loadIdentity(o); err != nil {
		return nil, err
	}

	// First what the domains that write the stream are given: the
	// notifier and the workers' signals.
	s.Notifier = syncnotify.New()
	s.push(func(context.Context) error { s.Notifier.Close(); return nil })
	t := Tuning{Users: &userapi.Options{}, Keys: &keyserver.Options{}, Federation: &fedclient.Options{}, Sender: &federationsender.Options{}, Updater: &devicelist.Options{}, Tracker: &devicelist.TrackerOptions{}}
	*t.Federation = fedclient.Options{
		ServerName: cfg.ServerName, KeyID: s.SigningKey.KeyID, PrivateKey: s.SigningKey.PrivateKey,
		SkipVerify: cfg.Federation.TLSInsecureSkipVerify, Logger: log,
		// Validate has parsed both lists.
		AddressPolicy: &fedclient.AddressPolicy{
			Deny:  iprange.MustParse(cfg.Federation.IPRangeDenylist),
			Allow: iprange.MustParse(cfg.Federation.IPRangeAllowlist),
		},
	}
	*t.Users = userapi.Options{
		ServerName:        cfg.ServerName,
		RegistrationOpen:  cfg.ClientAPI.Registration == "open",
		BcryptCost:        cfg.ClientAPI.BcryptCost,
		FailedLogins:      limiter(cfg.ClientAPI.FailedLoginRateLimit, o.Now),
		BcryptConcurrency: cfg.ClientAPI.BcryptConcurrency,
		Logger:            log,
		Now:               o.Now,
	}
	*t.Keys = keyserver.Options{
		ServerName:                cfg.ServerName,
		MaxOneTimeKeys:            cfg.ClientAPI.MaxOneTimeKeysPerDevice,
		DeviceNamesOverFederation: cfg.Federation.AllowDeviceNames,
		LaxKeyValidation:          !cfg.Keys.StrictValidation,
		Logger:                    log,
		Now:                       o.Now,
		Notifier:                  s.Notifier,
	}
	*t.Sender = federationsender.Options{Workers: cfg.Federation.SenderWorkers, ToDevice: store, PDUs: store, Presence: store,
		ServerName: cfg.ServerName, DeviceNames: cfg.Federation.AllowDeviceNames, FormatUpdate: crosssigning.UpdateEDU, Logger: log}
	*t.Updater = devicelist.Options{Logger: log, Wake: devicelist.NewSignal()}
	*t.Tracker = devicelist.TrackerOptions{SendWait: cfg.Federation.SendWait.Duration(), Logger: log, Now: o.Now}
	if o.Tune != nil {
		o.Tune(&t)
	}
	ch := changes{notifier: s.Notifier}
	if o.Federated {
		s.Federation = fedclient.New(*t.Federation)
		s.Sender = federationsender.New(store, s.Federation, *t.Sender)
		ch.outbound, ch.stale = s.Sender, t.Updater.Wake
		t.Keys.Federation, t.Keys.Outbound, t.Keys.StaleLists = s.Federation, s.Sender, t.Updater.Wake
		t.Tracker.Federation, t.Tracker.StaleLists = s.Federation, t.Updater.Wake
	}

	// Push rules and the pushers, which hear of every committed room
	// event as the keys domain does.
	s.PushRules = pushrules.New(store, ch.StreamAdvanced)
	s.Pushers = pusher.New(store, pusher.Options{ServerName: cfg.ServerName, Rules: pushRules{s.PushRules},
		AddressPolicy: t.Federation.AddressPolicy, MinBackoff: cfg.Push.MinBackoff.Duration(),
		MaxBackoff: cfg.Push.MaxBackoff.Duration(), Timeout: cfg.Push.RequestTimeout.Duration(), Logger: log})

	// Presence, which hears of room writes for the servers joining rooms.
	po := presence.Options{ServerName: cfg.ServerName, Enabled: cfg.Presence.Enabled, Changed: ch.StreamAdvanced,
		Logger: log, Now: o.Now}
	if o.Federated {
		po.Queued = ch.OutboundQueued
	}
	s.Presence = presence.New(store, po)

	// The domains /sync reads from.
	ro := roomserver.Options{ServerName: cfg.ServerName, KeyID: s.SigningKey.KeyID, PrivateKey: s.SigningKey.PrivateKey,
		Sink: roomserver.Sinks{s.Pushers, ch, s.Presence}, Upgrades: s.PushRules, Profiles: profile.NewLocal(store, cfg.ServerName), Federated: o.Federated, Logger: log, Now: o.Now}
	ro.Relations = relations.New(store)
	var profileRemote profile.Remote
	var roomsRemote publicrooms.Remote
	if s.Federation != nil {
		s.KeyRing = fedclient.NewKeyRing(store, s.Federation, cfg.ServerName, s.SigningKey.PublicKey())
		ro.KeyRing, ro.Remote, ro.Handshakes, ro.Directory = s.KeyRing, s.Federation, s.Federation, s.Federation
		profileRemote, roomsRemote = s.Federation, s.Federation
	}
	s.Rooms = roomserver.New(store, ro)
	s.Profiles = profile.New(store, cfg.ServerName, profileRemote, s.Rooms, log)
	s.PublicRooms = publicrooms.New(store, s.Rooms, roomsRemote, cfg.ServerName, log)
	var spacesRemote spaces.Remote
	if s.Federation != nil {
		spacesRemote = s.Federation
	}
	s.Spaces = spaces.New(store, spacesRemote, cfg.ServerName, log)
	s.ToDevice = todevice.New(store, todevice.Options{
		ServerName: cfg.ServerName, Federated: o.Federated,
		RateLimit: limiter(cfg.ClientAPI.ToDeviceRateLimit, o.Now),
		Changed:   ch.StreamAdvanced,
		Queued:    ch.OutboundQueued,
		Logger:    log, Now: o.Now,
	})

	// Accounts and devices.
	t.Users.Changes = ch
	s.Users = userapi.New(store, *t.Users)

	s.AccountData = accountdata.New(store, ch.StreamAdvanced)
	// With presence off, /sync has no presence section and other
	// servers' presence is ignored.
	var syncPresence syncapi.Presence
	var fedPresence fedrouter.PresenceReceiver
	if cfg.Presence.Enabled {
		syncPresence, fedPresence = s.Presence, s.Presence
	}
	s.Typing, s.Receipts = newEphemeral(cfg, store, ch, s.Pushers, o.Federated, log, o.Now)

	// The keys domain, then /sync, which reads from it and the others.
	t.Tracker.Changed = ch.StreamAdvanced
	s.DeviceLists = devicelist.NewTracker(store, *t.Tracker)
	t.Keys.Passwords, t.Keys.RemoteLists = s.Users, s.DeviceLists
	s.Keys = keyserver.New(store, *t.Keys)
	s.Sync = syncapi.New(store, syncapi.Options{Keys: s.Keys, Notifier: s.Notifier,
		MaxTimeout: cfg.ClientAPI.SyncMaxTimeout.Duration(), AccountData: s.AccountData, ToDevice: s.ToDevice,
		Rooms: syncRooms{s.Rooms}, Unread: s.Pushers, Presence: syncPresence,
		Ephemeral: []syncapi.Ephemeral{s.Typing, s.Receipts}})
	if o.Federated {
		s.Updater = devicelist.New(store, s.DeviceLists.ResyncStale, *t.Updater)
	}
	// Other servers' transactions, routed to the domains.
	s.Transactions = fedrouter.New(store, fedrouter.Options{DeviceLists: s.DeviceLists, DirectToDevice: s.ToDevice,
		PDUs: s.Rooms, Presence: fedPresence, Typing: s.Typing, Receipts: s.Receipts, Now: o.Now})
	s.Dehydrated = dehydrated.New(store, dehydratedKeys{s.Keys}, ch.DeviceListChanged, o.Now)
	if s.Media, err = newMedia(cfg, store, s.Federation, log, o.Now); err != nil {
		return nil, err
	}

	// The HTTP handlers.
	if o.ParkSyncs {
		s.Parker = httppark.New(httppark.Options{WriteTimeout: cfg.ClientAPI.WriteTimeout.Duration(), Logger: log})
		s.push(s.Parker.Shutdown)
	}
	turn := cfg.ClientAPI.TURN
	s.Client = clientapi.NewHandler(s.Users, s.Keys, s.Sync, clientapi.Options{
		MaxRequestBytes: cfg.ClientAPI.MaxRequestBytes,
		AdminToken:      cfg.AdminToken,
		RateLimit:       ratelimit.New(float64(cfg.ClientAPI.RateLimitPerSecond), cfg.ClientAPI.RateLimitBurst, nil),
		WriteTimeout:    cfg.ClientAPI.WriteTimeout.Duration(),
		TrustedProxies:  iprange.MustParse(cfg.ClientAPI.TrustedProxies),
		LoginLimit:      limiter(cfg.ClientAPI.LoginRateLimit, o.Now),
		RegisterLimit:   limiter(cfg.ClientAPI.RegistrationRateLimit, o.Now),
		Logger:          log,
		KeyBackup:       keybackup.New(store, log, keybackup.Options{LaxAuthData: !cfg.Keys.StrictValidation}),
		AccountData:     s.AccountData,
		PushRules:       s.PushRules,
		Pushers:         s.Pushers,
		PublicRooms:     s.PublicRooms,
		InitialSync:     initialsync.New(InitialSyncRooms(s.Rooms), store),
		UserDirectory:   userdirectory.New(store, cfg.ClientAPI.UserDirectory.SearchAllUsers),
		Search:          search.New(store, searchRooms{s.Rooms}),
		TURN: voip.New(voip.Config{URIs: turn.URIs, SharedSecret: turn.SharedSecret,
			Username: turn.Username, Password: turn.Password, UserLifetime: turn.UserLifetime.Duration()}, o.Now),
		Rooms:      s.Rooms,
		Profiles:   s.Profiles,
		ToDevice:   s.ToDevice,
		Dehydrated: s.Dehydrated,
		Parker:     s.Parker,
		Media:      s.Media,
		Spaces:     s.Spaces,
		Presence:   s.Presence,
		Typing:     s.Typing,
		Receipts:   s.Receipts,
	})
	s.FederationAPI = federationapi.NewHandler(s.Keys, s.Transactions, federationapi.Options{
		ServerName:      cfg.ServerName,
		SigningKey:      s.SigningKey,
		KeyValidity:     cfg.Federation.KeyValidity.Duration(),
		OldVerifyKeys:   oldVerifyKeys(cfg),
		KeyRing:         s.KeyRing,
		Membership:      s.Rooms,
		Profiles:        s.Profiles,
		PublicRooms:     s.PublicRooms,
		OnAuthenticated: s.ServerAlive,
		Rooms:           s.Rooms,
		MaxRequestBytes: cfg.ClientAPI.MaxRequestBytes,
		RateLimit:       ratelimit.New(float64(cfg.Federation.RateLimitPerSecond), cfg.Federation.RateLimitBurst, nil),
		Logger:          log,
		Media:           s.Media,
		Spaces:          s.Spaces,
	})
	return s, nil
}

// loadIdentity loads (or makes) the signing key and TLS certificate.
func (s *Server) loadIdentity(o Options) error {
	cfg, log := s.Config, s.Log
	if !o.Identity {
		// Nothing is kept: the key signs only for this run.
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return err
		}
		s.SigningKey = identity.SigningKey{KeyID: "ed25519:run", PrivateKey: priv}
		return nil
	}
	key, created, err := identity.LoadOrCreateSigningKey(cfg.SigningKeyFile())
	if err != nil {
		return err
	}
	if created {
		log.WithFields(logrus.Fields{"path": cfg.SigningKeyFile(), "key_id": key.KeyID}).Info("generated a new signing key")
	}
	s.SigningKey = key
	cert, created, err := identity.LoadOrCreateTLS(cfg.TLSCertFile(), cfg.TLSKeyFile(), cfg.ServerName, cfg.GeneratedTLS())
	if err != nil {
		return err
	}
	if created {
		log.WithField("path", cfg.TLSCertFile()).Info("generated a self-signed TLS certificate for the federation listener")
	}
	s.TLS = &cert
	return nil
}

// Start runs the background workers until Close: the notifier's watch of
// changes made by other daemons sharing the database and, when federated,
// the outbound queue and the updater of remote device lists. What they
// have not sent when they stop stays queued in the database.
func (s *Server) Start() {
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	run := func(f func(context.Context)) {
		wg.Add(1)
		go func() { defer wg.Done(); f(ctx) }()
	}
	run(func(ctx context.Context) { s.Notifier.Watch(ctx, s.Store, s.Log) })
	run(s.Pushers.Run)
	run(s.Presence.Run)
	run(s.Typing.Run)
	if s.Sender != nil {
		run(s.Sender.Run)
	}
	if s.Updater != nil {
		run(s.Updater.Run)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	s.push(func(ctx context.Context) error {
		stop()
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// ServerAlive is told of every server that made an authenticated request:
// it is up, so waits on its account end. It runs on the request's path,
// so it only hands the news on, without waiting for the database.
func (s *Server) ServerAlive(origin string) {
	if s.Federation == nil {
		return
	}
	s.Federation.MarkAlive(origin)
	s.Sender.DestinationAlive(origin)
	s.Updater.ServerAlive(origin)
}

// ReleaseWaiting answers the waiting /sync requests at once: the first
// step of a shutdown, before the listeners are shut down.
func (s *Server) ReleaseWaiting() { s.Notifier.Close() }

// Close takes down what Build and Start set up, last first: parked
// connections, waiting requests, background workers, then the database.
// Shut the listeners down before (after ReleaseWaiting).
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	cleanup := s.cleanup
	s.cleanup = nil
	s.mu.Unlock()
	var errs []error
	for i := len(cleanup) - 1; i >= 0; i-- {
		errs = append(errs, cleanup[i](ctx))
	}
	return errors.Join(errs...)
}

func (s *Server) push(f func(context.Context) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleanup = append(s.cleanup, f)
}

// limiter makes the limiter a rate-limit setting describes.
func limiter(rl config.RateLimit, now func() time.Time) *ratelimit.Limiter {
	return ratelimit.New(rl.PerSecond, rl.Burst, now)
}

func oldVerifyKeys(cfg *config.Config) map[string]federationapi.OldVerifyKey {
	out := make(map[string]federationapi.OldVerifyKey, len(cfg.Federation.OldVerifyKeys))
	for id, k := range cfg.Federation.OldVerifyKeys {
		out[id] = federationapi.OldVerifyKey{Key: strings.TrimRight(k.Key, "="), ExpiredTS: k.ExpiredTS}
	}
	return out
}
