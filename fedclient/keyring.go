package fedclient

import (
	"context"
	"crypto/ed25519"

	"github.com/matrix-org/gomatrixserverlib"
	"github.com/matrix-org/gomatrixserverlib/spec"

	"github.com/keyserver/keyserver/storage"
)

// ServerKeyStore is the part of the database that caches server keys.
type ServerKeyStore interface {
	ServerKeys(ctx context.Context, serverName string, keyIDs []string) ([]storage.ServerKey, error)
	StoreServerKeys(ctx context.Context, keys []storage.ServerKey) error
}

// NewKeyRing returns the key ring that checks other servers' signatures:
// keys come from the database while they are valid and are otherwise
// fetched from the server itself (never from a notary), then stored.
func NewKeyRing(db ServerKeyStore, c *Client, ourName string, ourKey ed25519.PublicKey) *gomatrixserverlib.KeyRing {
	return &gomatrixserverlib.KeyRing{
		KeyDatabase: keyDatabase{db},
		KeyFetchers: []gomatrixserverlib.KeyFetcher{&gomatrixserverlib.DirectKeyFetcher{
			Client:            c,
			IsLocalServerName: func(s spec.ServerName) bool { return string(s) == ourName },
			LocalPublicKey:    spec.Base64Bytes(ourKey),
		}},
	}
}

// keyDatabase adapts the store to gomatrixserverlib.KeyDatabase.
type keyDatabase struct{ db ServerKeyStore }

func (keyDatabase) FetcherName() string { return "database" }

func (k keyDatabase) FetchKeys(ctx context.Context, reqs map[gomatrixserverlib.PublicKeyLookupRequest]spec.Timestamp) (
	map[gomatrixserverlib.PublicKeyLookupRequest]gomatrixserverlib.PublicKeyLookupResult, error) {
	byServer := map[spec.ServerName][]string{}
	for r := range reqs {
		byServer[r.ServerName] = append(byServer[r.ServerName], string(r.KeyID))
	}
	out := map[gomatrixserverlib.PublicKeyLookupRequest]gomatrixserverlib.PublicKeyLookupResult{}
	for server, ids := range byServer {
		keys, err := k.db.ServerKeys(ctx, string(server), ids)
		if err != nil {
			return nil, err
		}
		for _, key := range keys {
			var pub spec.Base64Bytes
			if err := pub.Decode(key.PublicKey); err != nil {
				continue // a corrupt row is as good as none: it will be fetched again
			}
			out[gomatrixserverlib.PublicKeyLookupRequest{ServerName: server, KeyID: gomatrixserverlib.KeyID(key.KeyID)}] =
				gomatrixserverlib.PublicKeyLookupResult{
					VerifyKey:    gomatrixserverlib.VerifyKey{Key: pub},
					ValidUntilTS: spec.Timestamp(key.ValidUntilTS),
					ExpiredTS:    spec.Timestamp(key.ExpiredTS),
				}
		}
	}
	return out, nil
}

func (k keyDatabase) StoreKeys(ctx context.Context, results map[gomatrixserverlib.PublicKeyLookupRequest]gomatrixserverlib.PublicKeyLookupResult) error {
	// The ring hands back every key it used, most of them read from the
	// database a moment ago: write only what is new, so checking a request
	// costs no write.
	byServer := map[string][]storage.ServerKey{}
	for r, res := range results {
		byServer[string(r.ServerName)] = append(byServer[string(r.ServerName)], storage.ServerKey{
			ServerName: string(r.ServerName), KeyID: string(r.KeyID), PublicKey: res.Key.Encode(),
			ValidUntilTS: int64(res.ValidUntilTS), ExpiredTS: int64(res.ExpiredTS),
		})
	}
	var changed []storage.ServerKey
	for server, keys := range byServer {
		ids := make([]string, len(keys))
		for i, key := range keys {
			ids[i] = key.KeyID
		}
		stored, err := k.db.ServerKeys(ctx, server, ids)
		if err != nil {
			return err
		}
		have := map[storage.ServerKey]bool{}
		for _, s := range stored {
			have[s] = true
		}
		for _, key := range keys {
			if !have[key] {
				changed = append(changed, key)
			}
		}
	}
	return k.db.StoreServerKeys(ctx, changed)
}
