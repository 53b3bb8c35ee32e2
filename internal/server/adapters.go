package server

import (
	"context"

	"github.com/keyserver/keyserver/dehydrated"
	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/keyserver"
	"github.com/keyserver/keyserver/pusher"
	"github.com/keyserver/keyserver/pushrules"
)

// dehydratedKeys lets dehydrated devices upload their keys through the
// keys domain, in the terms package dehydrated declares.
type dehydratedKeys struct{ ks *keyserver.Service }

func (k dehydratedKeys) CheckNewDeviceKeys(ctx context.Context, c matrixid.Caller, keys dehydrated.Keys) error {
	return k.ks.CheckNewDeviceUpload(ctx, c, uploadRequest(keys))
}

func (k dehydratedKeys) UploadDeviceKeys(ctx context.Context, c matrixid.Caller, keys dehydrated.Keys) error {
	_, err := k.ks.UploadKeys(ctx, c, uploadRequest(keys))
	return err
}

func uploadRequest(k dehydrated.Keys) keyserver.UploadRequest {
	return keyserver.UploadRequest{DeviceKeys: k.DeviceKeys, OneTimeKeys: k.OneTimeKeys, FallbackKeys: k.FallbackKeys}
}

// pushRules gives the pushers users' push rules in the terms package
// pusher declares.
type pushRules struct{ rules *pushrules.Service }

func (p pushRules) Rules(ctx context.Context, userID string) (pusher.RuleSet, error) {
	rs, err := p.rules.Ruleset(ctx, userID)
	return userRules(rs), err
}

type userRules pushrules.Ruleset

func (r userRules) Evaluate(ev pusher.Event) pusher.Outcome {
	out := pushrules.Evaluate(pushrules.Ruleset(r), pushrules.Event{JSON: ev.JSON, UserDisplayName: ev.UserDisplayName,
		MemberCount: ev.MemberCount, SenderPowerLevel: ev.SenderPowerLevel, NotificationLevels: ev.NotificationLevels})
	return pusher.Outcome{Notify: out.Notify, Highlight: out.Highlight(), Tweaks: out.Tweaks}
}
