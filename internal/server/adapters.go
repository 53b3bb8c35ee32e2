package server

import (
	"context"

	"github.com/keyserver/keyserver/dehydrated"
	"github.com/keyserver/keyserver/internal/matrixid"
	"github.com/keyserver/keyserver/keyserver"
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
