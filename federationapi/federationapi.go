// Package federationapi is the HTTP face of the server-server API: it
// publishes the server's signing keys and, in time, authenticates and
// serves other servers' requests by calling package keyserver.
package federationapi

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"time"

	"github.com/gorilla/mux"
	"github.com/matrix-org/gomatrixserverlib"
	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/httpx"
	"github.com/keyserver/keyserver/internal/identity"
)

// Version is reported by /_matrix/federation/v1/version.
const Version = "0.1.0"

// Options configure the federation API.
type Options struct {
	ServerName  string
	SigningKey  identity.SigningKey
	KeyValidity time.Duration
	Logger      logrus.FieldLogger
	Now         func() time.Time
}

// NewHandler returns the federation API's HTTP handler.
func NewHandler(opts Options) http.Handler {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = logrus.StandardLogger()
	}
	r := mux.NewRouter()
	r.UseEncodedPath()
	r.NotFoundHandler = httpx.NotFoundHandler()
	r.MethodNotAllowedHandler = httpx.MethodNotAllowedHandler()
	r.HandleFunc("/_matrix/key/v2/server", func(w http.ResponseWriter, req *http.Request) {
		body, err := serverKeys(opts)
		if err != nil {
			httpx.Error(w, req, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	}).Methods(http.MethodGet)
	r.HandleFunc("/_matrix/federation/v1/version", func(w http.ResponseWriter, req *http.Request) {
		httpx.JSON(w, http.StatusOK, map[string]any{"server": map[string]string{"name": "keyserver", "version": Version}})
	}).Methods(http.MethodGet)
	return httpx.Middleware(opts.Logger, "federation", r)
}

// serverKeys is our signed key response: the verify key, valid for the
// configured time, signed with itself.
func serverKeys(opts Options) ([]byte, error) {
	body := map[string]any{
		"server_name": opts.ServerName,
		"verify_keys": map[string]any{
			string(opts.SigningKey.KeyID): map[string]string{"key": base64.RawStdEncoding.EncodeToString(opts.SigningKey.PublicKey())},
		},
		"old_verify_keys": map[string]any{},
		"valid_until_ts":  opts.Now().Add(opts.KeyValidity).UnixMilli(),
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	return gomatrixserverlib.SignJSON(opts.ServerName, opts.SigningKey.KeyID, opts.SigningKey.PrivateKey, raw)
}
