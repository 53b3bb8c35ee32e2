package media_test

import (
	"bytes"
	"crypto/rand"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/testutil"
)

// An upload is downloaded byte for byte, with the headers that keep a
// browser from running it: inline only for safe types, the file name
// encoded as RFC 6266 says, and the sandboxing policy.
func TestUploadAndDownload(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := startNode(t, db, nil)
		alice := n.Register(t, "alice", "")
		content := []byte("\x89PNG not really, but bytes all the same")
		server, id := upload(t, n, alice, "image/png", "cat picture.png", content)
		if server != n.Config.ServerName {
			t.Fatalf("server name %q, want %q", server, n.Config.ServerName)
		}
		a := download(t, n, alice.Token, server, id)
		if a.Status != http.StatusOK || !bytes.Equal(a.Body, content) {
			t.Fatalf("download: %d %q", a.Status, a.Body)
		}
		for k, want := range map[string]string{
			"Content-Type":           "image/png",
			"Content-Disposition":    "inline; filename*=utf-8''cat%20picture.png",
			"X-Content-Type-Options": "nosniff",
			"Content-Length":         strconv.Itoa(len(content)),
		} {
			if got := a.Header.Get(k); got != want {
				t.Errorf("%s: %q, want %q", k, got, want)
			}
		}
		if csp := a.Header.Get("Content-Security-Policy"); !strings.HasPrefix(csp, "sandbox;") || !strings.Contains(csp, "script-src 'none'") {
			t.Errorf("Content-Security-Policy %q", csp)
		}
		// The file name in the path names the download.
		a = do(t, n, "GET", "/_matrix/client/v1/media/download/"+server+"/"+id+"/other.png", alice.Token, nil, nil)
		if got := a.Header.Get("Content-Disposition"); a.Status != http.StatusOK || got != "inline; filename=other.png" {
			t.Errorf("download with a name: %d %q", a.Status, got)
		}
		// Another user of the server may download it too; nobody without
		// a token.
		bob := n.Register(t, "bob", "")
		if a := download(t, n, bob.Token, server, id); a.Status != http.StatusOK || !bytes.Equal(a.Body, content) {
			t.Errorf("bob's download: %d", a.Status)
		}
		if a := download(t, n, "", server, id); a.Status != http.StatusUnauthorized || a.errcode() != "M_MISSING_TOKEN" {
			t.Errorf("download without a token: %d %s", a.Status, a.Body)
		}

		for _, c := range []struct{ ct, name, want string }{
			{"text/html", "page.html", "attachment; filename=page.html"},
			{"image/svg+xml", "", "attachment"},
			{"text/plain; charset=utf-8", "", "inline"},
			{"application/pdf", "résumé.pdf", "attachment; filename*=utf-8''r%C3%A9sum%C3%A9.pdf"},
			{"", "", "attachment"},
		} {
			server, id := upload(t, n, alice, c.ct, c.name, []byte("<script>alert(1)</script>"))
			a := download(t, n, alice.Token, server, id)
			wantType := c.ct
			if wantType == "" {
				wantType = "application/octet-stream"
			}
			if a.Status != http.StatusOK || a.Header.Get("Content-Disposition") != c.want || a.Header.Get("Content-Type") != wantType {
				t.Errorf("%q %q: %d, Content-Type %q, Content-Disposition %q, want %q", c.ct, c.name, a.Status,
					a.Header.Get("Content-Type"), a.Header.Get("Content-Disposition"), c.want)
			}
		}

		// The r0 and v1 paths upload too.
		for _, v := range []string{"r0", "v1"} {
			a := do(t, n, "POST", uploadPath(v, "x.txt"), alice.Token, map[string]string{"Content-Type": "text/plain"}, strings.NewReader(v))
			if a.Status != http.StatusOK {
				t.Fatalf("%s upload: %d %s", v, a.Status, a.Body)
			}
			server, id := splitMXC(t, a.json(t)["content_uri"])
			if a := download(t, n, alice.Token, server, id); string(a.Body) != v {
				t.Errorf("%s upload downloaded as %q", v, a.Body)
			}
		}

		// The same bytes twice are one file.
		kept, _ := mediaFiles(t, n)
		upload(t, n, bob, "image/png", "again.png", content)
		if k, tmp := mediaFiles(t, n); k != kept || tmp != 0 {
			t.Errorf("files after uploading the same bytes again: %d (%d before), %d temporary", k, kept, tmp)
		}

		// The unauthenticated download paths serve none of it.
		for _, p := range []string{"/_matrix/media/v3/download/", "/_matrix/media/r0/download/", "/_matrix/media/v3/thumbnail/"} {
			a := do(t, n, "GET", p+server+"/"+id+"?width=32&height=32", alice.Token, nil, nil)
			if a.Status != http.StatusNotFound || a.errcode() != "M_NOT_FOUND" {
				t.Errorf("%s: %d %s, want 404 M_NOT_FOUND", p, a.Status, a.Body)
			}
		}

		for _, p := range []string{"/_matrix/client/v1/media/config", "/_matrix/media/v3/config"} {
			a := do(t, n, "GET", p, alice.Token, nil, nil)
			if a.Status != http.StatusOK || a.json(t)["m.upload.size"] != float64(n.Config.Media.MaxUploadSize) {
				t.Errorf("%s: %d %s", p, a.Status, a.Body)
			}
		}
	})
}

// With authenticated media off, the older unauthenticated paths serve
// media.
func TestUnauthenticatedMediaWhenAllowed(t *testing.T) {
	n := startNode(t, testutil.SQLite(t), func(c *config.Config) { c.Media.EnableAuthenticatedMedia = false })
	alice := n.Register(t, "alice", "")
	server, id := upload(t, n, alice, "text/plain", "a.txt", []byte("hello"))
	for _, p := range []string{"/_matrix/media/v3/download/", "/_matrix/media/r0/download/", "/_matrix/client/v1/media/download/"} {
		token := ""
		if strings.HasPrefix(p, "/_matrix/client") {
			token = alice.Token
		}
		if a := do(t, n, "GET", p+server+"/"+id, token, nil, nil); a.Status != http.StatusOK || string(a.Body) != "hello" {
			t.Errorf("%s: %d %q", p, a.Status, a.Body)
		}
	}
}

// An ID reserved with /create is filled once, by its owner, before it
// expires; a download waits for it.
func TestAsyncUpload(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := startNode(t, db, nil)
		alice, bob := n.Register(t, "alice", ""), n.Register(t, "bob", "")
		before := time.Now().UnixMilli()
		a := do(t, n, "POST", "/_matrix/media/v1/create", alice.Token, nil, nil)
		if a.Status != http.StatusOK {
			t.Fatalf("create: %d %s", a.Status, a.Body)
		}
		body := a.json(t)
		server, id := splitMXC(t, body["content_uri"])
		exp, _ := body["unused_expires_at"].(float64)
		if int64(exp) < before+23*3600*1000 {
			t.Errorf("unused_expires_at %v: not a day ahead", body["unused_expires_at"])
		}
		putPath := "/_matrix/media/v3/upload/" + server + "/" + id + "?filename=late.txt"
		text := map[string]string{"Content-Type": "text/plain"}

		if a := do(t, n, "GET", "/_matrix/client/v1/media/download/"+server+"/"+id+"?timeout_ms=0", alice.Token, nil, nil); a.Status != http.StatusGatewayTimeout || a.errcode() != "M_NOT_YET_UPLOADED" {
			t.Errorf("download before the upload: %d %s", a.Status, a.Body)
		}
		if a := do(t, n, "PUT", putPath, bob.Token, text, strings.NewReader("bob's")); a.Status != http.StatusForbidden || a.errcode() != "M_FORBIDDEN" {
			t.Errorf("someone else's ID: %d %s", a.Status, a.Body)
		}
		if a := do(t, n, "PUT", "/_matrix/media/v3/upload/"+server+"/NoSuchMediaID", alice.Token, text, strings.NewReader("x")); a.Status != http.StatusNotFound || a.errcode() != "M_NOT_FOUND" {
			t.Errorf("unknown ID: %d %s", a.Status, a.Body)
		}
		if a := do(t, n, "PUT", "/_matrix/media/v3/upload/other.example/"+id, alice.Token, text, strings.NewReader("x")); a.Status != http.StatusNotFound || a.errcode() != "M_NOT_FOUND" {
			t.Errorf("another server's ID: %d %s", a.Status, a.Body)
		}
		if kept, tmp := mediaFiles(t, n); kept != 0 || tmp != 0 {
			t.Errorf("refused uploads left files: %d, %d temporary", kept, tmp)
		}

		// A download waiting for the content gets it once it arrives.
		got := make(chan answer, 1)
		go func() {
			got <- do(t, n, "GET", "/_matrix/client/v1/media/download/"+server+"/"+id+"?timeout_ms=20000", bob.Token, nil, nil)
		}()
		if a := do(t, n, "PUT", putPath, alice.Token, text, strings.NewReader("late content")); a.Status != http.StatusOK {
			t.Fatalf("upload: %d %s", a.Status, a.Body)
		}
		if a := <-got; a.Status != http.StatusOK || string(a.Body) != "late content" || a.Header.Get("Content-Disposition") != "inline; filename=late.txt" {
			t.Errorf("waiting download: %d %q %q", a.Status, a.Body, a.Header.Get("Content-Disposition"))
		}
		if a := do(t, n, "PUT", putPath, alice.Token, text, strings.NewReader("again")); a.Status != http.StatusConflict || a.errcode() != "M_CANNOT_OVERWRITE_MEDIA" {
			t.Errorf("second upload: %d %s", a.Status, a.Body)
		}
		if a := download(t, n, alice.Token, server, id); string(a.Body) != "late content" {
			t.Errorf("content after a refused overwrite: %q", a.Body)
		}

		// At most five IDs wait for their content at once.
		for i := 0; i < 5; i++ {
			if a := do(t, n, "POST", "/_matrix/media/v1/create", alice.Token, nil, nil); a.Status != http.StatusOK {
				t.Fatalf("create %d: %d %s", i, a.Status, a.Body)
			}
		}
		a = do(t, n, "POST", "/_matrix/media/v1/create", alice.Token, nil, nil)
		if a.Status != http.StatusTooManyRequests || a.errcode() != "M_LIMIT_EXCEEDED" || a.json(t)["retry_after_ms"] == nil {
			t.Errorf("sixth pending ID: %d %s", a.Status, a.Body)
		}
		if a := do(t, n, "POST", "/_matrix/media/v1/create", bob.Token, nil, nil); a.Status != http.StatusOK {
			t.Errorf("another user's ID: %d %s", a.Status, a.Body)
		}
	})
}

// A reserved ID that expires unused can no longer be uploaded to, and no
// longer counts against its owner.
func TestAsyncUploadExpiry(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := startNode(t, db, func(c *config.Config) {
			c.Media.UnusedExpiration = config.Duration(time.Millisecond)
			c.Media.MaxPendingUploads = 1
		})
		alice := n.Register(t, "alice", "")
		a := do(t, n, "POST", "/_matrix/media/v1/create", alice.Token, nil, nil)
		server, id := splitMXC(t, a.json(t)["content_uri"])
		exp := int64(a.json(t)["unused_expires_at"].(float64))
		testutil.Eventually(t, "the reservation to expire", func() bool { return time.Now().UnixMilli() > exp })
		if a := do(t, n, "PUT", "/_matrix/media/v3/upload/"+server+"/"+id, alice.Token, nil, strings.NewReader("x")); a.Status != http.StatusNotFound || a.errcode() != "M_NOT_FOUND" {
			t.Errorf("upload to an expired ID: %d %s", a.Status, a.Body)
		}
		if a := download(t, n, alice.Token, server, id); a.Status != http.StatusNotFound {
			t.Errorf("download of an expired ID: %d %s", a.Status, a.Body)
		}
		if a := do(t, n, "POST", "/_matrix/media/v1/create", alice.Token, nil, nil); a.Status != http.StatusOK {
			t.Errorf("create after the expiry: %d %s", a.Status, a.Body)
		}
		if kept, _ := mediaFiles(t, n); kept != 0 {
			t.Errorf("%d files stored", kept)
		}
	})
}

// Bad uploads and paths are refused with a clear error, and store
// nothing.
func TestMediaBadInput(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		n := startNode(t, db, func(c *config.Config) { c.Media.MaxUploadSize = 1000 })
		alice := n.Register(t, "alice", "")
		rows := mediaRows(t, n)
		big := make([]byte, 1001)
		_, _ = rand.Read(big)
		if a := do(t, n, "POST", uploadPath("v3", ""), alice.Token, nil, bytes.NewReader(big)); a.Status != http.StatusRequestEntityTooLarge || a.errcode() != "M_TOO_LARGE" {
			t.Errorf("too large: %d %s", a.Status, a.Body)
		}
		// Without a Content-Length (chunked), the limit holds as the body
		// is read.
		if a := do(t, n, "POST", uploadPath("v3", ""), alice.Token, nil, io.MultiReader(bytes.NewReader(big))); a.Status != http.StatusRequestEntityTooLarge || a.errcode() != "M_TOO_LARGE" {
			t.Errorf("too large, chunked: %d %s", a.Status, a.Body)
		}
		for _, name := range []string{"../../etc/passwd", "a/b.txt", `a\b.txt`, "..", "bell\a.txt"} {
			if a := do(t, n, "POST", uploadPath("v3", name), alice.Token, nil, strings.NewReader("x")); a.Status != http.StatusBadRequest || a.errcode() != "M_INVALID_PARAM" {
				t.Errorf("file name %q: %d %s", name, a.Status, a.Body)
			}
		}
		// A body shorter than its Content-Length.
		status, body := shortBody(t, n, alice.Token)
		if status != http.StatusBadRequest || !strings.Contains(body, "M_UNKNOWN") {
			t.Errorf("short body: %d %s", status, body)
		}
		if got := mediaRows(t, n); got != rows {
			t.Errorf("media records: %d, want %d", got, rows)
		}
		if kept, tmp := mediaFiles(t, n); kept != 0 || tmp != 0 {
			t.Errorf("refused uploads left files: %d, %d temporary", kept, tmp)
		}

		server, id := upload(t, n, alice, "text/plain", "ok.txt", []byte("fine"))
		for _, c := range []struct {
			path    string
			status  int
			errcode string
		}{
			{"/_matrix/client/v1/media/download/" + server + "/..%2F..%2Fetc%2Fpasswd", 400, "M_INVALID_PARAM"},
			{"/_matrix/client/v1/media/download/" + server + "/" + id + "/..%2Fx", 400, "M_INVALID_PARAM"},
			{"/_matrix/client/v1/media/download/bad%2Fserver/" + id, 400, "M_INVALID_PARAM"},
			{"/_matrix/client/v1/media/download/" + server + "/NoSuchMedia", 404, "M_NOT_FOUND"},
			{"/_matrix/client/v1/media/download/" + server + "/" + id + "?timeout_ms=soon", 400, "M_INVALID_PARAM"},
			{"/_matrix/client/v1/media/thumbnail/" + server + "/" + id + "?width=x&height=32", 400, "M_INVALID_PARAM"},
			{"/_matrix/client/v1/media/thumbnail/" + server + "/" + id + "?width=32", 400, "M_MISSING_PARAM"},
			{"/_matrix/client/v1/media/thumbnail/" + server + "/" + id + "?width=32&height=32&method=zoom", 400, "M_INVALID_PARAM"},
			{"/_matrix/client/v1/media/thumbnail/" + server + "/" + id + "?width=32&height=32", 400, "M_UNKNOWN"}, // text
		} {
			if a := do(t, n, "GET", c.path, alice.Token, nil, nil); a.Status != c.status || a.errcode() != c.errcode {
				t.Errorf("%s: %d %s, want %d %s", c.path, a.Status, a.Body, c.status, c.errcode)
			}
		}
	})
}

// shortBody sends an upload whose body ends before its Content-Length.
func shortBody(t *testing.T, n *testutil.Node, token string) (int, string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(n.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = io.WriteString(conn, "POST /_matrix/media/v3/upload HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+token+
		"\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\nonly ten b")
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.(*net.TCPConn).CloseWrite()
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufioReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(raw)
}

// Uploads beyond the per-user rate are refused.
func TestUploadRateLimit(t *testing.T) {
	n := startNode(t, testutil.SQLite(t), func(c *config.Config) {
		c.Media.UploadRateLimit = config.RateLimit{PerSecond: 0.001, Burst: 2}
	})
	alice, bob := n.Register(t, "alice", ""), n.Register(t, "bob", "")
	upload(t, n, alice, "text/plain", "", []byte("1"))
	upload(t, n, alice, "text/plain", "", []byte("2"))
	if a := do(t, n, "POST", uploadPath("v3", ""), alice.Token, nil, strings.NewReader("3")); a.Status != http.StatusTooManyRequests || a.errcode() != "M_LIMIT_EXCEEDED" {
		t.Errorf("third upload: %d %s", a.Status, a.Body)
	}
	if a := do(t, n, "POST", "/_matrix/media/v1/create", alice.Token, nil, nil); a.Status != http.StatusTooManyRequests {
		t.Errorf("create after the limit: %d %s", a.Status, a.Body)
	}
	upload(t, n, bob, "text/plain", "", []byte("bob's own"))
}

// /versions tells clients that look there that media is authenticated.
func TestVersionsNameAuthenticatedMedia(t *testing.T) {
	n := startNode(t, testutil.SQLite(t), nil)
	a := do(t, n, "GET", "/_matrix/client/versions", "", nil, nil)
	features, _ := a.json(t)["unstable_features"].(map[string]any)
	if features["org.matrix.msc3916.stable"] != true {
		t.Errorf("unstable_features: %v", features)
	}
}
