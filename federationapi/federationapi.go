// Package federationapi is the HTTP face of the server-server API: it
// publishes the server's signing keys, authenticates other servers'
// requests from their X-Matrix signatures, and answers them by calling
// the domains (keys, rooms, profiles, ...) and the router of transactions
// (package fedrouter).
package federationapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/gorilla/mux"
	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/fclient"
	"github.com/matrix-org/gomatrixserverlib/spec"
	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/internal/httpx"
	"github.com/keyserver/keyserver/internal/identity"
	"github.com/keyserver/keyserver/internal/metrics/httpmetrics"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/ratelimit"
)

// Version is reported by /_matrix/federation/v1/version.
const Version = "0.1.0"

// Options configure the federation API.
type Options struct {
	ServerName  string
	SigningKey  identity.SigningKey
	KeyValidity time.Duration
	// OldVerifyKeys are retired keys still published: key ID -> key.
	OldVerifyKeys map[string]OldVerifyKey
	// KeyRing checks request signatures with other servers' keys.
	KeyRing gomatrixserverlib.JSONVerifier
	// OnAuthenticated is told of every server that made an authenticated
	// request: it is up, which ends any backoff towards it.
	OnAuthenticated func(origin string)
	// Rooms serves the room reads (events, state, backfill, aliases);
	// nil: not served.
	Rooms           Rooms
	MaxRequestBytes int64
	// PublicRooms answers /publicRooms; nil: not served.
	PublicRooms PublicRooms
	// Profiles answers /query/profile; nil: not served.
	Profiles Profiles
	// Membership answers the membership handshakes; nil: none.
	Membership RoomMembership
	// RateLimit bounds each remote server's requests; nil: no limit.
	RateLimit *ratelimit.Limiter
	Logger    logrus.FieldLogger
	Now       func() time.Time

	// Media serves local media; nil: not served.
	Media Media
	// Spaces answers /hierarchy; nil: not served.
	Spaces Spaces
}

// OldVerifyKey is a retired signing key.
type OldVerifyKey struct {
	Key       string `json:"key"`
	ExpiredTS int64  `json:"expired_ts"`
}

type api struct {
	ks   Keys
	txns Transactions
	opts Options
}

// NewHandler returns the federation API's HTTP handler.
func NewHandler(ks Keys, txns Transactions, opts Options) http.Handler {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = logrus.StandardLogger()
	}
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = 1 << 20
	}
	if opts.OnAuthenticated == nil {
		opts.OnAuthenticated = func(string) {}
	}
	a := &api{ks: ks, txns: txns, opts: opts}
	r := mux.NewRouter()
	r.UseEncodedPath()
	r.NotFoundHandler = httpx.NotFoundHandler()
	r.MethodNotAllowedHandler = httpx.MethodNotAllowedHandler()
	r.Use(httpmetrics.Middleware("federation"))
	r.HandleFunc("/_matrix/key/v2/server", a.serverKeys).Methods(http.MethodGet)
	// The deprecated form naming a key ID, which peers and test tools still
	// fetch: the key ID is ignored and the same keys are answered, as
	// Synapse does.
	r.HandleFunc("/_matrix/key/v2/server/", a.serverKeys).Methods(http.MethodGet)
	r.HandleFunc("/_matrix/key/v2/server/{keyId}", a.serverKeys).Methods(http.MethodGet)
	r.HandleFunc("/_matrix/federation/v1/version", func(w http.ResponseWriter, req *http.Request) {
		httpx.JSON(w, http.StatusOK, map[string]any{"server": map[string]string{"name": "keyserver", "version": Version}})
	}).Methods(http.MethodGet)
	r.Handle("/_matrix/federation/v1/user/keys/query", a.authed(a.queryKeys)).Methods(http.MethodPost)
	r.Handle("/_matrix/federation/v1/user/keys/claim", a.authed(a.claimKeys)).Methods(http.MethodPost)
	r.Handle("/_matrix/federation/v1/user/devices/{userId}", a.authed(a.userDevices)).Methods(http.MethodGet)
	r.Handle("/_matrix/federation/v1/send/{txnId}", a.authed(a.send)).Methods(http.MethodPut)
	a.membershipRoutes(r)
	a.roomRoutes(r)
	a.profileRoutes(r)
	a.publicRoomRoutes(r)
	a.mediaRoutes(r)
	a.spaceRoutes(r)
	return httpx.Middleware(opts.Logger, "federation", r)
}

// request is an authenticated federation request.
type request struct {
	*http.Request
	origin  string
	content []byte
}

type handler func(r request) (any, error)

// authed checks the X-Matrix signature before anything else happens (see
// authenticate), then answers with what h returns, as JSON.
func (a *api) authed(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, ok := a.authenticate(w, r)
		if !ok {
			return
		}
		out, err := h(req)
		if err != nil {
			httpx.Error(w, r, err)
			return
		}
		httpx.JSON(w, http.StatusOK, out)
	})
}

// authenticate checks a request's X-Matrix signature: a request that is
// unsigned, malformed, signed by an unknown or wrong key, tampered with,
// or addressed to another server is answered 401 M_UNAUTHORIZED and does
// nothing, as is one over its origin's rate limit (429). On success the
// request carries its origin, marked live, and false means an answer was
// written.
func (a *api) authenticate(w http.ResponseWriter, r *http.Request) (request, bool) {
	body, err := httpx.ReadBody(r, a.opts.MaxRequestBytes)
	if err != nil {
		httpx.Error(w, r, err)
		return request{}, false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	fr, resp := fclient.VerifyHTTPRequest(r, a.opts.Now(), spec.ServerName(a.opts.ServerName), nil, a.opts.KeyRing)
	if fr == nil {
		if resp.Code == http.StatusInternalServerError {
			httpx.Error(w, r, errors.New("checking a request signature failed"))
			return request{}, false
		}
		msg := "request is not correctly signed"
		if m, ok := resp.JSON.(struct {
			Message string `json:"message"`
		}); ok {
			msg = m.Message
		}
		httpx.Logger(r).WithField("reason", msg).Debug("refused an unauthenticated federation request")
		httpx.Error(w, r, mxerr.Unauthorized("%s", msg))
		return request{}, false
	}
	origin := string(fr.Origin())
	a.opts.OnAuthenticated(origin)
	if ok, wait := a.opts.RateLimit.Allow(origin); !ok {
		httpx.LimitExceeded(w, r, wait)
		return request{}, false
	}
	// origin is up: what the request makes us ask of it is asked even
	// if one of its endpoints failed a moment ago.
	r = r.WithContext(fedclient.WithLive(r.Context(), origin))
	return request{Request: r, origin: origin, content: fr.Content()}, true
}

func (a *api) queryKeys(r request) (any, error) {
	var req struct {
		DeviceKeys map[string][]string `json:"device_keys"`
	}
	if err := httpx.Decode(r.content, &req, false); err != nil {
		return nil, err
	}
	return a.ks.FederationQueryKeys(r.Context(), req.DeviceKeys)
}

func (a *api) claimKeys(r request) (any, error) {
	var req struct {
		OneTimeKeys map[string]map[string]string `json:"one_time_keys"`
	}
	if err := httpx.Decode(r.content, &req, false); err != nil {
		return nil, err
	}
	return a.ks.FederationClaimKeys(r.Context(), req.OneTimeKeys)
}

func (a *api) send(r request) (any, error) {
	txnID, err := url.PathUnescape(mux.Vars(r.Request)["txnId"])
	if err != nil || txnID == "" || httpx.CleanParam("txnId", txnID) != nil {
		return nil, mxerr.InvalidParam("bad transaction ID")
	}
	var shape struct{}
	if err := httpx.Decode(r.content, &shape, false); err != nil {
		return nil, err
	}
	return a.txns.HandleTransaction(r.Context(), r.origin, txnID, r.content)
}

func (a *api) userDevices(r request) (any, error) {
	userID, err := url.PathUnescape(mux.Vars(r.Request)["userId"])
	if err != nil || httpx.CleanParam("userId", userID) != nil {
		return nil, mxerr.InvalidParam("bad percent-encoding in the user ID")
	}
	return a.ks.FederationUserDevices(r.Context(), userID)
}

// serverKeys publishes our verify key, valid for the configured time and
// signed with itself.
func (a *api) serverKeys(w http.ResponseWriter, r *http.Request) {
	key := a.opts.SigningKey
	old := a.opts.OldVerifyKeys
	if old == nil {
		old = map[string]OldVerifyKey{}
	}
	raw, err := json.Marshal(map[string]any{
		"server_name": a.opts.ServerName,
		"verify_keys": map[string]any{
			string(key.KeyID): map[string]string{"key": base64.RawStdEncoding.EncodeToString(key.PublicKey())},
		},
		"old_verify_keys": old,
		"valid_until_ts":  a.opts.Now().Add(a.opts.KeyValidity).UnixMilli(),
	})
	if err == nil {
		raw, err = gomatrixserverlib.SignJSON(a.opts.ServerName, key.KeyID, key.PrivateKey, raw)
	}
	if err != nil {
		httpx.Error(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(raw)
}
