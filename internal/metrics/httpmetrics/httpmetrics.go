// Package httpmetrics observes HTTP requests into the server's metrics. It
// is apart from package metrics so that the domain, which counts its own
// events there, does not depend on the HTTP router.
package httpmetrics

import (
	"net/http"
	"regexp"
	"strconv"
	"time"

	"github.com/gorilla/mux"

	"github.com/keyserver/keyserver/internal/httpx"
	"github.com/keyserver/keyserver/internal/metrics"
)

// APIVersionVar is the path variable holding the API version of routes
// that serve several ("{apiVersion:(?:r0|v3)}").
const APIVersionVar = "apiVersion"

var versionPattern = regexp.MustCompile(`\{` + APIVersionVar + `(:[^}]*)?\}`)

// Middleware is a mux middleware observing each matched request under its
// route template.
func Middleware(api string) mux.MiddlewareFunc {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			endpoint := "unknown"
			if route := mux.CurrentRoute(r); route != nil {
				if t, err := route.GetPathTemplate(); err == nil {
					endpoint = t
					// A route serving several API versions has the
					// version as a pattern: the label names the one
					// requested, as a route per version would.
					if v, ok := mux.Vars(r)[APIVersionVar]; ok {
						endpoint = versionPattern.ReplaceAllLiteralString(t, v)
					}
				}
			}
			start := time.Now()
			method := r.Method
			rec := &httpx.StatusRecorder{ResponseWriter: w, Done: func(status int) {
				metrics.HTTPRequests.WithLabelValues(api, endpoint, method, strconv.Itoa(status)).Observe(time.Since(start).Seconds())
			}}
			next.ServeHTTP(rec, r)
			if !rec.Detached() {
				rec.Done(rec.Status)
			}
		})
	}
}
