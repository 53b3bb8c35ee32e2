package keyserver

import (
	"context"
	"encoding/json"

	"github.com/keyserver/keyserver/crosssigning"
	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// What other servers may ask of us. Only our own users are answered;
// others are ignored, as the spec has it.

// FederationQueryResponse is the answer of POST /user/keys/query.
type FederationQueryResponse struct {
	DeviceKeys      map[string]map[string]json.RawMessage `json:"device_keys"`
	MasterKeys      map[string]json.RawMessage            `json:"master_keys"`
	SelfSigningKeys map[string]json.RawMessage            `json:"self_signing_keys"`
}

// FederationQueryKeys answers another server's key query.
func (s *Service) FederationQueryKeys(ctx context.Context, users map[string][]string) (FederationQueryResponse, error) {
	if users == nil {
		return FederationQueryResponse{}, mxerr.BadJSON("device_keys is required")
	}
	local := map[string][]string{}
	for u, devices := range users {
		if server, ok := matrixid.ParseUserID(u); ok && s.isLocal(server) {
			local[u] = devices
		}
	}
	// Another server sees only public signatures, and never a
	// user-signing key.
	keys, err := s.localKeys(ctx, local, "", s.opts.DeviceNamesOverFederation)
	if err != nil {
		return FederationQueryResponse{}, err
	}
	return FederationQueryResponse{DeviceKeys: keys.DeviceKeys, MasterKeys: keys.MasterKeys, SelfSigningKeys: keys.SelfSigningKeys}, nil
}

// FederationClaimKeys answers another server's claim, with the same
// exactly-once rule as local claims.
func (s *Service) FederationClaimKeys(ctx context.Context, req map[string]map[string]string) (fedclient.ClaimKeysResponse, error) {
	out := fedclient.ClaimKeysResponse{OneTimeKeys: map[string]map[string]map[string]json.RawMessage{}}
	if req == nil {
		return out, mxerr.BadJSON("one_time_keys is required")
	}
	var reqs []storage.ClaimRequest
	for u, devices := range req {
		if server, ok := matrixid.ParseUserID(u); !ok || !s.isLocal(server) {
			continue
		}
		for deviceID, alg := range devices {
			if alg != "" {
				reqs = append(reqs, storage.ClaimRequest{UserID: u, DeviceID: deviceID, Algorithm: alg})
			}
		}
	}
	claimed, err := s.claimLocal(ctx, reqs)
	if err != nil {
		return out, err
	}
	for _, k := range claimed {
		if out.OneTimeKeys[k.UserID] == nil {
			out.OneTimeKeys[k.UserID] = map[string]map[string]json.RawMessage{}
		}
		out.OneTimeKeys[k.UserID][k.DeviceID] = map[string]json.RawMessage{k.Key.FullID(): k.Key.JSON}
	}
	return out, nil
}

// FederationUserDevices answers GET /user/devices/{userId}: the user's
// devices that have keys, and the stream_id that later device-list updates
// continue from.
func (s *Service) FederationUserDevices(ctx context.Context, userID string) (fedclient.UserDevices, error) {
	server, ok := matrixid.ParseUserID(userID)
	if !ok {
		return fedclient.UserDevices{}, mxerr.InvalidParam("%q is not a valid user ID", userID)
	}
	if !s.isLocal(server) {
		return fedclient.UserDevices{}, mxerr.InvalidParam("%s is not a user of this server", userID)
	}
	exists, err := s.db.AccountExists(ctx, userID)
	if err != nil {
		return fedclient.UserDevices{}, err
	}
	if !exists {
		return fedclient.UserDevices{}, mxerr.NotFound("no such user")
	}
	streamID, devices, err := s.db.UserDeviceList(ctx, userID)
	if err != nil {
		return fedclient.UserDevices{}, err
	}
	cs, err := s.db.UserCrossSigning(ctx, userID)
	if err != nil {
		return fedclient.UserDevices{}, err
	}
	// Only public signatures: those the user made.
	sigs := crosssigning.ByTarget(cs.Signatures, userID, "")
	out := fedclient.UserDevices{UserID: userID, StreamID: streamID, Devices: []fedclient.UserDevice{}}
	for _, d := range devices {
		ud := fedclient.UserDevice{DeviceID: d.DeviceID}
		if s.opts.DeviceNamesOverFederation {
			ud.DisplayName = d.DisplayName
		}
		// The keys are the same object /user/keys/query answers, "unsigned"
		// and signatures included.
		js, err := crosssigning.WithSignatures(d.KeyJSON, sigs[d.DeviceID])
		if err != nil {
			return fedclient.UserDevices{}, err
		}
		if ud.Keys, err = withUnsigned(js, ud.DisplayName); err != nil {
			return fedclient.UserDevices{}, err
		}
		out.Devices = append(out.Devices, ud)
	}
	if m := cs.Keys[storage.UsageMaster]; m != nil {
		if out.MasterKey, err = crosssigning.WithSignatures(m, sigs[crosssigning.PublicKeyOf(m)]); err != nil {
			return fedclient.UserDevices{}, err
		}
	}
	if ssk := cs.Keys[storage.UsageSelfSigning]; ssk != nil {
		out.SelfSigningKey = ssk
	}
	return out, nil
}
