package pusher

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/storage"
)

// Limits of the spec.
const (
	maxAppIDChars    = 64
	maxPushkeyBytes  = 512
	maxFieldChars    = 512 // display names, lang and profile tag
	maxDataJSONBytes = 8 << 10
)

// pusherJSON is a pusher as GET /pushers shows it.
type pusherJSON struct {
	AppDisplayName    string          `json:"app_display_name"`
	AppID             string          `json:"app_id"`
	Data              json.RawMessage `json:"data"`
	DeviceDisplayName string          `json:"device_display_name"`
	Kind              string          `json:"kind"`
	Lang              string          `json:"lang"`
	ProfileTag        string          `json:"profile_tag,omitempty"`
	Pushkey           string          `json:"pushkey"`
}

// List answers GET /pushers: the user's pushers.
func (s *Service) List(ctx context.Context, userID string) (any, error) {
	list, err := s.db.Pushers(ctx, userID)
	if err != nil {
		return nil, err
	}
	out := make([]pusherJSON, 0, len(list))
	for _, p := range list {
		out = append(out, pusherJSON{AppDisplayName: p.AppDisplayName, AppID: p.AppID, Data: p.Data,
			DeviceDisplayName: p.DeviceDisplayName, Kind: p.Kind, Lang: p.Lang, ProfileTag: p.ProfileTag, Pushkey: p.Pushkey})
	}
	return map[string]any{"pushers": out}, nil
}

// Set answers POST /pushers/set for a device: kind null deletes the
// user's pusher of the app ID and pushkey; otherwise the pusher is added,
// or replaces the user's of the same app ID and pushkey, and unless
// append is true the pushers of other users with them are removed.
// Missing fields are M_MISSING_PARAM, as in Synapse; fields of the wrong
// type or size and a gateway URL that is not one are M_INVALID_PARAM.
func (s *Service) Set(ctx context.Context, userID, deviceID string, body map[string]json.RawMessage) error {
	present := func(k string) bool { _, ok := body[k]; return ok }
	if present("app_id") && present("pushkey") && present("kind") && string(body["kind"]) == "null" {
		appID, pushkey := stringField(body, "app_id"), stringField(body, "pushkey")
		if appID == nil || pushkey == nil {
			return mxerr.InvalidParam("app_id and pushkey must be strings")
		}
		return s.db.DeletePusher(ctx, userID, *appID, *pushkey)
	}
	var missing []string
	for _, k := range []string{"kind", "app_id", "app_display_name", "device_display_name", "pushkey", "lang", "data"} {
		if !present(k) || string(body[k]) == "null" {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return mxerr.MissingParam("missing parameters: %s", strings.Join(missing, ", "))
	}
	fields := map[string]string{}
	for _, k := range []string{"kind", "app_id", "app_display_name", "device_display_name", "pushkey", "lang", "profile_tag"} {
		if !present(k) {
			continue
		}
		v := stringField(body, k)
		if v == nil {
			return mxerr.InvalidParam("%s must be a string", k)
		}
		if k != "pushkey" && k != "app_id" && utf8.RuneCountInString(*v) > maxFieldChars {
			return mxerr.InvalidParam("%s is longer than %d characters", k, maxFieldChars)
		}
		fields[k] = *v
	}
	switch {
	case fields["app_id"] == "":
		return mxerr.InvalidParam("app_id is empty")
	case utf8.RuneCountInString(fields["app_id"]) > maxAppIDChars:
		return mxerr.InvalidParam("app_id is longer than %d characters", maxAppIDChars)
	case fields["pushkey"] == "":
		return mxerr.InvalidParam("pushkey is empty")
	case len(fields["pushkey"]) > maxPushkeyBytes:
		return mxerr.InvalidParam("pushkey is longer than %d bytes", maxPushkeyBytes)
	}
	if fields["kind"] != "http" {
		return mxerr.InvalidParam("kind %q is not supported: only http pushers are", fields["kind"])
	}
	appendPusher := false
	if raw, ok := body["append"]; ok && string(raw) != "null" {
		if json.Unmarshal(raw, &appendPusher) != nil {
			return mxerr.InvalidParam("append must be a boolean")
		}
	}
	var data map[string]json.RawMessage
	if json.Unmarshal(body["data"], &data) != nil || data == nil {
		return mxerr.InvalidParam("data must be an object")
	}
	if len(body["data"]) > maxDataJSONBytes {
		return mxerr.InvalidParam("data is larger than %d bytes", maxDataJSONBytes)
	}
	if err := checkGatewayURL(data); err != nil {
		return err
	}
	if raw, ok := data["format"]; ok {
		var format string
		if json.Unmarshal(raw, &format) != nil {
			return mxerr.InvalidParam("data.format must be a string")
		}
	}
	// Kept as sent, keys sorted.
	cleaned, err := json.Marshal(data)
	if err != nil {
		return mxerr.InvalidParam("data cannot be encoded")
	}
	return s.db.SetPusher(ctx, storage.Pusher{
		UserID: userID, DeviceID: deviceID, Kind: fields["kind"], AppID: fields["app_id"], Pushkey: fields["pushkey"],
		AppDisplayName: fields["app_display_name"], DeviceDisplayName: fields["device_display_name"],
		ProfileTag: fields["profile_tag"], Lang: fields["lang"], Data: cleaned, PushkeyTS: s.o.Now().UnixMilli(),
	}, appendPusher)
}

// checkGatewayURL checks an http pusher's data.url: an absolute http or
// https URL whose path is the push gateway API's.
func checkGatewayURL(data map[string]json.RawMessage) error {
	raw, ok := data["url"]
	if !ok || string(raw) == "null" {
		return mxerr.MissingParam("'url' required in data for HTTP pusher")
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return mxerr.InvalidParam("data.url must be a string")
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil {
		return mxerr.InvalidParam("data.url must be an absolute http or https URL")
	}
	if u.Path != NotifyPath {
		return mxerr.InvalidParam("data.url must have a path of '%s'", NotifyPath)
	}
	return nil
}

// stringField is body[k] when it is a JSON string, nil otherwise.
func stringField(body map[string]json.RawMessage, k string) *string {
	var v string
	if json.Unmarshal(body[k], &v) != nil {
		return nil
	}
	return &v
}
