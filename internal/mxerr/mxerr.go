// Package mxerr is the Matrix error: an errcode, a message and the HTTP
// status it travels with. The domain layer returns these for every mistake
// a caller can make; anything else reaching the HTTP layer is a 500.
package mxerr

import (
	"fmt"
	"net/http"
	"time"
)

// Error is a Matrix error response.
type Error struct {
	Status  int
	Code    string
	Message string
	// Extra holds fields some errors add to the body (retry_after_ms, the
	// flows of a user-interactive auth challenge, ...).
	Extra map[string]any
}

func (e *Error) Error() string { return fmt.Sprintf("%d %s: %s", e.Status, e.Code, e.Message) }

// Body is the JSON response body.
func (e *Error) Body() map[string]any {
	b := make(map[string]any, 2+len(e.Extra))
	for k, v := range e.Extra {
		b[k] = v
	}
	if e.Code != "" {
		b["errcode"] = e.Code
		b["error"] = e.Message
	}
	return b
}

// New makes an error.
func New(status int, code, format string, a ...any) *Error {
	return &Error{Status: status, Code: code, Message: fmt.Sprintf(format, a...)}
}

// Constructors for the errors used across the server.
func BadJSON(format string, a ...any) *Error {
	return New(http.StatusBadRequest, "M_BAD_JSON", format, a...)
}
func NotJSON(format string, a ...any) *Error {
	return New(http.StatusBadRequest, "M_NOT_JSON", format, a...)
}
func InvalidParam(format string, a ...any) *Error {
	return New(http.StatusBadRequest, "M_INVALID_PARAM", format, a...)
}
func MissingParam(format string, a ...any) *Error {
	return New(http.StatusBadRequest, "M_MISSING_PARAM", format, a...)
}
func Forbidden(format string, a ...any) *Error {
	return New(http.StatusForbidden, "M_FORBIDDEN", format, a...)
}
func NotFound(format string, a ...any) *Error {
	return New(http.StatusNotFound, "M_NOT_FOUND", format, a...)
}
func MissingToken(format string, a ...any) *Error {
	return New(http.StatusUnauthorized, "M_MISSING_TOKEN", format, a...)
}
func UnknownToken(format string, a ...any) *Error {
	return New(http.StatusUnauthorized, "M_UNKNOWN_TOKEN", format, a...)
}
func Unauthorized(format string, a ...any) *Error {
	return New(http.StatusUnauthorized, "M_UNAUTHORIZED", format, a...)
}
func TooLarge(format string, a ...any) *Error {
	return New(http.StatusRequestEntityTooLarge, "M_TOO_LARGE", format, a...)
}
func UserInUse(format string, a ...any) *Error {
	return New(http.StatusBadRequest, "M_USER_IN_USE", format, a...)
}
func InvalidUsername(format string, a ...any) *Error {
	return New(http.StatusBadRequest, "M_INVALID_USERNAME", format, a...)
}
func Unknown(format string, a ...any) *Error {
	return New(http.StatusBadRequest, "M_UNKNOWN", format, a...)
}

// LimitExceeded is 429 M_LIMIT_EXCEEDED with the wait in retry_after_ms
// (the HTTP layer adds it as Retry-After too).
func LimitExceeded(wait time.Duration) *Error {
	e := New(http.StatusTooManyRequests, "M_LIMIT_EXCEEDED", "too many requests; retry in %d ms", wait.Milliseconds())
	e.Extra = map[string]any{"retry_after_ms": wait.Milliseconds()}
	return e
}
