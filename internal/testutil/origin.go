package testutil

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/fclient"
	"github.com/matrix-org/gomatrixserverlib/spec"
)

// Origin is a stand-in remote server made from gomatrixserverlib: it
// publishes a signing key over TLS, signs requests with it, and serves
// whatever federation endpoints a test gives it.
type Origin struct {
	Name  string
	KeyID gomatrixserverlib.KeyID
	Key   ed25519.PrivateKey
	Mux   *http.ServeMux
	srv   *httptest.Server
}

// SendPath is the path of the origin's /send transaction txnID, made
// unique to this origin: a daemon answers a transaction ID it has seen
// from a server name with its first answer, and an origin started later
// on the same port has the same name.
func (o *Origin) SendPath(txnID string) string {
	return "/_matrix/federation/v1/send/" + strings.TrimPrefix(string(o.KeyID), "ed25519:") + "-" + txnID
}

// NewOrigin starts an origin on a loopback TLS listener; its name is its
// address.
func NewOrigin(t testing.TB) *Origin {
	t.Helper()
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	// A key ID of its own: an origin started earlier on the same port
	// (the same server name) had another key, which a daemon may still
	// hold for that name and key ID, and would fail this one's signatures.
	keyID := gomatrixserverlib.KeyID(fmt.Sprintf("ed25519:origin%x", pub[:6]))
	o := &Origin{KeyID: keyID, Key: priv, Mux: http.NewServeMux()}
	o.srv = httptest.NewUnstartedServer(o.Mux)
	o.srv.StartTLS()
	t.Cleanup(o.srv.Close)
	o.Name = strings.TrimPrefix(o.srv.URL, "https://")
	o.Mux.HandleFunc("GET /_matrix/key/v2/server", func(w http.ResponseWriter, r *http.Request) {
		body, _ := json.Marshal(map[string]any{
			"server_name":     o.Name,
			"verify_keys":     map[string]any{string(o.KeyID): map[string]string{"key": B64(priv.Public().(ed25519.PublicKey))}},
			"old_verify_keys": map[string]any{},
			"valid_until_ts":  time.Now().Add(time.Hour).UnixMilli(),
		})
		signed, err := gomatrixserverlib.SignJSON(o.Name, o.KeyID, priv, body)
		if err != nil {
			t.Error(err)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(signed)
	})
	return o
}

// SignedRequest builds a request from the origin to destination, signed
// with key under keyID (the origin's own when key is nil).
func (o *Origin) SignedRequest(t testing.TB, method, destination, path string, body any, keyID gomatrixserverlib.KeyID, key ed25519.PrivateKey) *http.Request {
	t.Helper()
	if key == nil {
		keyID, key = o.KeyID, o.Key
	}
	fr := fclient.NewFederationRequest(method, spec.ServerName(o.Name), spec.ServerName(destination), path)
	if body != nil {
		if err := fr.SetContent(body); err != nil {
			t.Fatal(err)
		}
	}
	if err := fr.Sign(spec.ServerName(o.Name), keyID, key); err != nil {
		t.Fatal(err)
	}
	req, err := fr.HTTPRequest()
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// SendTo sends a request to a node's federation listener over TLS,
// whatever destination the request names.
func SendTo(t testing.TB, n *Node, req *http.Request) Response {
	t.Helper()
	req.URL.Scheme, req.URL.Host = "https", n.Config.Federation.Listen
	req.Host = n.Config.ServerName
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 30 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	out := Response{Status: resp.StatusCode, Raw: raw}
	if len(raw) > 0 {
		// The v1 membership handshakes answer an array ([200, answer]):
		// Body holds objects only, Raw every answer.
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatalf("answer is not JSON (%d): %s", resp.StatusCode, raw)
		}
		out.Body, _ = v.(map[string]any)
	}
	return out
}

// WithBody replaces a request's body, keeping its signature: a tampered
// request.
func WithBody(req *http.Request, body string) *http.Request {
	req.Body = io.NopCloser(bytes.NewReader([]byte(body)))
	req.ContentLength = int64(len(body))
	return req
}
