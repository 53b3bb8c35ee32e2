package httpx

import (
	"net/http"
	"time"
)

// Unwrap gives http.ResponseController the connection's writer, so that
// handlers behind the middleware can change their deadlines.
func (s *StatusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// ExtendWriteDeadline gives a request that may wait up to wait (for news,
// for other servers) that long beyond the server's write timeout, counted
// from now. With writeTimeout 0 (no timeout) it does nothing.
func ExtendWriteDeadline(w http.ResponseWriter, wait, writeTimeout time.Duration) {
	if writeTimeout <= 0 {
		return
	}
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + writeTimeout))
}
