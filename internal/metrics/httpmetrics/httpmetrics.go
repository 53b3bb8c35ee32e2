// Package httpmetrics observes HTTP requests into the server's metrics. It
// is apart from package metrics so that the domain, which counts its own
// events there, does not depend on the HTTP router.
package httpmetrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/gorilla/mux"

	"github.com/keyserver/keyserver/internal/httpx"
	"github.com/keyserver/keyserver/internal/metrics"
)

// Middleware is a mux middleware observing each matched request under its
// route template.
func Middleware(api string) mux.MiddlewareFunc {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			endpoint := "unknown"
			if route := mux.CurrentRoute(r); route != nil {
				if t, err := route.GetPathTemplate(); err == nil {
					endpoint = t
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
