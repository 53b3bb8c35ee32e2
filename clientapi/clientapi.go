// Package clientapi is the HTTP face of the client-server API: it decodes
// requests, calls package keyserver and encodes the answers. No rule of the
// domain lives here.
package clientapi

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/gorilla/mux"
	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/accountdata"
	"github.com/keyserver/keyserver/dehydrated"
	"github.com/keyserver/keyserver/initialsync"
	"github.com/keyserver/keyserver/internal/httppark"
	"github.com/keyserver/keyserver/internal/httpx"
	"github.com/keyserver/keyserver/internal/iprange"
	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/metrics/httpmetrics"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/ratelimit"
	"github.com/keyserver/keyserver/internal/reqlog"
	"github.com/keyserver/keyserver/keybackup"
	"github.com/keyserver/keyserver/keyserver"
	"github.com/keyserver/keyserver/media"
	"github.com/keyserver/keyserver/presence"
	"github.com/keyserver/keyserver/profile"
	"github.com/keyserver/keyserver/publicrooms"
	"github.com/keyserver/keyserver/pusher"
	"github.com/keyserver/keyserver/pushrules"
	"github.com/keyserver/keyserver/receipts"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/search"
	"github.com/keyserver/keyserver/spaces"
	"github.com/keyserver/keyserver/syncapi"
	"github.com/keyserver/keyserver/syncnotify"
	"github.com/keyserver/keyserver/todevice"
	"github.com/keyserver/keyserver/typing"
	"github.com/keyserver/keyserver/userapi"
	"github.com/keyserver/keyserver/userdirectory"
	"github.com/keyserver/keyserver/voip"
)

// Options configure the client API.
type Options struct {
	MaxRequestBytes int64
	// AdminToken authenticates the admin API; empty disables it.
	AdminToken string
	// RateLimit bounds each access token's requests; nil: no limit.
	RateLimit *ratelimit.Limiter
	// TrustedProxies are the reverse proxies whose X-Forwarded-For is
	// believed; empty: the header is ignored.
	TrustedProxies iprange.Set
	// WriteTimeout is the listener's write timeout (0: none). Requests
	// that wait (/sync for news, key queries and claims for other
	// servers) get their longest wait on top of it.
	WriteTimeout time.Duration
	// LoginLimit and RegisterLimit bound the /login and /register
	// requests of each remote address; nil: no limit.
	LoginLimit, RegisterLimit *ratelimit.Limiter
	Logger                    logrus.FieldLogger
	// KeyBackup serves /room_keys, AccountData the account data
	// endpoints; nil: not served.
	KeyBackup   *keybackup.Service
	AccountData *accountdata.Service
	// InitialSync serves /initialSync and /rooms/{roomId}/initialSync;
	// nil: not served.
	InitialSync *initialsync.Service
	// UserDirectory serves /user_directory/search; nil: not served.
	UserDirectory *userdirectory.Service
	// Search serves POST /search; nil: not served.
	Search *search.Service
	// TURN answers /voip/turnServer; nil: no TURN server ({}).
	TURN *voip.TURN
	// PublicRooms serves the public room directory; nil: not served.
	PublicRooms *publicrooms.Service
	// PushRules serves /pushrules; nil: not served.
	PushRules *pushrules.Service
	// Pushers serves /pushers; nil: not served.
	Pushers *pusher.Service
	// Profiles serves /profile; nil: not served.
	Profiles *profile.Service
	// Rooms serves the room endpoints; nil: not served.
	Rooms *roomserver.Service
	// ToDevice serves /sendToDevice, Dehydrated the dehydrated device
	// (MSC3814); nil: not served.
	ToDevice   *todevice.Service
	Dehydrated *dehydrated.Service
	// Parker parks waiting /sync requests' connections; nil: they wait
	// in their handlers.
	Parker *httppark.Parker
	// Media serves the content repository; nil: not served.
	Media *media.Service
	// Spaces serves space hierarchies and room summaries; nil: not
	// served.
	Spaces *spaces.Service
	// Presence serves /presence; nil: not served.
	Presence *presence.Service
	// Typing serves /rooms/{roomId}/typing, Receipts the receipts and
	// read markers; nil: not served.
	Typing   *typing.Service
	Receipts *receipts.Service
}

// API serves the client-server API.
type API struct {
	accounts Accounts
	keys     Keys
	syncs    Sync // /sync and /keys/changes
	opts     Options
}

// specVersions are the client-server API versions this server speaks.
var specVersions = []string{
	"r0.0.1", "r0.1.0", "r0.2.0", "r0.3.0", "r0.4.0", "r0.5.0", "r0.6.0", "r0.6.1",
	"v1.1", "v1.2", "v1.3", "v1.4", "v1.5", "v1.6", "v1.7", "v1.8", "v1.9", "v1.10",
	"v1.11", "v1.12", "v1.13", "v1.14", "v1.15", "v1.16", "v1.17", "v1.18", "v1.19",
}

// NewHandler returns the client API's HTTP handler.
func NewHandler(accounts Accounts, keys Keys, sync Sync, opts Options) http.Handler {
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = 1 << 20
	}
	if opts.Logger == nil {
		opts.Logger = logrus.StandardLogger()
	}
	a := &API{accounts: accounts, keys: keys, syncs: sync, opts: opts}
	r, rooms := newRouter(), newRouter()

	r.Handle("/_matrix/client/versions", a.public(a.versions)).Methods(http.MethodGet)
	// Full paths rather than subrouters: a subrouter would answer a known
	// path with the wrong method 404 instead of 405. Each endpoint is one
	// route, its versions a pattern of its path (see clientVersions).
	s := prefixed{r, clientVersions}
	e2e := s.alsoUnstable()
	s.Handle("/register", a.public(a.register)).Methods(http.MethodPost)
	s.Handle("/register/available", a.public(a.available)).Methods(http.MethodGet)
	s.Handle("/login", a.public(a.loginFlows)).Methods(http.MethodGet)
	s.Handle("/login", a.public(a.login)).Methods(http.MethodPost)
	s.Handle("/logout", a.authed(a.logout)).Methods(http.MethodPost)
	s.Handle("/logout/all", a.authed(a.logoutAll)).Methods(http.MethodPost)
	s.Handle("/account/whoami", a.authed(a.whoami)).Methods(http.MethodGet)
	s.Handle("/account/password", a.authed(a.changePassword)).Methods(http.MethodPost)
	s.Handle("/account/deactivate", a.authed(a.deactivate)).Methods(http.MethodPost)
	s.Handle("/account/3pid", a.authed(a.threePIDs)).Methods(http.MethodGet)
	s.Handle("/capabilities", a.authed(a.capabilities)).Methods(http.MethodGet)
	e2e.Handle("/devices", a.authed(a.devices)).Methods(http.MethodGet)
	e2e.Handle("/devices/{deviceId}", a.authed(a.device)).Methods(http.MethodGet)
	e2e.Handle("/devices/{deviceId}", a.authed(a.renameDevice)).Methods(http.MethodPut)
	e2e.Handle("/devices/{deviceId}", a.authed(a.deleteDevice)).Methods(http.MethodDelete)
	e2e.Handle("/delete_devices", a.authed(a.deleteDevices)).Methods(http.MethodPost)
	e2e.Handle("/keys/upload", a.authed(a.uploadKeys)).Methods(http.MethodPost)
	// r0 clients may name their device in the path; the token decides.
	e2e.Handle("/keys/upload/{deviceId}", a.authed(a.uploadKeys)).Methods(http.MethodPost)
	e2e.Handle("/keys/query", a.waits(keys.RemoteMaxWait(), a.authed(a.queryKeys))).Methods(http.MethodPost)
	e2e.Handle("/keys/claim", a.waits(keys.RemoteMaxWait(), a.authed(a.claimKeys))).Methods(http.MethodPost)
	e2e.Handle("/keys/changes", a.authed(a.keyChanges)).Methods(http.MethodGet)
	e2e.Handle("/keys/device_signing/upload", a.authed(a.uploadSigningKeys)).Methods(http.MethodPost)
	e2e.Handle("/keys/signatures/upload", a.authed(a.uploadSignatures)).Methods(http.MethodPost)
	s.Handle("/sync", a.waits(sync.SyncMaxWait(), http.HandlerFunc(a.sync))).Methods(http.MethodGet)
	a.keyBackupRoutes(e2e)
	a.accountDataRoutes(s)
	a.pushRuleRoutes(s)
	a.pusherRoutes(s)
	a.publicRoomRoutes(s)
	a.userDirectoryRoutes(s)
	a.searchRoutes(s)
	a.voipRoutes(s)
	a.profileRoutes(s)
	a.presenceRoutes(s)
	a.roomRoutes(s, prefixed{rooms, clientVersions})
	a.initialSyncRoutes(s, prefixed{rooms, clientVersions})
	a.relationRoutes(r)
	a.toDeviceRoutes(e2e)
	a.ephemeralRoutes(prefixed{rooms, clientVersions})
	a.dehydratedRoutes(prefixed{r, dehydratedPrefix})
	a.mediaRoutes(prefixed{r, ""})
	a.spaceRoutes(prefixed{r, ""})
	r.Handle("/_keyserver/admin/v1/rooms/{roomId}/members/{userId}", a.admin(a.setMembership)).Methods(http.MethodPut)
	// Liveness: the process answers. Readiness: it can reach its database.
	r.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		httpx.JSON(w, http.StatusOK, map[string]string{"status": "ok"})
	}).Methods(http.MethodGet)
	r.HandleFunc("/health/ready", func(w http.ResponseWriter, r *http.Request) {
		if err := accounts.Ready(r.Context()); err != nil {
			httpx.Logger(r).WithError(err).Warn("not ready: the database does not answer")
			httpx.JSON(w, http.StatusServiceUnavailable, map[string]string{"status": "database unavailable"})
			return
		}
		httpx.JSON(w, http.StatusOK, map[string]string{"status": "ready"})
	}).Methods(http.MethodGet)
	return clientAddress(opts.TrustedProxies, httpx.Middleware(opts.Logger, "client", httpx.CORS(splitRouter{rooms: rooms, rest: r})))
}

func newRouter() *mux.Router {
	r := mux.NewRouter()
	// Path parameters are user and room IDs that clients percent-encode and
	// that may contain '/'; match on the encoded path and decode each value.
	r.UseEncodedPath()
	r.NotFoundHandler = httpx.NotFoundHandler()
	r.MethodNotAllowedHandler = httpx.MethodNotAllowedHandler()
	r.Use(httpmetrics.Middleware("client"))
	return r
}

// splitRouter serves the paths under /rooms/ (roomRoutes) from a router
// of their own, and the rest from another. A router tries its routes one
// after the other, a regular expression each: a message sent to a room
// went through some forty before its own (~25 µs, 4 % of what the daemon
// spends on it). No route of one router would match a path of the
// other, so each answers 404 and 405 as one router would.
type splitRouter struct{ rooms, rest *mux.Router }

func (s splitRouter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.EscapedPath()
	for _, prefix := range []string{"/_matrix/client/v3/rooms/", "/_matrix/client/r0/rooms/"} {
		if strings.HasPrefix(p, prefix) {
			s.rooms.ServeHTTP(w, r)
			return
		}
	}
	s.rest.ServeHTTP(w, r)
}

// clientVersions is the start of every client endpoint's path: each is
// served under r0 and v3, from one route whose path has the version as a
// pattern. clientVersionsUnstable serves it under unstable too: the
// endpoints that clients first called there (end-to-end keys, devices,
// to-device messages, key backup), as older clients and test tools still
// do.
const (
	clientVersions         = "/_matrix/client/{" + httpmetrics.APIVersionVar + ":(?:r0|v3)}"
	clientVersionsUnstable = "/_matrix/client/{" + httpmetrics.APIVersionVar + ":(?:r0|v3|unstable)}"
)

// prefixed registers routes under a path prefix.
type prefixed struct {
	r      *mux.Router
	prefix string
}

// alsoUnstable returns p serving its client endpoints under unstable too.
func (p prefixed) alsoUnstable() prefixed {
	if p.prefix == clientVersions {
		p.prefix = clientVersionsUnstable
	}
	return p
}

func (p prefixed) Handle(path string, h http.Handler) *mux.Route {
	return p.r.Handle(p.prefix+path, h)
}

// handler is an endpoint: it returns the 200 body or an error.
type handler func(r *http.Request) (any, error)

type authedHandler func(r *http.Request, c matrixid.Caller) (any, error)

func (a *API) public(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := h(r)
		if err != nil {
			httpx.Error(w, r, err)
			return
		}
		httpx.JSON(w, http.StatusOK, body)
	})
}

func (a *API) authed(h authedHandler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := a.authenticate(w, r)
		if !ok {
			return
		}
		body, err := h(r, c)
		respond(w, r, body, err)
	})
}

// authenticate finds the request's caller and applies its rate limit; if
// it returns false, it has answered.
func (a *API) authenticate(w http.ResponseWriter, r *http.Request) (matrixid.Caller, bool) {
	c, err := a.accounts.Authenticate(r.Context(), accessToken(r))
	if err != nil {
		httpx.Error(w, r, err)
		return c, false
	}
	c.IP = remoteIP(r)
	if ok, wait := a.opts.RateLimit.Allow(c.UserID + "|" + c.DeviceID); !ok {
		httpx.LimitExceeded(w, r, wait)
		return c, false
	}
	return c, true
}

// respond writes an endpoint's 200 body or its error.
func respond(w http.ResponseWriter, r *http.Request, body any, err error) {
	if err != nil {
		httpx.Error(w, r, err)
		return
	}
	httpx.JSON(w, http.StatusOK, body)
}

// waits gives an endpoint that may wait up to wait that long beyond the
// write timeout.
func (a *API) waits(wait time.Duration, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpx.ExtendWriteDeadline(w, wait, a.opts.WriteTimeout)
		h.ServeHTTP(w, r)
	})
}

// admin guards the admin API with the configured token.
func (a *API) admin(h handler) http.Handler {
	return a.public(func(r *http.Request) (any, error) {
		if a.opts.AdminToken == "" {
			return nil, mxerr.Forbidden("the admin API is disabled: no admin_token is configured")
		}
		tok := bearer(r)
		if tok == "" {
			return nil, mxerr.MissingToken("missing admin token")
		}
		if subtle.ConstantTimeCompare([]byte(tok), []byte(a.opts.AdminToken)) != 1 {
			return nil, mxerr.UnknownToken("wrong admin token")
		}
		return h(r)
	})
}

func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "Bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// accessToken takes the token from the Authorization header, or else from
// the deprecated access_token query parameter.
func accessToken(r *http.Request) string {
	if t := bearer(r); t != "" {
		return t
	}
	return r.URL.Query().Get("access_token")
}

// pathVar returns a decoded path parameter.
func pathVar(r *http.Request, name string) (string, error) {
	v, err := url.PathUnescape(mux.Vars(r)[name])
	if err != nil {
		return "", mxerr.InvalidParam("bad percent-encoding in %s", name)
	}
	return v, httpx.CleanParam(name, v)
}

func (a *API) decode(r *http.Request, v any) error {
	return httpx.ReadJSON(r, a.opts.MaxRequestBytes, v, false)
}

// decodeOptional accepts an empty body as {}.
func (a *API) decodeOptional(r *http.Request, v any) error {
	return httpx.ReadJSON(r, a.opts.MaxRequestBytes, v, true)
}

var empty = struct{}{}

// versions answers /versions. unstable_features names the features
// served that clients look for there: cross-signing (MSC1756: Element
// sets it up at registration only when this is listed, and calls its
// endpoints under unstable), dehydrated devices (MSC3814) and
// authenticated media (MSC3916). The older dehydration of MSC2697 is not
// served, so not named.
func (a *API) versions(r *http.Request) (any, error) {
	features := map[string]bool{"org.matrix.e2e_cross_signing": true}
	if a.opts.Dehydrated != nil {
		features["org.matrix.msc3814"] = true
	}
	if a.opts.Media != nil { // authenticated media, for clients that look for it here
		features["org.matrix.msc3916.stable"] = true
	}
	return map[string]any{"versions": specVersions, "unstable_features": features}, nil
}

// limitAddress takes a token of l for the request's remote address.
func limitAddress(l *ratelimit.Limiter, r *http.Request) error {
	if ok, wait := l.Allow(remoteIP(r)); !ok {
		return mxerr.LimitExceeded(wait)
	}
	return nil
}

// register makes an account. The address's registration limit is checked
// on every request and counted for the accounts made, as Synapse does:
// the user-interactive auth round trip before a registration is no
// registration of its own.
func (a *API) register(r *http.Request) (any, error) {
	ip := remoteIP(r)
	if ok, wait := a.opts.RegisterLimit.Peek(ip); !ok {
		return nil, mxerr.LimitExceeded(wait)
	}
	var req userapi.RegisterRequest
	if err := a.decodeOptional(r, &req); err != nil {
		return nil, err
	}
	req.Kind = r.URL.Query().Get("kind")
	req.IP = ip
	res, err := a.accounts.Register(r.Context(), req)
	if err == nil {
		a.opts.RegisterLimit.Allow(ip)
	}
	return res, err
}

func (a *API) available(r *http.Request) (any, error) {
	u := r.URL.Query().Get("username")
	if u == "" {
		return nil, mxerr.MissingParam("username is required")
	}
	if err := httpx.CleanParam("username", u); err != nil {
		return nil, err
	}
	if err := a.accounts.Available(r.Context(), u); err != nil {
		return nil, err
	}
	return map[string]bool{"available": true}, nil
}

func (a *API) loginFlows(r *http.Request) (any, error) {
	return map[string]any{"flows": []any{map[string]string{"type": "m.login.password"}}}, nil
}

func (a *API) login(r *http.Request) (any, error) {
	if err := limitAddress(a.opts.LoginLimit, r); err != nil {
		return nil, err
	}
	var req userapi.LoginRequest
	if err := a.decode(r, &req); err != nil {
		return nil, err
	}
	req.IP = remoteIP(r)
	return a.accounts.Login(r.Context(), req)
}

func (a *API) logout(r *http.Request, c matrixid.Caller) (any, error) {
	return empty, a.accounts.Logout(r.Context(), c)
}

func (a *API) logoutAll(r *http.Request, c matrixid.Caller) (any, error) {
	return empty, a.accounts.LogoutAll(r.Context(), c)
}

func (a *API) whoami(r *http.Request, c matrixid.Caller) (any, error) {
	return map[string]any{"user_id": c.UserID, "device_id": c.DeviceID, "is_guest": false}, nil
}

func (a *API) changePassword(r *http.Request, c matrixid.Caller) (any, error) {
	var req userapi.ChangePasswordRequest
	if err := a.decodeOptional(r, &req); err != nil {
		return nil, err
	}
	return empty, a.accounts.ChangePassword(r.Context(), c, req)
}

func (a *API) deactivate(r *http.Request, c matrixid.Caller) (any, error) {
	var req userapi.DeactivateRequest
	if err := a.decodeOptional(r, &req); err != nil {
		return nil, err
	}
	if err := a.accounts.Deactivate(r.Context(), c, req); err != nil {
		return nil, err
	}
	// No identity server is ever bound.
	return map[string]string{"id_server_unbind_result": "no-support"}, nil
}

// threePIDs answers GET /account/3pid: no third-party IDs are kept.
func (a *API) threePIDs(r *http.Request, c matrixid.Caller) (any, error) {
	return map[string]any{"threepids": []any{}}, nil
}

func (a *API) capabilities(r *http.Request, c matrixid.Caller) (any, error) {
	caps := map[string]any{
		"m.change_password": map[string]bool{"enabled": true},
	}
	if a.opts.Rooms != nil {
		caps["m.room_versions"] = map[string]any{
			"default": string(roomserver.DefaultRoomVersion), "available": roomserver.RoomVersions(),
		}
	}
	return map[string]any{"capabilities": caps}, nil
}

func (a *API) devices(r *http.Request, c matrixid.Caller) (any, error) {
	ds, err := a.accounts.Devices(r.Context(), c)
	if err != nil {
		return nil, err
	}
	return map[string]any{"devices": ds}, nil
}

func (a *API) device(r *http.Request, c matrixid.Caller) (any, error) {
	id, err := pathVar(r, "deviceId")
	if err != nil {
		return nil, err
	}
	return a.accounts.Device(r.Context(), c, id)
}

func (a *API) renameDevice(r *http.Request, c matrixid.Caller) (any, error) {
	id, err := pathVar(r, "deviceId")
	if err != nil {
		return nil, err
	}
	var req struct {
		DisplayName *string `json:"display_name"`
	}
	if err := a.decodeOptional(r, &req); err != nil {
		return nil, err
	}
	return empty, a.accounts.RenameDevice(r.Context(), c, id, req.DisplayName)
}

func (a *API) deleteDevice(r *http.Request, c matrixid.Caller) (any, error) {
	id, err := pathVar(r, "deviceId")
	if err != nil {
		return nil, err
	}
	var req struct {
		Auth *matrixid.AuthData `json:"auth"`
	}
	if err := a.decodeOptional(r, &req); err != nil {
		return nil, err
	}
	return empty, a.accounts.DeleteDevice(r.Context(), c, id, req.Auth)
}

func (a *API) deleteDevices(r *http.Request, c matrixid.Caller) (any, error) {
	var req struct {
		Devices []string           `json:"devices"`
		Auth    *matrixid.AuthData `json:"auth"`
	}
	if err := a.decode(r, &req); err != nil {
		return nil, err
	}
	if req.Devices == nil {
		return nil, mxerr.MissingParam("devices is required")
	}
	return empty, a.accounts.DeleteDevices(r.Context(), c, req.Devices, req.Auth)
}

func (a *API) uploadKeys(r *http.Request, c matrixid.Caller) (any, error) {
	var req keyserver.UploadRequest
	if err := a.decodeOptional(r, &req); err != nil {
		return nil, err
	}
	return a.keys.UploadKeys(r.Context(), c, req)
}

func (a *API) queryKeys(r *http.Request, c matrixid.Caller) (any, error) {
	var req keyserver.QueryRequest
	if err := a.decode(r, &req); err != nil {
		return nil, err
	}
	req.Timeout = req.Timeout.Or(keyserver.ParseTimeout(r.URL.Query().Get("timeout")))
	return a.keys.QueryKeys(r.Context(), c, req)
}

func (a *API) uploadSigningKeys(r *http.Request, c matrixid.Caller) (any, error) {
	var req keyserver.SigningKeysUpload
	if err := a.decodeOptional(r, &req); err != nil {
		return nil, err
	}
	return empty, a.keys.UploadSigningKeys(r.Context(), c, req)
}

func (a *API) uploadSignatures(r *http.Request, c matrixid.Caller) (any, error) {
	var req map[string]map[string]json.RawMessage
	if err := a.decode(r, &req); err != nil {
		return nil, err
	}
	return a.keys.UploadSignatures(r.Context(), c, req)
}

func (a *API) claimKeys(r *http.Request, c matrixid.Caller) (any, error) {
	var req keyserver.ClaimRequest
	if err := a.decode(r, &req); err != nil {
		return nil, err
	}
	req.Timeout = req.Timeout.Or(keyserver.ParseTimeout(r.URL.Query().Get("timeout")))
	return a.keys.ClaimKeys(r.Context(), c, req)
}

func (a *API) keyChanges(r *http.Request, c matrixid.Caller) (any, error) {
	q := r.URL.Query()
	return a.syncs.KeyChanges(r.Context(), c, q.Get("from"), q.Get("to"))
}

// sync answers /sync. A request that may wait for news parks when it can
// (see package httppark): its connection waits without a goroutine, and
// the parker's workers read the stream for it, at once and then when it
// is woken, answering through the same code as any other request. Even
// the first read is theirs: a burst of long-polling clients then costs a
// parked record each while it queues for the database, not a handler
// with its stack and buffers.
func (a *API) sync(w http.ResponseWriter, r *http.Request) {
	c, ok := a.authenticate(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	var timeout time.Duration
	if t := q.Get("timeout"); t != "" {
		ms, err := strconv.ParseInt(t, 10, 64)
		if err != nil || ms < 0 {
			httpx.Error(w, r, mxerr.InvalidParam("timeout must be a non-negative number of milliseconds"))
			return
		}
		timeout = time.Duration(min(ms, int64(24*time.Hour/time.Millisecond))) * time.Millisecond
	}
	since := q.Get("since")
	o := syncapi.SyncOptions{Filter: q.Get("filter"), FullState: q.Get("full_state") == "true", SetPresence: q.Get("set_presence")}
	if wait := min(timeout, a.syncs.SyncMaxWait()); wait > 0 && since != "" && a.opts.Parker.Can(w, r) {
		pw := a.opts.Parker.NewWaiter()
		job := &syncJob{sync: a.syncs, c: c, since: since, timeout: timeout, o: o, log: httpx.Logger(r),
			wake: func(e syncnotify.Event) { pw.Wake(e != syncnotify.StreamEvent) }}
		pw.Wake(false) // the first read, as soon as a worker is free
		if pw.Park(w, r, wait, job, func() func(int) { return httpx.Detach(w) }) == nil {
			return
		}
		// The connection could not be taken over (the server shuts
		// down): answer the ordinary way.
	}
	res, err := a.syncs.Sync(r.Context(), c, since, timeout, o)
	respond(w, r, res, err)
}

// syncJob answers a parked /sync request.
type syncJob struct {
	sync    Sync
	c       matrixid.Caller
	since   string
	timeout time.Duration
	o       syncapi.SyncOptions
	log     logrus.FieldLogger
	wake    func(syncnotify.Event)
	w       *syncapi.SyncWaiter // after the first read found nothing
}

func (j *syncJob) Answer(ctx context.Context, w http.ResponseWriter, final bool) bool {
	var res syncapi.SyncResponse
	var err error
	switch {
	case j.w == nil:
		if res, j.w, err = j.sync.SyncOrWait(ctx, j.c, j.since, j.timeout, j.o, j.wake); err == nil && j.w != nil {
			if !final {
				return false
			}
			res, err = j.w.Answer(ctx)
		}
	case final:
		res, err = j.w.Answer(ctx)
	default:
		var news bool
		if res, news, err = j.w.Poll(ctx); err == nil && !news {
			return false
		}
	}
	// The request itself is gone with its connection's first life: the
	// error path needs only its context (logger, cancellation).
	respond(w, (&http.Request{Method: http.MethodGet}).WithContext(reqlog.With(ctx, j.log)), res, err)
	return true
}

func (j *syncJob) Close() {
	if j.w != nil {
		j.w.Close()
	}
}

func (a *API) setMembership(r *http.Request) (any, error) {
	roomID, err := pathVar(r, "roomId")
	if err != nil {
		return nil, err
	}
	userID, err := pathVar(r, "userId")
	if err != nil {
		return nil, err
	}
	var req struct {
		Membership string `json:"membership"`
	}
	if err := a.decode(r, &req); err != nil {
		return nil, err
	}
	return empty, a.keys.SetMembership(r.Context(), roomID, userID, req.Membership)
}
