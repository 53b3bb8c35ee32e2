package pusher

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/internal/iprange"
)

// Gateways are reached only where the federation's address policy
// allows: loopback is denied by default, allowed when listed.
func TestGatewayAddressPolicy(t *testing.T) {
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{}`)) }))
	defer gw.Close()
	denied := gatewayClient(fedclient.DefaultAddressPolicy(), 5*time.Second)
	if _, err := denied.Post(gw.URL+NotifyPath, "application/json", nil); !errors.Is(err, fedclient.ErrDeniedAddress) {
		t.Fatalf("loopback gateway with the default policy: %v", err)
	}
	allowed := &fedclient.AddressPolicy{Deny: iprange.MustParse(iprange.NonPublic), Allow: iprange.MustParse([]string{"127.0.0.0/8"})}
	if !allowed.Allowed(netip.MustParseAddr("127.0.0.1")) {
		t.Fatal("allowlist not applied")
	}
	resp, err := gatewayClient(allowed, 5*time.Second).Post(gw.URL+NotifyPath, "application/json", nil)
	if err != nil {
		t.Fatalf("allowed loopback gateway: %v", err)
	}
	resp.Body.Close()
}
