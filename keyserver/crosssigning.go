package keyserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sort"

	"github.com/keyserver/keyserver/crosssigning"
	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// Cross-signing: the uploads of keys and signatures. The rules live in
// package crosssigning; this file reads what they need, asks for the
// password when they say so, and stores what they allow.

// SigningKeysUpload is POST /keys/device_signing/upload.
type SigningKeysUpload struct {
	MasterKey      json.RawMessage    `json:"master_key"`
	SelfSigningKey json.RawMessage    `json:"self_signing_key"`
	UserSigningKey json.RawMessage    `json:"user_signing_key"`
	Auth           *matrixid.AuthData `json:"auth"`
}

// signingSlots are the fields of an upload with their usages.
var signingSlots = []struct{ field, usage string }{
	{"master_key", storage.UsageMaster},
	{"self_signing_key", storage.UsageSelfSigning},
	{"user_signing_key", storage.UsageUserSigning},
}

func (r SigningKeysUpload) raw(usage string) json.RawMessage {
	var raw json.RawMessage
	switch usage {
	case storage.UsageMaster:
		raw = r.MasterKey
	case storage.UsageSelfSigning:
		raw = r.SelfSigningKey
	case storage.UsageUserSigning:
		raw = r.UserSigningKey
	}
	if t := bytes.TrimSpace(raw); len(t) == 0 || string(t) == "null" {
		return nil
	}
	return raw
}

// errSigningKeysMoved says the stored keys changed between the checks and
// the write: the upload is decided again.
var errSigningKeysMoved = errors.New("cross-signing keys changed during the upload")

// UploadSigningKeys checks and stores the caller's cross-signing keys.
// Everything is checked before anything is written: the keys belong to
// the caller and fit their slots, and the self-signing and user-signing
// keys are signed by the master key sent along or else the stored one. A
// first upload needs no password, and neither does sending the stored keys
// again (which changes nothing); any other change does, through
// user-interactive auth bound to the keys sent, or started by an upload
// without keys (MSC3967's probe, answered 200 before the first master key).
func (s *Service) UploadSigningKeys(ctx context.Context, c matrixid.Caller, r SigningKeysUpload) error {
	for attempt := 0; ; attempt++ {
		err := s.uploadSigningKeysOnce(ctx, c, r)
		if errors.Is(err, errSigningKeysMoved) && attempt < 2 {
			continue
		}
		if errors.Is(err, storage.ErrNotFound) || errors.Is(err, storage.ErrDeactivated) {
			return mxerr.UnknownToken("the account of this access token no longer exists")
		}
		return err
	}
}

func (s *Service) uploadSigningKeysOnce(ctx context.Context, c matrixid.Caller, r SigningKeysUpload) error {
	sent := map[string]*crosssigning.Key{}
	for _, slot := range signingSlots {
		raw := r.raw(slot.usage)
		if raw == nil {
			continue
		}
		k, err := crosssigning.Parse(slot.field, raw, slot.usage, c.UserID)
		if err != nil {
			return err
		}
		sent[slot.usage] = k
	}
	stored, err := s.db.UserCrossSigning(ctx, c.UserID)
	if err != nil {
		return err
	}
	storedMaster := stored.Keys[storage.UsageMaster]
	if len(sent) == 0 {
		// An upload without keys is how clients learn whether setting
		// up cross-signing needs user-interactive auth (MSC3967). Before
		// the first master key it does not: 200, nothing changes. Once
		// there is one it does: the challenge, whose session then
		// completes any change of keys.
		if storedMaster == nil {
			return nil
		}
		return s.confirmPassword(ctx, c, signingKeysProbe(c.UserID), r.Auth)
	}
	master := sent[storage.UsageMaster]
	if master == nil {
		master = crosssigning.ParseStored(storedMaster, storage.UsageMaster)
	}
	for _, slot := range signingSlots[1:] {
		k := sent[slot.usage]
		if k == nil {
			continue
		}
		if master == nil {
			return mxerr.MissingParam("%s needs a master key: send master_key too", slot.field)
		}
		if err := crosssigning.CheckSignedByMaster(slot.field, k, master); err != nil {
			return err
		}
	}
	// A key's ID is its public key, and clients look both devices and
	// cross-signing keys up by ID: one may not shadow the other.
	devices, err := s.db.Devices(ctx, c.UserID)
	if err != nil {
		return err
	}
	for _, d := range devices {
		for _, slot := range signingSlots {
			if k := sent[slot.usage]; k != nil && k.PublicKey == d.DeviceID {
				return mxerr.Forbidden("%s's public key is the ID of one of your devices", slot.field)
			}
		}
	}

	same := true
	for usage, k := range sent {
		same = same && bytes.Equal(stored.Keys[usage], k.Canonical)
	}
	if same {
		return nil // the stored keys again: nothing to do, nothing to ask
	}
	if storedMaster != nil {
		// Replacing keys is what an attacker holding only an access token
		// would do: the password is asked for.
		params := map[string]string{}
		for usage, k := range sent {
			params[usage] = string(k.Canonical)
		}
		probe := signingKeysProbe(c.UserID)
		req := matrixid.AuthRequest{UserID: c.UserID, Method: http.MethodPost, Path: "/keys/device_signing/upload", Params: params,
			AlsoFrom: &probe}
		if err := s.confirmPassword(ctx, c, req, r.Auth); err != nil {
			return err
		}
	}
	ch, err := s.db.UploadCrossSigningKeys(ctx, c.UserID, func(now map[string][]byte) (storage.CrossSigningWrite, error) {
		// Decided against the master key read above: if another upload
		// replaced it meanwhile, the decision (and the need for a
		// password) is made again.
		if !bytes.Equal(now[storage.UsageMaster], storedMaster) {
			return storage.CrossSigningWrite{}, errSigningKeysMoved
		}
		w := storage.CrossSigningWrite{Keys: map[string][]byte{}}
		for usage, k := range sent {
			w.Keys[usage] = k.Canonical
		}
		return w, nil
	})
	if err != nil {
		return err
	}
	// A change of the master or self-signing key is queued for the
	// servers sharing a room with the user.
	s.localChange(ch)
	return nil
}

// signingKeysProbe is an upload of cross-signing keys without keys: its
// session may complete the change of keys that follows.
func signingKeysProbe(userID string) matrixid.AuthRequest {
	return matrixid.AuthRequest{UserID: userID, Method: http.MethodPost, Path: "/keys/device_signing/upload", Params: "no keys sent"}
}

// SignaturesUploadResponse is the answer to POST /keys/signatures/upload.
type SignaturesUploadResponse struct {
	Failures map[string]map[string]SignatureFailure `json:"failures"`
}

// SignatureFailure is why one signed object of an upload was rejected.
type SignatureFailure struct {
	Errcode string `json:"errcode"`
	Error   string `json:"error"`
}

// UploadSignatures checks each signed object of the upload on its own
// (user ID -> key ID -> object, the key ID a device ID or a master key's
// public key) and stores the signatures of those that pass, even when
// others fail; each failure is reported under its user and key ID. Users
// of other servers are signed through their master key as cached here;
// such a signature stays here, shown to its signer only.
func (s *Service) UploadSignatures(ctx context.Context, c matrixid.Caller, body map[string]map[string]json.RawMessage) (SignaturesUploadResponse, error) {
	res := SignaturesUploadResponse{Failures: map[string]map[string]SignatureFailure{}}
	fail := func(user, keyID string, err error) error {
		var me *mxerr.Error
		if !errors.As(err, &me) {
			return err
		}
		if res.Failures[user] == nil {
			res.Failures[user] = map[string]SignatureFailure{}
		}
		res.Failures[user][keyID] = SignatureFailure{Errcode: me.Code, Error: me.Message}
		return nil
	}
	users := make([]string, 0, len(body))
	for u := range body {
		users = append(users, u)
	}
	sort.Strings(users)
	var local []string
	for _, u := range users {
		if server, ok := matrixid.ParseUserID(u); ok && s.isLocal(server) {
			local = append(local, u)
		}
	}
	local = append(local, c.UserID)
	// The stored keys of everyone named and of the caller, in one read.
	keys, err := s.db.UserKeys(ctx, local)
	if err != nil {
		return res, err
	}
	// The caller's own cross-signing keys are read from the database: a
	// signature is only as good as the key it is checked with.
	mine, err := s.db.UserCrossSigning(ctx, c.UserID)
	if err != nil {
		return res, err
	}
	signer := crosssigning.Signer{
		UserID:      c.UserID,
		SelfSigning: crosssigning.ParseStored(mine.Keys[storage.UsageSelfSigning], storage.UsageSelfSigning),
		UserSigning: crosssigning.ParseStored(mine.Keys[storage.UsageUserSigning], storage.UsageUserSigning),
		DeviceKeys:  map[string]string{},
	}
	if k := keys[c.UserID]; k != nil {
		for _, d := range k.Devices {
			if ed, _, err := storedIdentityKeys(d.KeyJSON); err == nil {
				signer.DeviceKeys[d.DeviceID] = ed
			}
		}
	}
	// Other servers' users can be signed (their master key, with the
	// caller's user-signing key) as cached with their device list, which a
	// client has fetched before it signs.
	var remote []string
	for _, u := range users {
		if server, ok := matrixid.ParseUserID(u); ok && !s.isLocal(server) {
			remote = append(remote, u)
		}
	}
	remoteLists, err := s.db.RemoteDeviceLists(ctx, remote)
	if err != nil {
		return res, err
	}
	var good []storage.CrossSigningSignature
	for _, u := range users {
		objs := body[u]
		ids := make([]string, 0, len(objs))
		for id := range objs {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		server, valid := matrixid.ParseUserID(u)
		for _, id := range ids {
			var t crosssigning.Target
			found := false
			switch {
			case !valid:
			case s.isLocal(server):
				t, found = target(keys[u], u, id)
			default:
				t, found = remoteTarget(remoteLists[u], u, id)
			}
			if !found {
				if err := fail(u, id, mxerr.NotFound("%s has no device or master key %s", u, id)); err != nil {
					return res, err
				}
				continue
			}
			sigs, err := crosssigning.CheckUpload(signer, t, objs[id])
			if err != nil {
				if err := fail(u, id, err); err != nil {
					return res, err
				}
				continue
			}
			good = append(good, sigs...)
		}
	}
	ch, err := s.db.StoreSignatures(ctx, good)
	if err != nil {
		return res, err
	}
	s.localChange(ch)
	return res, nil
}

// remoteTarget finds the cached master key of a remote user keyID names.
func remoteTarget(l *storage.RemoteDeviceList, userID, keyID string) (crosssigning.Target, bool) {
	if l == nil {
		return crosssigning.Target{}, false
	}
	if m := l.CrossSigning[storage.UsageMaster]; m != nil && crosssigning.PublicKeyOf(m) == keyID {
		return crosssigning.Target{UserID: userID, KeyID: keyID, Master: true, Stored: m}, true
	}
	for _, d := range l.Devices {
		if d.DeviceID == keyID {
			return crosssigning.Target{UserID: userID, KeyID: keyID, Stored: d.KeyJSON}, true
		}
	}
	return crosssigning.Target{}, false
}

// target finds the stored object keyID names among a user's keys: their
// master key or one of their devices.
func target(k *storage.UserKeys, userID, keyID string) (crosssigning.Target, bool) {
	if k == nil {
		return crosssigning.Target{}, false
	}
	if m := k.Keys[storage.UsageMaster]; m != nil && crosssigning.PublicKeyOf(m) == keyID {
		return crosssigning.Target{UserID: userID, KeyID: keyID, Master: true, Stored: m}, true
	}
	for _, d := range k.Devices {
		if d.DeviceID == keyID {
			return crosssigning.Target{UserID: userID, KeyID: keyID, Stored: d.KeyJSON}, true
		}
	}
	return crosssigning.Target{}, false
}
