package federationapi

import (
	"context"
	"encoding/json"

	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/keyserver"
)

// Keys is what the federation API asks of the keys domain (package
// keyserver): other servers' key queries and claims, and device lists.
type Keys interface {
	FederationQueryKeys(ctx context.Context, users map[string][]string) (keyserver.FederationQueryResponse, error)
	FederationClaimKeys(ctx context.Context, req map[string]map[string]string) (fedclient.ClaimKeysResponse, error)
	FederationUserDevices(ctx context.Context, userID string) (fedclient.UserDevices, error)
}

// Transactions processes the transactions other servers send (package
// fedrouter, which routes them to the domains).
type Transactions interface {
	HandleTransaction(ctx context.Context, origin, txnID string, body []byte) (json.RawMessage, error)
}
