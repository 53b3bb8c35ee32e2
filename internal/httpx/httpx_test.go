package httpx

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/mxerr"
)

func TestMiddlewareRecoversPanics(t *testing.T) {
	var logs bytes.Buffer
	log := logrus.New()
	log.SetOutput(&logs)
	h := Middleware(log, "test", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var m map[string]int
		m["boom"] = 1 // a nil map write: a bug, not the client's fault
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/x?access_token=secret", nil))
	if rec.Code != 500 {
		t.Fatalf("status %d", rec.Code)
	}
	var body map[string]string
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body["errcode"] != "M_UNKNOWN" || body["error"] == "" {
		t.Fatalf("body %s", rec.Body)
	}
	if !strings.Contains(logs.String(), "handler panicked") || !strings.Contains(logs.String(), "path=/x") {
		t.Fatalf("panic not logged with the request: %s", logs.String())
	}
	if !strings.Contains(logs.String(), "request_id="+rec.Header().Get("X-Request-Id")) || rec.Header().Get("X-Request-Id") == "" {
		t.Fatalf("no request ID on the log line: %s", logs.String())
	}
	if strings.Contains(logs.String(), "secret") {
		t.Fatal("the access token was logged")
	}
}

func TestErrorHidesInternalErrors(t *testing.T) {
	log := logrus.New()
	log.SetOutput(io.Discard)
	rec := httptest.NewRecorder()
	Error(rec, httptest.NewRequest("GET", "/", nil), errors.New("pq: password authentication failed"))
	if rec.Code != 500 || strings.Contains(rec.Body.String(), "pq") {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	Error(rec, httptest.NewRequest("GET", "/", nil), mxerr.Forbidden("no"))
	if rec.Code != 403 || !strings.Contains(rec.Body.String(), `"errcode":"M_FORBIDDEN"`) {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
}

func TestDecode(t *testing.T) {
	type req struct {
		Name  string `json:"name"`
		Count int    `json:"count"`
	}
	for _, tc := range []struct {
		body    string
		emptyOK bool
		errcode string
	}{
		{`{"name":"x","count":1}`, false, ""},
		{``, true, ""},
		{`  `, false, "M_NOT_JSON"},
		{`{`, false, "M_NOT_JSON"},
		{`{"a":1}{"b":2}`, false, "M_NOT_JSON"},
		{`[]`, false, "M_BAD_JSON"},
		{`"x"`, false, "M_BAD_JSON"},
		{`null`, false, "M_BAD_JSON"},
		{`{"count":"x"}`, false, "M_BAD_JSON"},
		{`{"count":1.5}`, false, "M_BAD_JSON"},
		{`{"name":{}}`, false, "M_BAD_JSON"},
		{"{\"name\":\"\xff\"}", false, "M_NOT_JSON"},
		{`{"name":"a\u0000"}`, false, "M_BAD_JSON"},
	} {
		var v req
		err := Decode([]byte(tc.body), &v, tc.emptyOK)
		var me *mxerr.Error
		got := ""
		if errors.As(err, &me) {
			got = me.Code
		} else if err != nil {
			got = "other: " + err.Error()
		}
		if got != tc.errcode {
			t.Errorf("%q: %q, want %q", tc.body, got, tc.errcode)
		}
	}
}

func TestReadBodyCap(t *testing.T) {
	for _, tc := range []struct {
		size    int
		chunked bool
		ok      bool
	}{{100, false, true}, {100, true, true}, {101, false, false}, {101, true, false}} {
		var body io.Reader = strings.NewReader(strings.Repeat("a", tc.size))
		if tc.chunked {
			body = io.MultiReader(body) // hides the length, as a chunked upload does
		}
		r := httptest.NewRequest("POST", "/", body)
		if tc.chunked {
			r.ContentLength = -1
		}
		_, err := ReadBody(r, 100)
		var me *mxerr.Error
		if tc.ok != (err == nil) || (err != nil && (!errors.As(err, &me) || me.Status != 413 || me.Code != "M_TOO_LARGE")) {
			t.Errorf("%+v: %v", tc, err)
		}
	}
}

// A request its client abandoned is not a server error: no error line,
// and 499 is recorded.
func TestErrorOfAbandonedRequest(t *testing.T) {
	for _, c := range []struct {
		err       error
		wantLevel string
	}{
		{context.Canceled, "level=debug"},
		{fmt.Errorf("query: %w", context.DeadlineExceeded), "level=debug"},
		{errors.New("disk I/O error"), "level=warning"},
	} {
		var logs bytes.Buffer
		log := logrus.New()
		log.SetOutput(&logs)
		log.SetLevel(logrus.DebugLevel)
		h := Middleware(log, "test", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			Error(w, r, c.err)
		}))
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", "/keys/upload", nil).WithContext(ctx))
		if rec.Code != StatusClientClosedRequest {
			t.Fatalf("%v: status %d", c.err, rec.Code)
		}
		if strings.Contains(logs.String(), "level=error") || !strings.Contains(logs.String(), c.wantLevel+` msg="request`) {
			t.Fatalf("%v: want it logged at %s, not as an error: %s", c.err, c.wantLevel, logs.String())
		}
	}
}

// A JSON answer states its length: a large one is not sent in chunks.
func TestJSONStatesItsLength(t *testing.T) {
	big := strings.Repeat("k", 64<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		JSON(w, http.StatusOK, map[string]string{"v": big})
	}))
	defer srv.Close()
	res, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if res.ContentLength != int64(len(body)) || len(res.TransferEncoding) != 0 {
		t.Fatalf("Content-Length %d, transfer encoding %v, for a body of %d bytes", res.ContentLength, res.TransferEncoding, len(body))
	}
}
