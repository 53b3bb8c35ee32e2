package keyserver

import (
	"context"
	"encoding/json"
	"errors"
	"sort"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/crosssigning"
	"github.com/keyserver/keyserver/fedclient"
	"github.com/keyserver/keyserver/storage"
)

// Federation is what the keyserver asks of other servers.
type Federation interface {
	ClaimKeys(ctx context.Context, server string, req map[string]map[string]string) (fedclient.ClaimKeysResponse, error)
}

// RemoteLists gives the device lists of other servers' users (package
// devicelist): from its cache when it can be trusted, otherwise fetched
// and cached; with a cached copy and the error when a fetch fails.
type RemoteLists interface {
	Lists(ctx context.Context, server string, userIDs []string) (map[string]*storage.RemoteDeviceList, error)
}

// remoteDeviceLists returns the device lists of users of one server.
func (s *Service) remoteDeviceLists(ctx context.Context, server string, userIDs []string) (map[string]*storage.RemoteDeviceList, error) {
	if s.opts.RemoteLists == nil {
		return nil, errNoFederation
	}
	return s.opts.RemoteLists.Lists(ctx, server, userIDs)
}

const (
	defaultRemoteTimeout = 10 * time.Second
	maxRemoteTimeout     = time.Minute
)

// failure is how a server's failure is reported to clients: a status and
// a fixed message, never the error's own text, which may name addresses
// and ports; that goes to the log.
func (s *Service) failure(ctx context.Context, server string, err error) map[string]any {
	s.logger(ctx).WithFields(logrus.Fields{"server": server, "error": err.Error()}).Debug("remote server failed")
	return map[string]any{"status": fedclient.Status(err), "message": fedclient.PublicMessage(err)}
}

var errNoFederation = errors.New("federation is not configured")

// serverResult is one server's part of a fan-out, merged by the caller
// alone so that no map is written by two goroutines.
type serverResult struct {
	server string
	lists  map[string]*storage.RemoteDeviceList
	err    error
}

// queryRemote fills res with the device keys of remote users, asking all
// their servers at once, and their master and self-signing keys; a master
// key carries the signature viewer made on it, if any.
func (s *Service) queryRemote(ctx context.Context, remote map[string]map[string][]string, viewer string, res *QueryResponse) {
	results := make(chan serverResult, len(remote))
	for server, users := range remote {
		ids := make([]string, 0, len(users))
		for u := range users {
			ids = append(ids, u)
		}
		go func() {
			lists, err := s.remoteDeviceLists(ctx, server, ids)
			results <- serverResult{server: server, lists: lists, err: err}
		}()
	}
	for range remote {
		r := <-results
		if r.err != nil {
			res.Failures[r.server] = s.failure(ctx, r.server, r.err)
		}
		for userID, l := range r.lists {
			want := remote[r.server][userID]
			keys := map[string]json.RawMessage{}
			for _, d := range l.Devices {
				if len(want) > 0 && !contains(want, d.DeviceID) {
					continue
				}
				js, err := withUnsigned(d.KeyJSON, d.DisplayName)
				if err != nil {
					continue // stored canonical JSON always parses
				}
				keys[d.DeviceID] = js
			}
			res.DeviceKeys[userID] = keys
			if m := l.CrossSigning[storage.UsageMaster]; m != nil {
				sigs := crosssigning.ByTarget(l.Signatures, userID, viewer)[crosssigning.PublicKeyOf(m)]
				if js, err := crosssigning.WithSignatures(m, sigs); err == nil {
					res.MasterKeys[userID] = js
				}
			}
			if ssk := l.CrossSigning[storage.UsageSelfSigning]; ssk != nil {
				res.SelfSigningKeys[userID] = ssk
			}
		}
	}
}

// claimRemote claims keys of remote devices, one batched request per
// server, all servers at once, and passes on what verifiedClaims keeps.
func (s *Service) claimRemote(ctx context.Context, remote map[string]map[string]map[string]string, res *ClaimResponse) {
	type claimed struct {
		server string
		keys   map[string]map[string]map[string]json.RawMessage
		err    error
	}
	results := make(chan claimed, len(remote))
	for server, req := range remote {
		go func() {
			if s.fed == nil {
				results <- claimed{server: server, err: errNoFederation}
				return
			}
			resp, err := s.fed.ClaimKeys(ctx, server, req)
			if err != nil {
				results <- claimed{server: server, err: err}
				return
			}
			results <- claimed{server: server, keys: s.verifiedClaims(ctx, server, req, resp.OneTimeKeys)}
		}()
	}
	for range remote {
		r := <-results
		if r.err != nil {
			res.Failures[r.server] = s.failure(ctx, r.server, r.err)
			continue
		}
		for userID, devices := range r.keys {
			res.OneTimeKeys[userID] = devices
		}
	}
}

// verifiedClaims keeps, for every device the server was asked about, one
// claimed key of the algorithm asked for. The server has already spent the
// keys, so only a key known to be bad is dropped (and logged): a
// signed_curve25519 key that is malformed or not signed by its device's
// ed25519 key. Keys this server cannot check are passed on unchanged, for
// the client to judge: other algorithms (a plain "curve25519" string, an
// algorithm this server does not know), and keys of a device whose keys
// are not known here (its list could not be fetched, or does not hold it,
// or its ed25519 key is a placeholder rather than a key).
func (s *Service) verifiedClaims(ctx context.Context, server string, req map[string]map[string]string,
	got map[string]map[string]map[string]json.RawMessage) map[string]map[string]map[string]json.RawMessage {
	var users []string // those with a key whose signature can be checked
	for userID, devices := range got {
		for deviceID := range devices {
			if req[userID][deviceID] == "signed_curve25519" {
				users = append(users, userID)
				break
			}
		}
	}
	sort.Strings(users)
	var lists map[string]*storage.RemoteDeviceList
	if len(users) > 0 {
		var err error
		if lists, err = s.remoteDeviceLists(ctx, server, users); err != nil {
			s.logger(ctx).WithFields(logrus.Fields{"server": server, "error": err.Error()}).
				Info("some claimed keys are passed on unchecked: their devices' keys are unknown")
		}
	}
	out := map[string]map[string]map[string]json.RawMessage{}
	for userID, devices := range got {
		identity := map[string]string{}
		if l := lists[userID]; l != nil {
			for _, d := range l.Devices {
				// A placeholder (a value that is not a key: other servers'
				// keys are kept as sent) checks nothing: as unknown.
				if ed, _, err := storedIdentityKeys(d.KeyJSON); err == nil && isKeyValue(ed) {
					identity[d.DeviceID] = ed
				}
			}
		}
		for deviceID, keys := range devices {
			alg, asked := req[userID][deviceID]
			if !asked {
				continue
			}
			names := make([]string, 0, len(keys))
			for name := range keys {
				names = append(names, name)
			}
			sort.Strings(names)
			for _, name := range names {
				key := keys[name]
				if a, _, err := parseKeyName(name); err != nil || a != alg {
					continue // not what was asked for
				}
				if alg == "signed_curve25519" && identity[deviceID] != "" {
					if _, err := checkOneTimeKey("one_time_keys", name, key, userID, deviceID, newIdentityKey(identity[deviceID])); err != nil {
						s.logger(ctx).WithFields(logrus.Fields{"server": server, "user_id": userID, "device_id": deviceID, "key": name, "error": err.Error()}).
							Warn("dropped a claimed key without a valid device signature")
						continue
					}
				}
				if out[userID] == nil {
					out[userID] = map[string]map[string]json.RawMessage{}
				}
				out[userID][deviceID] = map[string]json.RawMessage{name: key}
				break
			}
		}
	}
	return out
}

// isKeyValue reports whether s is a 32-byte key in base64.
func isKeyValue(s string) bool {
	b, err := decodeBase64(s)
	return err == nil && len(b) == 32
}
