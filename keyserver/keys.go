package keyserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"sort"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/keyserver/keyserver/crosssigning"
	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/internal/metrics"
	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// UploadRequest is POST /keys/upload, with its maps kept raw so the keys
// can be checked one by one and stored in the order they were sent.
type UploadRequest struct {
	DeviceKeys   json.RawMessage `json:"device_keys"`
	OneTimeKeys  json.RawMessage `json:"one_time_keys"`
	FallbackKeys json.RawMessage `json:"fallback_keys"`
}

// UnmarshalJSON reads the three members in one walk of the object, where
// encoding/json would walk it a second time after checking it. Anything
// the walk cannot be sure of reading as the decoder does (member names
// with escapes or outside ASCII, names matching a field only by case
// folding) is decoded as before.
func (r *UploadRequest) UnmarshalJSON(data []byte) error {
	if r.walk(data) {
		return nil
	}
	type decoded UploadRequest // without this method
	return json.Unmarshal(data, (*decoded)(r))
}

func (r *UploadRequest) walk(data []byte) bool {
	if !gjson.ValidBytes(data) {
		return false
	}
	obj := gjson.ParseBytes(data)
	if !obj.IsObject() {
		return false
	}
	var out UploadRequest
	ok := true
	obj.ForEach(func(k, v gjson.Result) bool {
		if !plainString(k) {
			ok = false
			return false
		}
		var field *json.RawMessage
		switch k.Str {
		case "device_keys":
			field = &out.DeviceKeys
		case "one_time_keys":
			field = &out.OneTimeKeys
		case "fallback_keys":
			field = &out.FallbackKeys
		default:
			if strings.EqualFold(k.Str, "device_keys") || strings.EqualFold(k.Str, "one_time_keys") ||
				strings.EqualFold(k.Str, "fallback_keys") {
				ok = false
				return false
			}
			return true
		}
		*field = json.RawMessage(v.Raw) // a copy: the last of repeated members, as decoded
		return true
	})
	if ok {
		*r = out
	}
	return ok
}

// UploadResponse is the answer to /keys/upload.
type UploadResponse struct {
	OneTimeKeyCounts map[string]int `json:"one_time_key_counts"`
}

type keyUpload struct {
	member
	alg, id string
}

// parsedUpload is an upload as far as it can be checked without the
// device's stored keys: device keys parsed and matching the caller, key
// names well formed, one fallback key per algorithm.
type parsedUpload struct {
	dk              *DeviceKeys // nil when the upload has none
	otks, fallbacks []keyUpload
	ids             []string // the names of otks
}

// UploadKeys checks and stores a device's keys. Everything is checked
// before anything is written, and what is written is written in one
// transaction: a request with one bad key stores nothing. By default
// (strict) device keys must be signed by the device, ed25519 and
// curve25519 values well formed, and signed one-time and fallback keys
// signed by the device; with Options.LaxKeyValidation only the shapes are
// checked (see docs/operator.md).
func (s *Service) UploadKeys(ctx context.Context, c matrixid.Caller, r UploadRequest) (UploadResponse, error) {
	p, err := s.parseUpload(c, r)
	if err != nil {
		return UploadResponse{}, err
	}
	// Signatures are checked before the write transaction, against the
	// device keys read just before it; the transaction then only confirms
	// those keys are still the stored ones (retrying if a concurrent upload
	// changed them), so the expensive part never holds the writer.
	for attempt := 0; ; attempt++ {
		res, err := s.uploadOnce(ctx, c, attempt, p)
		if errors.Is(err, errDeviceKeysMoved) && attempt < 3 {
			continue
		}
		if errors.Is(err, storage.ErrNotFound) {
			return UploadResponse{}, mxerr.UnknownToken("the device of this access token no longer exists")
		}
		if err != nil {
			return UploadResponse{}, err
		}
		s.localChange(res.Change)
		metrics.OneTimeKeysUploaded.Add(float64(res.Stored))
		return UploadResponse{OneTimeKeyCounts: withSignedCurve(res.Counts)}, nil
	}
}

// CheckNewDeviceUpload runs the checks of UploadKeys on an upload for a
// device of the caller that has no keys stored (one about to be made),
// reading and writing nothing: an upload it accepts, UploadKeys accepts
// for that device once it exists, and one it refuses is refused with the
// same error. Unlike /keys/upload, device keys are required. It lets a
// caller refuse bad keys before it makes the device.
func (s *Service) CheckNewDeviceUpload(ctx context.Context, c matrixid.Caller, r UploadRequest) error {
	p, err := s.parseUpload(c, r)
	if err != nil {
		return err
	}
	if p.dk == nil {
		return mxerr.MissingParam("device_keys is required")
	}
	otks, fallbacks, err := s.checkSignedKeys(c, p.dk.Ed25519(), p)
	if err != nil {
		return err
	}
	// A device without stored keys: no key stored before, none counted.
	_, err = s.planKeyWrite(storage.KeyState{}, nil, p.dk, otks, fallbacks)
	return err
}

// parseUpload makes the checks of an upload that need no stored state.
func (s *Service) parseUpload(c matrixid.Caller, r UploadRequest) (parsedUpload, error) {
	strict := !s.opts.LaxKeyValidation
	var p parsedUpload
	if t := bytes.TrimSpace(r.DeviceKeys); len(t) > 0 && string(t) != "null" {
		dk, err := parseDeviceKeys(r.DeviceKeys, strict)
		if err != nil {
			return p, err
		}
		if dk.UserID != c.UserID {
			return p, mxerr.InvalidParam("device_keys.user_id %q is not the caller %q", dk.UserID, c.UserID)
		}
		if dk.DeviceID != c.DeviceID {
			return p, mxerr.InvalidParam("device_keys.device_id %q is not the caller's device %q", dk.DeviceID, c.DeviceID)
		}
		if strict {
			if err := dk.VerifySelfSignature(); err != nil {
				return p, err
			}
		}
		p.dk = dk
	}
	var err error
	if p.otks, err = splitKeys("one_time_keys", r.OneTimeKeys); err != nil {
		return p, err
	}
	if p.fallbacks, err = splitKeys("fallback_keys", r.FallbackKeys); err != nil {
		return p, err
	}
	seenAlg := map[string]bool{}
	for _, f := range p.fallbacks {
		if seenAlg[f.alg] {
			return p, mxerr.InvalidParam("fallback_keys may hold one key per algorithm; %s has more", f.alg)
		}
		seenAlg[f.alg] = true
	}
	p.ids = make([]string, 0, len(p.otks))
	for _, k := range p.otks {
		p.ids = append(p.ids, k.Name)
	}
	return p, nil
}

// errDeviceKeysMoved says the device's keys changed between the checks
// and the write: the upload is checked again.
var errDeviceKeysMoved = errors.New("device keys changed during the upload")

type checkedKey struct {
	keyUpload
	json []byte
}

// storedDeviceKeys returns the device's stored identity keys (nil when it
// has none yet), or storage.ErrNotFound when the device is gone. The first
// attempt reads them from the device cache the queries share; should that
// copy be stale, the write transaction notices (errDeviceKeysMoved) and the
// retry reads the database.
func (s *Service) storedDeviceKeys(ctx context.Context, c matrixid.Caller, attempt int) ([]byte, error) {
	if attempt == 0 {
		devs, err := s.db.DevicesWithKeys(ctx, []string{c.UserID})
		if err != nil {
			return nil, err
		}
		for _, d := range devs {
			if d.DeviceID == c.DeviceID {
				return d.KeyJSON, nil
			}
		}
	}
	dev, err := s.db.Device(ctx, c.UserID, c.DeviceID)
	return dev.KeyJSON, err
}

func (s *Service) uploadOnce(ctx context.Context, c matrixid.Caller, attempt int, p parsedUpload) (storage.UploadResult, error) {
	storedKeys, err := s.storedDeviceKeys(ctx, c, attempt)
	if err != nil {
		return storage.UploadResult{}, err
	}
	// The checks below use the stored keys. On the first attempt those come
	// from the cache, which may not have heard of a change another daemon
	// made yet: a check that fails then is repeated against the database
	// before the client is told.
	rejected := func(err error) error {
		var mx *mxerr.Error
		if attempt == 0 && errors.As(err, &mx) {
			return errDeviceKeysMoved
		}
		return err
	}
	dk := p.dk
	ed25519Key := ""
	if storedKeys != nil {
		var curveKey string
		if ed25519Key, curveKey, err = storedIdentityKeys(storedKeys); err != nil {
			return storage.UploadResult{}, err
		}
		// Lax validation takes new identity keys like any other change.
		if dk != nil && !s.opts.LaxKeyValidation && (dk.Ed25519() != ed25519Key || dk.Curve25519() != curveKey) {
			return storage.UploadResult{}, rejected(mxerr.InvalidParam("device %s already has different identity keys; a device's identity keys cannot change", c.DeviceID))
		}
	}
	if dk != nil {
		ed25519Key = dk.Ed25519()
	}
	checkedOTKs, checkedFallbacks, err := s.checkSignedKeys(c, ed25519Key, p)
	if err != nil {
		return storage.UploadResult{}, rejected(err)
	}
	decide := func(st storage.KeyState) (storage.KeyWrite, error) {
		return s.planKeyWrite(st, storedKeys, dk, checkedOTKs, checkedFallbacks)
	}
	return s.db.UploadKeys(ctx, c.UserID, c.DeviceID, p.ids, decide)
}

// checkSignedKeys checks an upload's one-time and fallback keys: signed by
// the device's ed25519 key ("" when it has none) when strict, their shape
// only when lax. It returns them with the JSON to store.
func (s *Service) checkSignedKeys(c matrixid.Caller, ed25519Key string, p parsedUpload) (otks, fallbacks []checkedKey, err error) {
	identity := newIdentityKey(ed25519Key)
	check := func(field string, keys []keyUpload) ([]checkedKey, error) {
		out := make([]checkedKey, 0, len(keys))
		for _, k := range keys {
			var js []byte
			var err error
			if s.opts.LaxKeyValidation {
				js, err = checkOneTimeKeyShape(field, k.Name, k.Value)
			} else {
				js, err = checkOneTimeKey(field, k.Name, k.Value, c.UserID, c.DeviceID, identity)
			}
			if err != nil {
				return nil, err
			}
			out = append(out, checkedKey{k, js})
		}
		return out, nil
	}
	if otks, err = check("one_time_keys", p.otks); err != nil {
		return nil, nil, err
	}
	if fallbacks, err = check("fallback_keys", p.fallbacks); err != nil {
		return nil, nil, err
	}
	return otks, fallbacks, nil
}

// planKeyWrite decides what an upload writes given the device's state in
// the store (st), storedKeys being the device keys the checks were made
// against: one-time keys not stored yet (an identical one is skipped, a
// different one with the same ID refused), within the per-device cap, and
// fallback keys that changed.
func (s *Service) planKeyWrite(st storage.KeyState, storedKeys []byte, dk *DeviceKeys, checkedOTKs, checkedFallbacks []checkedKey) (storage.KeyWrite, error) {
	var w storage.KeyWrite
	if !bytes.Equal(st.DeviceKeys, storedKeys) {
		return w, errDeviceKeysMoved
	}
	if dk != nil {
		w.DeviceKeys = dk.Canonical // the store skips the write when equal
	}
	inRequest := map[string][]byte{}
	total := 0
	for _, n := range st.Counts {
		total += n
	}
	for _, k := range checkedOTKs {
		if old, ok := st.ExistingOneTimeKeys[k.Name]; ok {
			if !bytes.Equal(old, k.json) {
				return w, mxerr.InvalidParam("one-time key %s already exists with other content", k.Name)
			}
			continue // identical re-upload: already stored
		}
		if old, ok := inRequest[k.Name]; ok {
			if !bytes.Equal(old, k.json) {
				return w, mxerr.InvalidParam("one-time key %s is listed twice with other content", k.Name)
			}
			continue
		}
		inRequest[k.Name] = k.json
		w.OneTimeKeys = append(w.OneTimeKeys, storage.Key{Algorithm: k.alg, KeyID: k.id, JSON: k.json})
	}
	if total+len(w.OneTimeKeys) > s.opts.MaxOneTimeKeys {
		return w, mxerr.InvalidParam("a device may hold at most %d unclaimed one-time keys; it has %d and the upload adds %d",
			s.opts.MaxOneTimeKeys, total, len(w.OneTimeKeys))
	}
	for _, k := range checkedFallbacks {
		if old, ok := st.Fallback[k.alg]; ok && old.KeyID == k.id && bytes.Equal(old.JSON, k.json) {
			continue // the same key again keeps its used flag
		}
		w.FallbackKeys = append(w.FallbackKeys, storage.Key{Algorithm: k.alg, KeyID: k.id, JSON: k.json})
	}
	return w, nil
}

func splitKeys(field string, raw json.RawMessage) ([]keyUpload, error) {
	members, err := orderedObject(field, raw)
	if err != nil {
		return nil, err
	}
	out := make([]keyUpload, 0, len(members))
	for _, m := range members {
		alg, id, err := parseKeyName(m.Name)
		if err != nil {
			return nil, err
		}
		out = append(out, keyUpload{member: m, alg: alg, id: id})
	}
	return out, nil
}

// withSignedCurve makes sure signed_curve25519 is always reported, 0 when
// the device has none: clients read a missing count as "unknown".
func withSignedCurve(counts map[string]int) map[string]int {
	if counts == nil {
		counts = map[string]int{}
	}
	if _, ok := counts["signed_curve25519"]; !ok {
		counts["signed_curve25519"] = 0
	}
	return counts
}

// QueryRequest is POST /keys/query.
type QueryRequest struct {
	DeviceKeys map[string][]string `json:"device_keys"`
	Timeout    Timeout             `json:"timeout"`
}

// QueryResponse is the answer to /keys/query.
type QueryResponse struct {
	DeviceKeys      map[string]map[string]json.RawMessage `json:"device_keys"`
	Failures        map[string]any                        `json:"failures"`
	MasterKeys      map[string]json.RawMessage            `json:"master_keys"`
	SelfSigningKeys map[string]json.RawMessage            `json:"self_signing_keys"`
	UserSigningKeys map[string]json.RawMessage            `json:"user_signing_keys"`
}

// AppendJSON encodes the response without re-validating the key objects
// (canonical JSON this server wrote, or JSON a remote server's answer was
// decoded from), which json.Marshal would spend most of a query's time on.
func (r QueryResponse) AppendJSON(b []byte) ([]byte, error) {
	b = append(b, `{"device_keys":`...)
	if r.DeviceKeys == nil {
		b = append(b, "null"...)
	} else {
		b = appendDeviceKeys(b, r.DeviceKeys)
	}
	b = append(b, `,"failures":`...)
	failures, err := json.Marshal(r.Failures)
	if err != nil {
		return nil, err
	}
	b = append(b, failures...)
	b = append(b, `,"master_keys":`...)
	b = appendRawObject(b, r.MasterKeys)
	b = append(b, `,"self_signing_keys":`...)
	b = appendRawObject(b, r.SelfSigningKeys)
	b = append(b, `,"user_signing_keys":`...)
	b = appendRawObject(b, r.UserSigningKeys)
	return append(b, '}'), nil
}

// appendDeviceKeys appends the device keys by user (a user without
// devices as {}).
func appendDeviceKeys(b []byte, byUser map[string]map[string]json.RawMessage) []byte {
	b = append(b, '{')
	for i, u := range sortedKeys(byUser) {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, u)
		b = append(b, ':')
		if devices := byUser[u]; devices != nil {
			b = appendRawObject(b, devices)
		} else {
			b = append(b, "{}"...)
		}
	}
	return append(b, '}')
}

// appendRawObject appends m as a JSON object with its members in key
// order, as json.Marshal writes them (null for a nil map).
func appendRawObject(b []byte, m map[string]json.RawMessage) []byte {
	if m == nil {
		return append(b, "null"...)
	}
	b = append(b, '{')
	if len(m) == 1 {
		for k, v := range m { // no sort to make
			b = appendMember(b, k, v)
		}
		return append(b, '}')
	}
	for i, k := range sortedKeys(m) {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendMember(b, k, m[k])
	}
	return append(b, '}')
}

// appendMember appends "k":v, v being null when empty (as json.Marshal
// writes a nil json.RawMessage).
func appendMember(b []byte, k string, v json.RawMessage) []byte {
	b = appendString(b, k)
	b = append(b, ':')
	if len(v) == 0 {
		return append(b, "null"...)
	}
	return append(b, v...)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// appendString appends s as a JSON string. User and device IDs are almost
// always plain printable ASCII, which is copied as it is; anything else
// goes through encoding/json.
func appendString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// QueryKeys returns the device keys of the named users; an empty device
// list means all of a user's devices. Local users are answered with one
// database query however many users and devices are named; remote users
// from the cache of their device list or, when that is missing or stale,
// from their servers, all asked at once within the request's timeout.
func (s *Service) QueryKeys(ctx context.Context, c matrixid.Caller, r QueryRequest) (QueryResponse, error) {
	res := QueryResponse{
		DeviceKeys:      map[string]map[string]json.RawMessage{},
		Failures:        map[string]any{},
		MasterKeys:      map[string]json.RawMessage{},
		SelfSigningKeys: map[string]json.RawMessage{},
		UserSigningKeys: map[string]json.RawMessage{},
	}
	if r.DeviceKeys == nil {
		return res, mxerr.BadJSON("device_keys is required")
	}
	local := map[string][]string{}
	remote := map[string]map[string][]string{} // server -> user -> devices
	for userID, devices := range r.DeviceKeys {
		server, ok := matrixid.ParseUserID(userID)
		if !ok {
			return res, mxerr.InvalidParam("%q is not a valid user ID", userID)
		}
		if s.isLocal(server) {
			local[userID] = devices
		} else {
			if remote[server] == nil {
				remote[server] = map[string][]string{}
			}
			remote[server][userID] = devices
		}
	}
	keys, err := s.localKeys(ctx, local, c.UserID, true)
	if err != nil {
		return res, err
	}
	res.DeviceKeys, res.MasterKeys, res.SelfSigningKeys, res.UserSigningKeys =
		keys.DeviceKeys, keys.MasterKeys, keys.SelfSigningKeys, keys.UserSigningKeys
	if len(remote) > 0 {
		ctx, cancel := context.WithTimeout(ctx, s.remoteTimeout(ctx, r.Timeout))
		defer cancel()
		s.queryRemote(ctx, remote, c.UserID, &res)
	}
	return res, nil
}

// localKeys is what a key query answers for local users.
type localKeys struct {
	DeviceKeys      map[string]map[string]json.RawMessage
	MasterKeys      map[string]json.RawMessage
	SelfSigningKeys map[string]json.RawMessage
	UserSigningKeys map[string]json.RawMessage
}

// localKeys returns the keys of local users (an empty device list: all
// devices) as viewer may see them ("" for another server), in one read of
// the store however many users are named. Devices carry "unsigned",
// holding the display name when withNames. Devices and master keys carry
// the signatures uploaded on them that viewer may see; the user-signing
// key is given to its owner only.
func (s *Service) localKeys(ctx context.Context, users map[string][]string, viewer string, withNames bool) (localKeys, error) {
	out := localKeys{
		DeviceKeys:      make(map[string]map[string]json.RawMessage, len(users)),
		MasterKeys:      map[string]json.RawMessage{},
		SelfSigningKeys: map[string]json.RawMessage{},
		UserSigningKeys: map[string]json.RawMessage{},
	}
	ids := make([]string, 0, len(users))
	for u := range users {
		ids = append(ids, u)
		out.DeviceKeys[u] = map[string]json.RawMessage{}
	}
	sort.Strings(ids)
	all, err := s.db.UserKeys(ctx, ids)
	if err != nil {
		return out, err
	}
	for userID, k := range all {
		want := users[userID]
		devices := out.DeviceKeys[userID]
		if !seesOwnSignatures(k, userID, viewer) {
			// What everyone sees: built once per cached copy of the keys.
			a, err := answerOf(userID, k)
			if err != nil {
				return out, err
			}
			for _, d := range a.devices {
				if len(want) > 0 && !contains(want, d.id) {
					continue
				}
				if withNames {
					devices[d.id] = d.named
				} else {
					devices[d.id] = d.anonymous
				}
			}
			if a.master != nil {
				out.MasterKeys[userID] = a.master
			}
		} else {
			sigs := crosssigning.ByTarget(k.Signatures, userID, viewer)
			for _, d := range k.Devices {
				if len(want) > 0 && !contains(want, d.DeviceID) {
					continue
				}
				name := d.DisplayName
				if !withNames {
					name = nil
				}
				js, err := crosssigning.WithSignatures(d.KeyJSON, sigs[d.DeviceID])
				if err != nil {
					return out, err
				}
				keys, err := withUnsigned(js, name)
				if err != nil {
					return out, err
				}
				devices[d.DeviceID] = keys
			}
			if m := k.Keys[storage.UsageMaster]; m != nil {
				js, err := crosssigning.WithSignatures(m, sigs[crosssigning.PublicKeyOf(m)])
				if err != nil {
					return out, err
				}
				out.MasterKeys[userID] = js
			}
		}
		if ssk := k.Keys[storage.UsageSelfSigning]; ssk != nil {
			out.SelfSigningKeys[userID] = ssk
		}
		if usk := k.Keys[storage.UsageUserSigning]; usk != nil && userID == viewer {
			out.UserSigningKeys[userID] = usk
		}
	}
	return out, nil
}

// seesOwnSignatures reports whether viewer may see signatures on owner's
// keys that others may not: those of the viewer's user-signing key (see
// crosssigning.Visible).
func seesOwnSignatures(k *storage.UserKeys, owner, viewer string) bool {
	if viewer == "" || viewer == owner {
		return false
	}
	for _, sig := range k.Signatures {
		if sig.SignerUserID == viewer {
			return true
		}
	}
	return false
}

// userAnswer is what a key query answers for a user to any viewer but
// those who signed the user's keys with their user-signing key: the
// devices' keys with the owner's signatures and "unsigned", with and
// without the display name, and the master key with the owner's
// signatures.
type userAnswer struct {
	devices []deviceAnswer // in the order of the stored devices
	master  json.RawMessage
}

type deviceAnswer struct {
	id               string
	named, anonymous json.RawMessage
}

// answerOf returns the user's answer, built once for the value k and kept
// in it (two queries may both build it first; either copy is right).
func answerOf(userID string, k *storage.UserKeys) (*userAnswer, error) {
	if a, ok := k.Derived.Load().(*userAnswer); ok {
		return a, nil
	}
	sigs := crosssigning.ByTarget(k.Signatures, userID, "")
	a := &userAnswer{devices: make([]deviceAnswer, 0, len(k.Devices))}
	for _, d := range k.Devices {
		js, err := crosssigning.WithSignatures(d.KeyJSON, sigs[d.DeviceID])
		if err != nil {
			return nil, err
		}
		anonymous, err := withUnsigned(js, nil)
		if err != nil {
			return nil, err
		}
		named := anonymous
		if d.DisplayName != nil {
			if named, err = withUnsigned(js, d.DisplayName); err != nil {
				return nil, err
			}
		}
		a.devices = append(a.devices, deviceAnswer{id: d.DeviceID, named: named, anonymous: anonymous})
	}
	if m := k.Keys[storage.UsageMaster]; m != nil {
		js, err := crosssigning.WithSignatures(m, sigs[crosssigning.PublicKeyOf(m)])
		if err != nil {
			return nil, err
		}
		a.master = js
	}
	k.Derived.Store(a)
	return a, nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// withUnsigned adds the "unsigned" object to stored device keys, holding
// the device's display name when name is set and empty otherwise. It is
// always there, as Synapse sends it: a server that re-encodes a missing
// "unsigned" as null makes Element's Rust crypto drop the device.
func withUnsigned(keyJSON []byte, name *string) (json.RawMessage, error) {
	// Keys this server stored are a canonical JSON object with members and
	// without "unsigned" (it is removed on upload), so the member can be
	// added at the end without decoding the object; anything else is
	// decoded and encoded again.
	if n := len(keyJSON); n > 2 && keyJSON[0] == '{' && keyJSON[1] == '"' && keyJSON[n-1] == '}' && !bytes.Contains(keyJSON, []byte(`"unsigned"`)) {
		if name == nil {
			out := make([]byte, 0, n+15)
			out = append(out, keyJSON[:n-1]...)
			return append(out, `,"unsigned":{}}`...), nil
		}
		out := make([]byte, 0, n+40+len(*name))
		out = append(out, keyJSON[:n-1]...)
		out = append(out, `,"unsigned":{"device_display_name":`...)
		out = appendString(out, *name)
		return append(out, "}}"...), nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(keyJSON, &obj); err != nil {
		return nil, err
	}
	if obj == nil {
		return nil, errors.New("device keys are not a JSON object")
	}
	unsigned := json.RawMessage(`{}`)
	if name != nil {
		var err error
		if unsigned, err = json.Marshal(map[string]string{"device_display_name": *name}); err != nil {
			return nil, err
		}
	}
	obj["unsigned"] = unsigned
	return json.Marshal(obj)
}

// ClaimRequest is POST /keys/claim.
type ClaimRequest struct {
	OneTimeKeys map[string]map[string]string `json:"one_time_keys"`
	Timeout     Timeout                      `json:"timeout"`
}

// ClaimResponse is the answer to /keys/claim.
type ClaimResponse struct {
	OneTimeKeys map[string]map[string]map[string]json.RawMessage `json:"one_time_keys"`
	Failures    map[string]any                                   `json:"failures"`
}

// ClaimKeys hands out one key per named device: its oldest unclaimed
// one-time key of the algorithm, or its fallback key when none is left.
// Devices with neither are left out.
func (s *Service) ClaimKeys(ctx context.Context, c matrixid.Caller, r ClaimRequest) (ClaimResponse, error) {
	res := ClaimResponse{
		OneTimeKeys: map[string]map[string]map[string]json.RawMessage{},
		Failures:    map[string]any{},
	}
	if r.OneTimeKeys == nil {
		return res, mxerr.BadJSON("one_time_keys is required")
	}
	var reqs []storage.ClaimRequest
	remote := map[string]map[string]map[string]string{} // server -> user -> device -> algorithm
	for userID, devices := range r.OneTimeKeys {
		server, ok := matrixid.ParseUserID(userID)
		if !ok {
			return res, mxerr.InvalidParam("%q is not a valid user ID", userID)
		}
		for deviceID, alg := range devices {
			if alg == "" {
				return res, mxerr.InvalidParam("one_time_keys.%s.%s: algorithm is empty", userID, deviceID)
			}
		}
		if !s.isLocal(server) {
			if remote[server] == nil {
				remote[server] = map[string]map[string]string{}
			}
			remote[server][userID] = devices
			continue
		}
		for deviceID, alg := range devices {
			reqs = append(reqs, storage.ClaimRequest{UserID: userID, DeviceID: deviceID, Algorithm: alg})
		}
	}
	claimed, err := s.claimLocal(ctx, reqs)
	if err != nil {
		return res, err
	}
	for _, k := range claimed {
		byDevice := res.OneTimeKeys[k.UserID]
		if byDevice == nil {
			byDevice = map[string]map[string]json.RawMessage{}
			res.OneTimeKeys[k.UserID] = byDevice
		}
		byDevice[k.DeviceID] = map[string]json.RawMessage{k.Key.FullID(): k.Key.JSON}
	}
	if len(remote) > 0 {
		ctx, cancel := context.WithTimeout(ctx, s.remoteTimeout(ctx, r.Timeout))
		defer cancel()
		s.claimRemote(ctx, remote, &res)
	}
	return res, nil
}

// claimLocal claims keys of local devices in a fixed order (so concurrent
// claims lock rows in the same order) and wakes the owners' /sync, whose
// key counts changed.
func (s *Service) claimLocal(ctx context.Context, reqs []storage.ClaimRequest) ([]storage.ClaimedKey, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	sort.Slice(reqs, func(i, j int) bool {
		if reqs[i].UserID != reqs[j].UserID {
			return reqs[i].UserID < reqs[j].UserID
		}
		return reqs[i].DeviceID < reqs[j].DeviceID
	})
	claimed, err := s.db.ClaimKeys(ctx, reqs)
	if err != nil {
		return nil, err
	}
	owners := make([]string, 0, len(claimed))
	for _, k := range claimed {
		kind := "one_time"
		if k.Fallback {
			kind = "fallback"
		}
		metrics.KeysClaimed.WithLabelValues(kind).Inc()
		if len(owners) == 0 || owners[len(owners)-1] != k.UserID {
			owners = append(owners, k.UserID)
		}
	}
	s.notifier.UserKeysChanged(owners...)
	return claimed, nil
}
