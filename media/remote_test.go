package media_test

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"io"
	"mime"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

// encryptedFile is an attachment encrypted as clients do it: AES-256-CTR
// with the spec's EncryptedFile description.
type encryptedFile struct {
	URL string `json:"url"`
	Key struct {
		Kty    string   `json:"kty"`
		KeyOps []string `json:"key_ops"`
		Alg    string   `json:"alg"`
		K      string   `json:"k"`
		Ext    bool     `json:"ext"`
	} `json:"key"`
	IV     string            `json:"iv"`
	Hashes map[string]string `json:"hashes"`
	V      string            `json:"v"`
}

func encrypt(t *testing.T, plain []byte) ([]byte, encryptedFile) {
	key := make([]byte, 32)
	iv := make([]byte, 16)
	_, _ = rand.Read(key)
	_, _ = rand.Read(iv[:8]) // the counter's half starts at zero
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	ct := make([]byte, len(plain))
	cipher.NewCTR(block, iv).XORKeyStream(ct, plain)
	var f encryptedFile
	f.Key.Kty, f.Key.KeyOps, f.Key.Alg, f.Key.Ext = "oct", []string{"encrypt", "decrypt"}, "A256CTR", true
	f.Key.K = base64.RawURLEncoding.EncodeToString(key)
	f.IV = base64.RawStdEncoding.EncodeToString(iv)
	sum := sha256.Sum256(ct)
	f.Hashes = map[string]string{"sha256": base64.RawStdEncoding.EncodeToString(sum[:])}
	f.V = "v2"
	return ct, f
}

func decrypt(t *testing.T, f encryptedFile, ct []byte) []byte {
	t.Helper()
	sum := sha256.Sum256(ct)
	if base64.RawStdEncoding.EncodeToString(sum[:]) != f.Hashes["sha256"] {
		t.Fatal("the downloaded ciphertext does not have the hash of the EncryptedFile")
	}
	key, err := base64.RawURLEncoding.DecodeString(f.Key.K)
	if err != nil {
		t.Fatal(err)
	}
	iv, err := base64.RawStdEncoding.DecodeString(f.IV)
	if err != nil {
		t.Fatal(err)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	plain := make([]byte, len(ct))
	cipher.NewCTR(block, iv).XORKeyStream(plain, ct)
	return plain
}

const fedDownload = "/_matrix/federation/v1/media/download/"

// An encrypted attachment uploaded on one server is downloaded by a user
// of another through authenticated media over federation, decrypted, and
// matches; the remote file is fetched once and then served from the
// cache; thumbnails of remote images are made locally.
func TestRemoteMedia(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		a, b := startNode(t, db, nil), startNode(t, testutil.SQLite(t), nil)
		alice, bob := a.Register(t, "alice", ""), b.Register(t, "bob", "")
		plain := make([]byte, 100<<10)
		_, _ = rand.Read(plain)
		ct, file := encrypt(t, plain)
		server, id := upload(t, a, alice, "application/octet-stream", "", ct)
		file.URL = "mxc://" + server + "/" + id
		// What the sender puts in its m.room.message event, as the
		// receiver reads it.
		js, _ := json.Marshal(file)
		var got encryptedFile
		if err := json.Unmarshal(js, &got); err != nil {
			t.Fatal(err)
		}
		rs, rid := splitMXC(t, got.URL)
		for i := 0; i < 2; i++ {
			d := download(t, b, bob.Token, rs, rid)
			if d.Status != http.StatusOK {
				t.Fatalf("download %d from the other server: %d %s", i, d.Status, d.Body)
			}
			if !bytes.Equal(decrypt(t, got, d.Body), plain) {
				t.Fatalf("download %d: decrypted bytes differ", i)
			}
			if d.Header.Get("Content-Type") != "application/octet-stream" || d.Header.Get("Content-Disposition") != "attachment" {
				t.Errorf("headers: %q %q", d.Header.Get("Content-Type"), d.Header.Get("Content-Disposition"))
			}
		}
		if n := a.Requests.Count("GET", fedDownload); n != 1 {
			t.Errorf("%d federation downloads for two client downloads, want 1", n)
		}

		// Type and name cross with the content.
		server, id = upload(t, a, alice, "application/pdf", "report 1.pdf", []byte("%PDF-1.4"))
		d := download(t, b, bob.Token, server, id)
		if d.Status != http.StatusOK || string(d.Body) != "%PDF-1.4" || d.Header.Get("Content-Type") != "application/pdf" ||
			d.Header.Get("Content-Disposition") != "attachment; filename*=utf-8''report%201.pdf" {
			t.Errorf("remote PDF: %d %q %q %q", d.Status, d.Body, d.Header.Get("Content-Type"), d.Header.Get("Content-Disposition"))
		}

		// A remote image's thumbnail.
		server, id = upload(t, a, alice, "image/png", "pic.png", encodePNG(t, halves(400, 100)))
		th, img := thumbnail(t, b, bob.Token, server, id, "width=32&height=32&method=crop")
		if img == nil || img.Bounds().Dx() != 32 || img.Bounds().Dy() != 32 || th.Header.Get("Content-Type") != "image/png" {
			t.Errorf("remote thumbnail: %d %s", th.Status, th.Header.Get("Content-Type"))
		}

		// Unknown remote media; the unauthenticated path fetches nothing.
		if d := download(t, b, bob.Token, a.Config.ServerName, "NoSuchMedia"); d.Status != http.StatusNotFound || d.errcode() != "M_NOT_FOUND" {
			t.Errorf("unknown remote media: %d %s", d.Status, d.Body)
		}
		before := a.Requests.Count("GET", fedDownload)
		server, id = upload(t, a, alice, "text/plain", "", []byte("not fetched"))
		if d := do(t, b, "GET", "/_matrix/media/v3/download/"+server+"/"+id, "", nil, nil); d.Status != http.StatusNotFound || d.errcode() != "M_NOT_FOUND" {
			t.Errorf("unauthenticated remote download: %d %s", d.Status, d.Body)
		}
		if a.Requests.Count("GET", fedDownload) != before {
			t.Error("the unauthenticated download fetched remote media")
		}
	})
}

// fedGet sends a request to a node's federation listener and returns the
// raw answer.
func fedGet(t *testing.T, n *testutil.Node, req *http.Request) answer {
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
	return answer{Status: resp.StatusCode, Header: resp.Header, Body: raw}
}

// parts reads a multipart/mixed answer.
func parts(t *testing.T, a answer) []struct {
	Header textproto.MIMEHeader
	Body   []byte
} {
	t.Helper()
	mt, params, err := mime.ParseMediaType(a.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/mixed" {
		t.Fatalf("answer %d is %q, not multipart/mixed: %s", a.Status, a.Header.Get("Content-Type"), a.Body)
	}
	r := multipart.NewReader(bytes.NewReader(a.Body), params["boundary"])
	var out []struct {
		Header textproto.MIMEHeader
		Body   []byte
	}
	for {
		p, err := r.NextRawPart()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(p)
		out = append(out, struct {
			Header textproto.MIMEHeader
			Body   []byte
		}{p.Header, body})
	}
}

// Other servers get local media as the federation media endpoints give
// it: X-Matrix authenticated, multipart/mixed with a JSON part first.
func TestFederationServesMedia(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := startNode(t, db, nil)
		alice := n.Register(t, "alice", "")
		_, id := upload(t, n, alice, "text/plain", "notes.txt", []byte("over federation"))
		o := testutil.NewOrigin(t)

		unsigned, _ := http.NewRequest("GET", "https://x"+fedDownload+id, nil)
		if a := fedGet(t, n, unsigned); a.Status != http.StatusUnauthorized || a.errcode() != "M_UNAUTHORIZED" {
			t.Errorf("unsigned request: %d %s", a.Status, a.Body)
		}
		a := fedGet(t, n, o.SignedRequest(t, "GET", n.Config.ServerName, fedDownload+id, nil, "", nil))
		ps := parts(t, a)
		if a.Status != http.StatusOK || len(ps) != 2 {
			t.Fatalf("download: %d, %d parts", a.Status, len(ps))
		}
		if ps[0].Header.Get("Content-Type") != "application/json" || strings.TrimSpace(string(ps[0].Body)) != "{}" {
			t.Errorf("first part: %v %q", ps[0].Header, ps[0].Body)
		}
		if string(ps[1].Body) != "over federation" || ps[1].Header.Get("Content-Type") != "text/plain" ||
			ps[1].Header.Get("Content-Disposition") != "inline; filename=notes.txt" {
			t.Errorf("content part: %v %q", ps[1].Header, ps[1].Body)
		}

		_, img := upload(t, n, alice, "image/jpeg", "", encodeJPEG(t, halves(400, 100)))
		a = fedGet(t, n, o.SignedRequest(t, "GET", n.Config.ServerName, "/_matrix/federation/v1/media/thumbnail/"+img+"?width=32&height=32&method=crop", nil, "", nil))
		if ps := parts(t, a); a.Status != http.StatusOK || len(ps) != 2 || ps[1].Header.Get("Content-Type") != "image/jpeg" {
			t.Errorf("thumbnail: %d %v", a.Status, ps)
		}

		for _, p := range []string{fedDownload + "NoSuchMedia", fedDownload + "..%2F..%2Fetc"} {
			a := fedGet(t, n, o.SignedRequest(t, "GET", n.Config.ServerName, p, nil, "", nil))
			if a.Status/100 != 4 || a.errcode() == "" {
				t.Errorf("%s: %d %s", p, a.Status, a.Body)
			}
		}
	})
}

// mediaOrigin is a stand-in remote server whose media answers send the
// content elsewhere (a Location part).
func mediaOrigin(t *testing.T, location string) *testutil.Origin {
	o := testutil.NewOrigin(t)
	o.Mux.HandleFunc("GET "+fedDownload+"{mediaId}", func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.Header.Get("Authorization"), "X-Matrix ") {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		mw := multipart.NewWriter(w)
		w.Header().Set("Content-Type", "multipart/mixed; boundary="+mw.Boundary())
		p, _ := mw.CreatePart(textproto.MIMEHeader{"Content-Type": {"application/json"}})
		_, _ = p.Write([]byte("{}"))
		_, _ = mw.CreatePart(textproto.MIMEHeader{"Location": {location}})
		_ = mw.Close()
	})
	return o
}

// A remote server may answer with a Location: it is followed through the
// outbound address policy, and refused where the policy denies.
func TestRemoteMediaLocation(t *testing.T) {
	var hits atomic.Int32
	cdn := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "image/gif")
		w.Header().Set("Content-Disposition", `attachment; filename="anim.gif"`)
		_, _ = w.Write([]byte("GIF89a from the CDN"))
	}))
	defer cdn.Close()
	o := mediaOrigin(t, cdn.URL+"/file")
	n := startNode(t, testutil.SQLite(t), nil)
	bob := n.Register(t, "bob", "")
	d := download(t, n, bob.Token, o.Name, "Redirected")
	if d.Status != http.StatusOK || string(d.Body) != "GIF89a from the CDN" || d.Header.Get("Content-Type") != "image/gif" ||
		d.Header.Get("Content-Disposition") != "inline; filename=anim.gif" {
		t.Fatalf("download through a Location: %d %q %v", d.Status, d.Body, d.Header)
	}

	// A server whose policy allows 127.0.0.1 only: a Location on
	// 127.0.0.2 is not fetched.
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("no 127.0.0.2 on this machine: %v", err)
	}
	private := httptest.NewUnstartedServer(cdn.Config.Handler)
	private.Listener = ln
	private.Start()
	defer private.Close()
	before := hits.Load()
	o2 := mediaOrigin(t, private.URL+"/file")
	strict := startNode(t, testutil.SQLite(t), func(c *config.Config) { c.Federation.IPRangeAllowlist = []string{"127.0.0.1/32"} })
	carol := strict.Register(t, "carol", "")
	d = download(t, strict, carol.Token, o2.Name, "Redirected")
	if d.Status != http.StatusBadGateway || d.errcode() != "M_UNKNOWN" {
		t.Errorf("Location to a denied address: %d %s", d.Status, d.Body)
	}
	if hits.Load() != before {
		t.Error("the denied address was fetched")
	}
	if strings.Contains(string(d.Body), "127.0.0.2") {
		t.Errorf("the error names the address: %s", d.Body)
	}
	if mediaRows(t, strict) != 0 {
		t.Error("a record was stored")
	}
}

// A server without the federation media endpoints is asked through its
// older media API.
func TestRemoteMediaFromOlderServer(t *testing.T) {
	o := testutil.NewOrigin(t)
	var legacy atomic.Int32
	o.Mux.HandleFunc("GET /_matrix/media/v3/download/{server}/{mediaId}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("server") != o.Name || r.URL.Query().Get("allow_remote") != "false" {
			http.Error(w, "wrong request", http.StatusBadRequest)
			return
		}
		legacy.Add(1)
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Disposition", "inline; filename*=utf-8''old%20server.txt")
		_, _ = w.Write([]byte("from an older server"))
	})
	n := startNode(t, testutil.SQLite(t), nil)
	bob := n.Register(t, "bob", "")
	d := download(t, n, bob.Token, o.Name, "OldMedia")
	if d.Status != http.StatusOK || string(d.Body) != "from an older server" || d.Header.Get("Content-Disposition") != "inline; filename*=utf-8''old%20server.txt" {
		t.Fatalf("download from an older server: %d %q %q", d.Status, d.Body, d.Header.Get("Content-Disposition"))
	}
	if legacy.Load() != 1 {
		t.Errorf("%d requests to the older API", legacy.Load())
	}
}

// Remote media is fetched through the outbound address policy: a server
// on a denied address is not contacted.
func TestRemoteMediaDeniedAddress(t *testing.T) {
	var hits atomic.Int32
	o := testutil.NewOrigin(t)
	o.Mux.HandleFunc("GET "+fedDownload+"{mediaId}", func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Error(w, "unexpected", http.StatusInternalServerError)
	})
	n := startNode(t, testutil.SQLite(t), func(c *config.Config) { c.Federation.IPRangeAllowlist = []string{} })
	bob := n.Register(t, "bob", "")
	d := download(t, n, bob.Token, o.Name, "Anything")
	if d.Status != http.StatusBadGateway || d.errcode() != "M_UNKNOWN" || strings.Contains(string(d.Body), "127.0.0.1") {
		t.Errorf("media of a denied server: %d %s", d.Status, d.Body)
	}
	if hits.Load() != 0 {
		t.Error("the denied server was asked")
	}
}
