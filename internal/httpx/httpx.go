// Package httpx holds the HTTP plumbing both APIs share: JSON responses,
// capped and typed request bodies, Matrix errors for unknown routes, panic
// recovery, CORS and request logging.
package httpx

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/reqlog"
)

// Appender is a response that encodes itself, for hot paths whose bodies
// are mostly JSON the server stored itself and need not re-validate.
type Appender interface {
	AppendJSON(b []byte) ([]byte, error)
}

// appendBufs recycles the buffers of Appender responses: query answers
// run to tens of kilobytes, and growing a fresh buffer for each was the
// largest source of garbage on the hot path.
var appendBufs = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// maxPooledBuf keeps a rare huge answer from pinning its buffer.
const maxPooledBuf = 1 << 20

// JSON writes v as a JSON response.
func JSON(w http.ResponseWriter, status int, v any) {
	var body []byte
	var err error
	if a, ok := v.(Appender); ok {
		buf := appendBufs.Get().(*[]byte)
		body, err = a.AppendJSON((*buf)[:0])
		defer func() {
			if cap(body) <= maxPooledBuf {
				*buf = body[:0]
				appendBufs.Put(buf)
			}
		}()
	} else {
		body, err = json.Marshal(v)
	}
	if err != nil {
		status = http.StatusInternalServerError
		body = []byte(`{"errcode":"M_UNKNOWN","error":"internal server error"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	// With its length known the body goes out as it is, not in chunks
	// ended by one more write.
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// StatusClientClosedRequest is recorded for requests whose client left
// before the answer was ready (nginx's 499).
const StatusClientClosedRequest = 499

// Error writes err as a Matrix error. An *mxerr.Error is the caller's
// mistake and goes out as it is. If the client has gone, nobody reads the
// answer: it is recorded as 499. Anything else is logged and answered 500
// M_UNKNOWN without its details.
func Error(w http.ResponseWriter, r *http.Request, err error) {
	var me *mxerr.Error
	if errors.As(err, &me) {
		if ms, ok := me.Extra["retry_after_ms"].(int64); ok && me.Status == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", strconv.FormatInt((ms+999)/1000, 10))
		}
		JSON(w, me.Status, me.Body())
		return
	}
	if r.Context().Err() != nil {
		// 499 is the status proxies log for it. Work cut short by the
		// departure is nothing to act on; a failure of another kind is
		// still worth a warning (it may be why the client gave up).
		l := Logger(r).WithError(err)
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			l.Debug("request abandoned by the client")
		} else {
			l.Warn("request failed after its client left")
		}
		w.WriteHeader(StatusClientClosedRequest)
		return
	}
	Logger(r).WithError(err).Error("request failed")
	JSON(w, http.StatusInternalServerError, map[string]any{"errcode": "M_UNKNOWN", "error": "internal server error"})
}

// LimitExceeded answers 429 M_LIMIT_EXCEEDED with the wait in both the
// Retry-After header and the body's retry_after_ms.
func LimitExceeded(w http.ResponseWriter, r *http.Request, wait time.Duration) {
	Error(w, r, mxerr.LimitExceeded(wait))
}

// ReadBody reads a request body of at most limit bytes.
func ReadBody(r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, mxerr.TooLarge("request body is larger than %d bytes", limit)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, mxerr.Unknown("could not read request body: %v", err)
	}
	if int64(len(body)) > limit {
		return nil, mxerr.TooLarge("request body is larger than %d bytes", limit)
	}
	return body, nil
}

// Decode parses a JSON object body into v. Invalid JSON is M_NOT_JSON;
// anything but an object, or values of the wrong type, M_BAD_JSON. An empty
// body counts as {} when emptyOK.
func Decode(body []byte, v any, emptyOK bool) error {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		if emptyOK {
			return nil
		}
		return mxerr.NotJSON("request body is empty, expected a JSON object")
	}
	if !json.Valid(trimmed) || !utf8.Valid(trimmed) {
		return mxerr.NotJSON("request body is not valid JSON in UTF-8")
	}
	if trimmed[0] != '{' {
		return mxerr.BadJSON("request body must be a JSON object")
	}
	// No identifier, key or name has a NUL in it, and PostgreSQL cannot
	// store one: refuse it here rather than fail later.
	if bytes.Contains(trimmed, []byte(`\u0000`)) {
		return mxerr.BadJSON("strings must not contain NUL characters")
	}
	if err := json.Unmarshal(trimmed, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return mxerr.BadJSON("%s must be of type %s, not %s", te.Field, jsonKind(te.Type.Kind().String()), te.Value)
		}
		return mxerr.BadJSON("request body has the wrong shape: %v", err)
	}
	return nil
}

func jsonKind(goKind string) string {
	switch {
	case strings.HasPrefix(goKind, "int"), strings.HasPrefix(goKind, "uint"), strings.HasPrefix(goKind, "float"):
		return "number"
	case goKind == "map", goKind == "struct":
		return "object"
	case goKind == "slice":
		return "array"
	case goKind == "bool":
		return "boolean"
	}
	return goKind
}

// CleanParam checks a value taken from a path or query string: valid
// UTF-8 without NUL, as everything stored must be.
func CleanParam(name, v string) error {
	if !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
		return mxerr.InvalidParam("%s is not valid UTF-8 text", name)
	}
	return nil
}

// ReadJSON reads and decodes a capped JSON object body.
func ReadJSON(r *http.Request, limit int64, v any, emptyOK bool) error {
	body, err := ReadBody(r, limit)
	if err != nil {
		return err
	}
	return Decode(body, v, emptyOK)
}

// NotFoundHandler answers unknown endpoints.
func NotFoundHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		JSON(w, http.StatusNotFound, (&mxerr.Error{Code: "M_UNRECOGNIZED", Message: "unrecognized request"}).Body())
	})
}

// MethodNotAllowedHandler answers a known endpoint called with the wrong method.
func MethodNotAllowedHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		JSON(w, http.StatusMethodNotAllowed, (&mxerr.Error{Code: "M_UNRECOGNIZED", Message: fmt.Sprintf("method %s is not allowed here", r.Method)}).Body())
	})
}

// CORS adds the headers browser clients need and answers preflight
// requests without running the endpoint.
func CORS(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE, OPTIONS")
		h.Set("Access-Control-Allow-Headers", "X-Requested-With, Content-Type, Authorization")
		if r.Method == http.MethodOptions {
			JSON(w, http.StatusOK, struct{}{})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// StatusRecorder remembers the status a handler answered with.
type StatusRecorder struct {
	http.ResponseWriter
	Status int // 0 until the handler writes
	// Done, when set, is what the middleware does with the status once the
	// request is answered; it is called by the middleware when the handler
	// returns, or through Detach for a request answered later.
	Done     func(status int)
	detached bool
}

// Detached tells whether the handler took its request away (Detach).
func (s *StatusRecorder) Detached() bool { return s.detached }

// Detach is for a handler that takes its connection over and answers
// later, after it returned: the middlewares recording the answer (the
// request log line, the metrics) do not record it when the handler
// returns, and the returned function records it, once, with the status
// it got. It must be called by the handler, before it returns.
func Detach(w http.ResponseWriter) (done func(status int)) {
	var fs []func(int)
	for w != nil {
		if s, ok := w.(*StatusRecorder); ok {
			s.detached = true
			if s.Done != nil {
				fs = append(fs, s.Done)
			}
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			break
		}
		w = u.Unwrap()
	}
	return func(status int) {
		for _, f := range fs {
			f(status)
		}
	}
}

// WriteHeader records the status.
func (s *StatusRecorder) WriteHeader(code int) {
	if s.Status == 0 {
		s.Status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

// Write records an implicit 200.
func (s *StatusRecorder) Write(b []byte) (int, error) {
	if s.Status == 0 {
		s.Status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

var requestCounter atomic.Uint64

// requestID names a request: a per-process random prefix and a counter,
// unique without coordination and cheap.
func requestID() string {
	return processPrefix + strconv.FormatUint(requestCounter.Add(1), 36)
}

var processPrefix = func() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b) + "-"
}()

// Logger returns the request's logger.
func Logger(r *http.Request) logrus.FieldLogger {
	return reqlog.From(r.Context(), logrus.StandardLogger())
}

// Middleware recovers panics (logged with the request, answered 500
// M_UNKNOWN), attaches a request logger and logs one line per request at
// debug level. The logged path never includes the query string, which may
// carry an access token.
func Middleware(log logrus.FieldLogger, api string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := requestID()
		w.Header().Set("X-Request-Id", id)
		rl := log.WithFields(logrus.Fields{"request_id": id, "api": api, "method": r.Method, "path": r.URL.Path, "remote": r.RemoteAddr})
		r = r.WithContext(reqlog.With(r.Context(), rl))
		rec := &StatusRecorder{ResponseWriter: w, Done: func(status int) {
			rl.WithFields(logrus.Fields{"status": status, "duration_ms": time.Since(start).Milliseconds()}).Debug("request")
		}}
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				rl.WithField("panic", fmt.Sprint(p)).WithField("stack", string(debug.Stack())).Error("handler panicked")
				if rec.Status == 0 && !rec.detached {
					JSON(rec, http.StatusInternalServerError, map[string]any{"errcode": "M_UNKNOWN", "error": "internal server error"})
				}
			}
			if !rec.detached {
				rec.Done(rec.Status)
			}
		}()
		next.ServeHTTP(rec, r)
	})
}
