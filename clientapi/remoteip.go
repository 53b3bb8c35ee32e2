package clientapi

import (
	"context"
	"net"
	"net/http"
	"strings"

	"github.com/keyserver/keyserver/internal/iprange"
)

type clientIPKey struct{}

// clientAddress finds each request's client address once, for remoteIP.
func clientAddress(trusted iprange.Set, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ip := clientIP(r, trusted)
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), clientIPKey{}, ip)))
	})
}

// remoteIP is the client's address, for everything that records or limits
// by address (last_seen_ip, registrations, per-address limits).
func remoteIP(r *http.Request) string {
	if ip, ok := r.Context().Value(clientIPKey{}).(string); ok {
		return ip
	}
	return peerIP(r)
}

// peerIP is the address of the TCP peer.
func peerIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// clientIP is the TCP peer's address, unless the peer is a trusted proxy:
// then X-Forwarded-For is read from the right (each proxy appends the
// address it received the request from) past every trusted proxy, and the
// first address that is not one is the client. Entries further left were
// written by the client itself and prove nothing. When the header runs
// out, or holds something that is no address, the last trusted hop is the
// answer.
func clientIP(r *http.Request, trusted iprange.Set) string {
	ip := peerIP(r)
	if len(trusted) == 0 || !trusted.ContainsString(ip) {
		return ip
	}
	var hops []string
	for _, h := range r.Header.Values("X-Forwarded-For") {
		hops = append(hops, strings.Split(h, ",")...)
	}
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := iprange.ParseAddr(hops[i])
		if !ok {
			return ip
		}
		ip = a.String()
		if !trusted.Contains(a) {
			return ip
		}
	}
	return ip
}
