package keybackup_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/internal/testdb"
	"github.com/keyserver/keyserver/keybackup"
	"github.com/keyserver/keyserver/storage/sqlstore"
)

const (
	alice = "@alice:local.test"
	bob   = "@bob:local.test"
	room  = "!room:local.test"
	algo  = "m.megolm_backup.v1.curve25519-aes-sha2"
)

func newService(t *testing.T, db testdb.Database, opts keybackup.Options) *keybackup.Service {
	t.Helper()
	store, err := sqlstore.Open(context.Background(), db.URI, "local.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	log := logrus.New()
	log.SetOutput(io.Discard)
	return keybackup.New(store, log, opts)
}

func wantCode(t *testing.T, err error, status int, code string) *mxerr.Error {
	t.Helper()
	var me *mxerr.Error
	if !errors.As(err, &me) || me.Status != status || me.Code != code {
		t.Fatalf("got %v, want %d %s", err, status, code)
	}
	return me
}

func str(s string) *string { return &s }

func versionReq(authData string) keybackup.VersionRequest {
	return keybackup.VersionRequest{Algorithm: str(algo), AuthData: json.RawMessage(authData)}
}

func create(t *testing.T, svc *keybackup.Service, userID, authData string) string {
	t.Helper()
	res, err := svc.CreateVersion(context.Background(), userID, versionReq(authData))
	if err != nil {
		t.Fatal(err)
	}
	return res["version"]
}

// key is a session key as clients upload it.
func key(first, forwarded int64, verified bool, data string) *keybackup.KeyBackupData {
	return &keybackup.KeyBackupData{FirstMessageIndex: &first, ForwardedCount: &forwarded, IsVerified: &verified,
		SessionData: json.RawMessage(`{"ciphertext":"` + data + `"}`)}
}

func put(t *testing.T, svc *keybackup.Service, userID, version, sessionID string, k *keybackup.KeyBackupData) keybackup.KeysResult {
	t.Helper()
	res, err := svc.PutKeys(context.Background(), userID, version,
		map[string]keybackup.RoomKeys{room: {Sessions: map[string]*keybackup.KeyBackupData{sessionID: k}}})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// stored reads one key back as answered.
func stored(t *testing.T, svc *keybackup.Service, userID, version, sessionID string) map[string]any {
	t.Helper()
	got, err := svc.Keys(context.Background(), userID, version, room, sessionID)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(got)
	var out map[string]any
	_ = json.Unmarshal(raw, &out)
	return out
}

// Versions are numbered per user from 1; the newest is the current one;
// a deleted version is gone but its number is not given again; deleting
// it again succeeds while a number never given is not found.
func TestVersionLifecycle(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		svc := newService(t, db, keybackup.Options{})

		_, err := svc.Version(ctx, alice, "")
		wantCode(t, err, http.StatusNotFound, "M_NOT_FOUND")

		v1 := create(t, svc, alice, `{"public_key":"one"}`)
		v2 := create(t, svc, alice, `{ "public_key" : "two" }`)
		if v1 != "1" || v2 != "2" {
			t.Fatalf("versions %q, %q", v1, v2)
		}
		if vb := create(t, svc, bob, `{}`); vb != "1" {
			t.Fatalf("bob's first version is %q", vb)
		}
		cur, err := svc.Version(ctx, alice, "")
		if err != nil {
			t.Fatal(err)
		}
		if cur.Version != "2" || cur.Algorithm != algo || string(cur.AuthData) != `{"public_key":"two"}` ||
			cur.Count != 0 || cur.ETag != "0" {
			t.Fatalf("current version %+v", cur)
		}
		if old, err := svc.Version(ctx, alice, "1"); err != nil || string(old.AuthData) != `{"public_key":"one"}` {
			t.Fatalf("version 1: %+v %v", old, err)
		}

		if err := svc.DeleteVersion(ctx, alice, "2"); err != nil {
			t.Fatal(err)
		}
		if err := svc.DeleteVersion(ctx, alice, "2"); err != nil {
			t.Fatalf("deleting a deleted version again: %v", err)
		}
		wantCode(t, svc.DeleteVersion(ctx, alice, "3"), http.StatusNotFound, "M_NOT_FOUND")
		_, err = svc.Version(ctx, alice, "2")
		wantCode(t, err, http.StatusNotFound, "M_NOT_FOUND")
		if cur, err := svc.Version(ctx, alice, ""); err != nil || cur.Version != "1" {
			t.Fatalf("after deleting 2 the current version is %+v %v", cur, err)
		}
		if v3 := create(t, svc, alice, `{}`); v3 != "3" {
			t.Fatalf("a version number was given again: %q", v3)
		}

		// Names that are not the numbers this server writes name nothing.
		for _, v := range []string{"01", "+3", "0", "-1", "x", "3.0"} {
			_, err := svc.Version(ctx, alice, v)
			wantCode(t, err, http.StatusNotFound, "M_NOT_FOUND")
		}

		// Deleting every backup of a deactivated account keeps the
		// numbering.
		if err := svc.DeleteAll(ctx, alice); err != nil {
			t.Fatal(err)
		}
		_, err = svc.Version(ctx, alice, "")
		wantCode(t, err, http.StatusNotFound, "M_NOT_FOUND")
		if v4 := create(t, svc, alice, `{}`); v4 != "4" {
			t.Fatalf("after DeleteAll the next version is %q", v4)
		}
		if cur, err := svc.Version(ctx, bob, ""); err != nil || cur.Version != "1" {
			t.Fatalf("bob's backup after alice's were deleted: %+v %v", cur, err)
		}
	})
}

// A version's auth_data can be replaced; its algorithm cannot change, a
// version in the body must be the path's, and keys, count and etag stay.
func TestUpdateVersion(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		svc := newService(t, db, keybackup.Options{})
		v := create(t, svc, alice, `{"a":1}`)
		put(t, svc, alice, v, "s1", key(0, 0, false, "x"))

		req := versionReq(`{"a":2}`)
		req.Version = str(v)
		if err := svc.UpdateVersion(ctx, alice, v, req); err != nil {
			t.Fatal(err)
		}
		got, err := svc.Version(ctx, alice, v)
		if err != nil {
			t.Fatal(err)
		}
		if string(got.AuthData) != `{"a":2}` || got.Count != 1 || got.ETag != "1" {
			t.Fatalf("after update %+v", got)
		}

		other := keybackup.VersionRequest{Algorithm: str("org.example.other"), AuthData: json.RawMessage(`{"a":3}`)}
		wantCode(t, svc.UpdateVersion(ctx, alice, v, other), http.StatusBadRequest, "M_INVALID_PARAM")
		wrong := versionReq(`{"a":3}`)
		wrong.Version = str("7")
		wantCode(t, svc.UpdateVersion(ctx, alice, v, wrong), http.StatusBadRequest, "M_INVALID_PARAM")
		wantCode(t, svc.UpdateVersion(ctx, alice, "9", versionReq(`{"a":3}`)), http.StatusNotFound, "M_NOT_FOUND")
		wantCode(t, svc.UpdateVersion(ctx, bob, v, versionReq(`{"a":3}`)), http.StatusNotFound, "M_NOT_FOUND")
		wantCode(t, svc.UpdateVersion(ctx, alice, v, versionReq(`"opaque"`)), http.StatusBadRequest, "M_BAD_JSON")
		if got, _ := svc.Version(ctx, alice, v); string(got.AuthData) != `{"a":2}` {
			t.Fatalf("a refused update changed auth_data to %s", got.AuthData)
		}
	})
}

// A version needs an algorithm and an object as auth_data, unless lax
// mode accepts any JSON value, answered as sent.
func TestCreateVersionChecks(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		strict := newService(t, db, keybackup.Options{})
		for _, c := range []struct {
			req  keybackup.VersionRequest
			code string
		}{
			{keybackup.VersionRequest{AuthData: json.RawMessage(`{}`)}, "M_MISSING_PARAM"},
			{keybackup.VersionRequest{Algorithm: str(""), AuthData: json.RawMessage(`{}`)}, "M_INVALID_PARAM"},
			{keybackup.VersionRequest{Algorithm: str(algo)}, "M_MISSING_PARAM"},
			{versionReq(`null`), "M_MISSING_PARAM"},
			{versionReq(`"a string"`), "M_BAD_JSON"},
			{versionReq(`[1]`), "M_BAD_JSON"},
		} {
			_, err := strict.CreateVersion(ctx, alice, c.req)
			wantCode(t, err, http.StatusBadRequest, c.code)
		}
		if _, err := strict.Version(ctx, alice, ""); err == nil {
			t.Fatal("a refused version was created")
		}

		lax := newService(t, db, keybackup.Options{LaxAuthData: true})
		v := create(t, lax, bob, `"opaque"`)
		if got, err := lax.Version(ctx, bob, v); err != nil || string(got.AuthData) != `"opaque"` {
			t.Fatalf("lax auth_data: %s %v", got.AuthData, err)
		}
		_, err := lax.CreateVersion(ctx, bob, keybackup.VersionRequest{Algorithm: str(algo)})
		wantCode(t, err, http.StatusBadRequest, "M_MISSING_PARAM")
	})
}

// A session already in the backup is replaced only by a better key: a
// verified one over an unverified one, then a lower first_message_index,
// then a lower forwarded_count. The etag changes exactly when a key was
// written and count counts the sessions.
func TestSessionReplacementRules(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		svc := newService(t, db, keybackup.Options{})
		v := create(t, svc, alice, `{}`)

		res := put(t, svc, alice, v, "s", key(5, 2, false, "first"))
		if res.ETag != "1" || res.Count != 1 {
			t.Fatalf("first upload %+v", res)
		}
		steps := []struct {
			name     string
			k        *keybackup.KeyBackupData
			replaced bool
		}{
			{"the same key again", key(5, 2, false, "same"), false},
			{"a higher first_message_index", key(6, 0, false, "later"), false},
			{"a lower forwarded_count", key(5, 1, false, "fewer-forwards"), true},
			{"a higher forwarded_count", key(5, 3, false, "more-forwards"), false},
			{"a lower first_message_index, more forwards", key(4, 9, false, "earlier"), true},
			{"a verified key starting later", key(100, 100, true, "verified"), true},
			{"an unverified key starting earlier", key(0, 0, false, "unverified"), false},
			{"a verified key starting earlier", key(1, 100, true, "verified-earlier"), true},
		}
		etag, want := int64(1), "first"
		for _, s := range steps {
			res := put(t, svc, alice, v, "s", s.k)
			if s.replaced {
				etag++
				var sd struct {
					Ciphertext string `json:"ciphertext"`
				}
				_ = json.Unmarshal(s.k.SessionData, &sd)
				want = sd.Ciphertext
			}
			if res.ETag != jsonInt(etag) || res.Count != 1 {
				t.Fatalf("%s: %+v, want etag %d count 1", s.name, res, etag)
			}
			got := stored(t, svc, alice, v, "s")
			if got["session_data"].(map[string]any)["ciphertext"] != want {
				t.Fatalf("%s: stored %v, want %q", s.name, got, want)
			}
		}

		// Another session adds to the count; the version says the same.
		res = put(t, svc, alice, v, "t", key(0, 0, false, "t"))
		if res.Count != 2 || res.ETag != jsonInt(etag+1) {
			t.Fatalf("second session %+v", res)
		}
		info, err := svc.Version(context.Background(), alice, v)
		if err != nil || info.Count != 2 || info.ETag != res.ETag {
			t.Fatalf("version %+v %v, want count 2 etag %s", info, err, res.ETag)
		}
	})
}

func jsonInt(n int64) string {
	raw, _ := json.Marshal(n)
	return string(raw)
}

// Keys go only into the current version: an older one is refused with
// M_WRONG_ROOM_KEYS_VERSION naming the current one, an unknown one is not
// found; any existing version may lose keys.
func TestKeysOnlyInCurrentVersion(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		svc := newService(t, db, keybackup.Options{})
		v1 := create(t, svc, alice, `{}`)
		put(t, svc, alice, v1, "old", key(0, 0, false, "old"))
		v2 := create(t, svc, alice, `{}`)

		_, err := svc.PutKeys(ctx, alice, v1, map[string]keybackup.RoomKeys{room: {Sessions: map[string]*keybackup.KeyBackupData{
			"s": key(0, 0, false, "x")}}})
		me := wantCode(t, err, http.StatusForbidden, "M_WRONG_ROOM_KEYS_VERSION")
		if me.Extra["current_version"] != v2 {
			t.Fatalf("current_version %v, want %s", me.Extra["current_version"], v2)
		}
		_, err = svc.PutKeys(ctx, alice, "5", map[string]keybackup.RoomKeys{room: {Sessions: map[string]*keybackup.KeyBackupData{
			"s": key(0, 0, false, "x")}}})
		wantCode(t, err, http.StatusNotFound, "M_NOT_FOUND")
		_, err = svc.PutKeys(ctx, alice, "", nil)
		wantCode(t, err, http.StatusBadRequest, "M_MISSING_PARAM")

		// The old version keeps its key and may lose it.
		if got := stored(t, svc, alice, v1, "old"); got["first_message_index"] != float64(0) {
			t.Fatalf("old key %v", got)
		}
		res, err := svc.DeleteKeys(ctx, alice, v1, room, "old")
		if err != nil || res.Count != 0 || res.ETag != "2" {
			t.Fatalf("delete from the old version: %+v %v", res, err)
		}
		// Deleting what is not there changes nothing.
		res, err = svc.DeleteKeys(ctx, alice, v1, room, "old")
		if err != nil || res.Count != 0 || res.ETag != "2" {
			t.Fatalf("deleting again: %+v %v", res, err)
		}
		_, err = svc.DeleteKeys(ctx, alice, "9", "", "")
		wantCode(t, err, http.StatusNotFound, "M_NOT_FOUND")
	})
}

// Keys are read and deleted by version, room or session; reading a
// missing session is not found, an empty room is an empty object.
func TestKeysByScope(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		svc := newService(t, db, keybackup.Options{})
		v := create(t, svc, alice, `{}`)
		const room2 = "!other:local.test"
		res, err := svc.PutKeys(ctx, alice, v, map[string]keybackup.RoomKeys{
			room:  {Sessions: map[string]*keybackup.KeyBackupData{"a": key(0, 0, true, "a"), "b": key(1, 0, false, "b")}},
			room2: {Sessions: map[string]*keybackup.KeyBackupData{"c": key(2, 0, false, "c")}},
		})
		if err != nil || res.Count != 3 || res.ETag != "1" {
			t.Fatalf("upload of three keys: %+v %v (one write, one etag step)", res, err)
		}
		asJSON := func(v any) string {
			raw, _ := json.Marshal(v)
			return string(raw)
		}
		all, err := svc.Keys(ctx, alice, v, "", "")
		if err != nil {
			t.Fatal(err)
		}
		want := `{"rooms":{"!other:local.test":{"sessions":{"c":{"first_message_index":2,"forwarded_count":0,"is_verified":false,"session_data":{"ciphertext":"c"}}}},` +
			`"!room:local.test":{"sessions":{"a":{"first_message_index":0,"forwarded_count":0,"is_verified":true,"session_data":{"ciphertext":"a"}},` +
			`"b":{"first_message_index":1,"forwarded_count":0,"is_verified":false,"session_data":{"ciphertext":"b"}}}}}}`
		if got := asJSON(all); got != want {
			t.Fatalf("all keys\n got %s\nwant %s", got, want)
		}
		_, err = svc.Keys(ctx, alice, v, room, "zzz")
		wantCode(t, err, http.StatusNotFound, "M_NOT_FOUND")
		empty, err := svc.Keys(ctx, alice, v, "!empty:local.test", "")
		if err != nil || asJSON(empty) != `{"sessions":{}}` {
			t.Fatalf("an empty room: %s %v", asJSON(empty), err)
		}
		// Bob sees none of alice's backup.
		_, err = svc.Keys(ctx, bob, v, "", "")
		wantCode(t, err, http.StatusNotFound, "M_NOT_FOUND")

		res, err = svc.DeleteKeys(ctx, alice, v, room, "")
		if err != nil || res.Count != 1 || res.ETag != "2" {
			t.Fatalf("delete a room: %+v %v", res, err)
		}
		res, err = svc.DeleteKeys(ctx, alice, v, "", "")
		if err != nil || res.Count != 0 || res.ETag != "3" {
			t.Fatalf("delete all: %+v %v", res, err)
		}
		if info, _ := svc.Version(ctx, alice, v); info.Count != 0 || info.ETag != "3" {
			t.Fatalf("version after deletes %+v", info)
		}
	})
}

// An upload with any bad key writes none of its keys.
func TestBadUploadWritesNothing(t *testing.T) {
	testdb.ForEachDatabase(t, func(t *testing.T, db testdb.Database) {
		ctx := context.Background()
		svc := newService(t, db, keybackup.Options{})
		v := create(t, svc, alice, `{}`)
		neg := int64(-1)
		huge := int64(1 << 53)
		for name, c := range map[string]struct {
			rooms map[string]keybackup.RoomKeys
			code  string
		}{
			"no sessions":             {map[string]keybackup.RoomKeys{room: {}}, "M_MISSING_PARAM"},
			"bad room ID":             {map[string]keybackup.RoomKeys{"room": {Sessions: map[string]*keybackup.KeyBackupData{"s": key(0, 0, false, "x")}}}, "M_INVALID_PARAM"},
			"empty session ID":        {map[string]keybackup.RoomKeys{room: {Sessions: map[string]*keybackup.KeyBackupData{"": key(0, 0, false, "x")}}}, "M_INVALID_PARAM"},
			"null key":                {map[string]keybackup.RoomKeys{room: {Sessions: map[string]*keybackup.KeyBackupData{"s": nil}}}, "M_MISSING_PARAM"},
			"no first_message_index":  {map[string]keybackup.RoomKeys{room: {Sessions: map[string]*keybackup.KeyBackupData{"s": {ForwardedCount: &huge}}}}, "M_MISSING_PARAM"},
			"negative forwarded":      {map[string]keybackup.RoomKeys{room: {Sessions: map[string]*keybackup.KeyBackupData{"s": {FirstMessageIndex: new(int64), ForwardedCount: &neg}}}}, "M_INVALID_PARAM"},
			"index past 2^53-1":       {map[string]keybackup.RoomKeys{room: {Sessions: map[string]*keybackup.KeyBackupData{"s": {FirstMessageIndex: &huge, ForwardedCount: new(int64)}}}}, "M_INVALID_PARAM"},
			"no is_verified":          {map[string]keybackup.RoomKeys{room: {Sessions: map[string]*keybackup.KeyBackupData{"s": {FirstMessageIndex: new(int64), ForwardedCount: new(int64)}}}}, "M_MISSING_PARAM"},
			"session_data not object": {map[string]keybackup.RoomKeys{room: {Sessions: map[string]*keybackup.KeyBackupData{"s": {FirstMessageIndex: new(int64), ForwardedCount: new(int64), IsVerified: new(bool), SessionData: json.RawMessage(`"x"`)}}}}, "M_BAD_JSON"},
		} {
			// A good key beside the bad one, in a room sorted first.
			c.rooms["!aaa:local.test"] = keybackup.RoomKeys{Sessions: map[string]*keybackup.KeyBackupData{"good": key(0, 0, false, "g")}}
			_, err := svc.PutKeys(ctx, alice, v, c.rooms)
			var me *mxerr.Error
			if !errors.As(err, &me) || me.Status != http.StatusBadRequest || me.Code != c.code {
				t.Fatalf("%s: %v, want 400 %s", name, err, c.code)
			}
		}
		info, err := svc.Version(ctx, alice, v)
		if err != nil || info.Count != 0 || info.ETag != "0" {
			t.Fatalf("after refused uploads: %+v %v", info, err)
		}
	})
}
